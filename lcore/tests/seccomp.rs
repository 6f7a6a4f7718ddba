//! Proof that a steady-state loop iteration makes no syscall, with a seccomp trap filter on the
//! lcore thread (see `lcore::seccomp`). Each test body runs in a child process, because a
//! filtered thread can never exit.

#![cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant as StdInstant};

use lcore::seccomp;
use lcore::time::{Instant, RealClock};
use lcore::{CoreList, DrainPolicy, Lcores, LcoresConfig, LoopBuilder, LoopConfig, PollMode};

/// Iterations run before the filter goes on (allocator warm-up, first messages, ...).
const WARMUP: u64 = 10_000;
/// Iterations that must run under the filter.
const FILTERED: u64 = 200_000;
/// Messages a non-lcore thread sends into the filtered lcore's inbox.
const MESSAGES: u64 = 100_000;
/// Hang guard in the child.
const GUARD: Duration = Duration::from_secs(60);

/// Results the filtered thread hands to the child's test thread. Written with Relaxed stores
/// and published by the Release store of `done`.
#[derive(Default)]
struct Results {
    done: AtomicBool,
    install_errno: AtomicI64,
    filtered_iterations: AtomicU64,
    total_iterations: AtomicU64,
    received: AtomicU64,
    out_of_order: AtomicU64,
    timers_fired: AtomicU64,
    timed_calls: AtomicU64,
    sent_to_main: AtomicU64,
    full_to_main: AtomicU64,
    timer_churn: AtomicU64,
}

#[test]
fn steady_state_loop_makes_no_syscalls() {
    let report = seccomp::run_in_child("steady_state_loop_makes_no_syscalls", child_body)
        .unwrap_or_else(|e| panic!("{e}"));
    println!("child: {}", report.message);
    report.assert_ok_without_syscalls();
}

fn child_body() -> Result<String, String> {
    // Calibrate the TSC (it sleeps) before any lcore starts.
    let clock = RealClock::new();
    let mut cfg = LcoresConfig::new(CoreList::parse("0-1").map_err(|e| e.to_string())?);
    cfg.inbox_capacity = 1024;
    let lcores = Lcores::<u64>::init(&cfg).map_err(|e| e.to_string())?;
    let main = lcores.main_lcore();
    let worker = lcores.workers().next().ok_or("need a worker")?;
    let res = Arc::new(Results::default());
    let r = Arc::clone(&res);

    // The lcore never returns from this closure: after the filter it can only park.
    let _handle = lcores
        .launch(worker, move |lc| -> () {
            let loop_cfg = LoopConfig {
                name: "filtered".to_owned(),
                // Busy mode: hybrid sleeps are syscalls by design.
                mode: PollMode::Busy,
                msg_batch: 16,
                timer_interval: 8,
                timer_capacity: 64,
                drain: DrainPolicy {
                    idle_iterations: 16,
                    timeout: Duration::from_secs(1),
                },
            };
            let mut b = LoopBuilder::<u64, _>::new(loop_cfg, clock);
            let filtered = Rc::new(Cell::new(false));
            let received = Rc::new(Cell::new(0u64));
            let fired = Rc::new(Cell::new(0u64));

            // Phase control: warm up, install the filter, run FILTERED iterations under it.
            {
                let (r, filtered, received, fired) = (
                    Arc::clone(&r),
                    Rc::clone(&filtered),
                    Rc::clone(&received),
                    Rc::clone(&fired),
                );
                let mut n = 0u64;
                let mut under = 0u64;
                b.poller("phase", move |ctx| {
                    n += 1;
                    if n == WARMUP {
                        match seccomp::install_trap_filter() {
                            Ok(()) => filtered.set(true),
                            Err(e) => {
                                // Relaxed: published by `done` (Release) below.
                                r.install_errno.store(
                                    i64::from(e.raw_os_error().unwrap_or(-1)),
                                    Ordering::Relaxed,
                                );
                                ctx.stop_local();
                            }
                        }
                    }
                    if filtered.get() {
                        under += 1;
                        if under >= FILTERED && received.get() == MESSAGES && fired.get() >= 10 {
                            ctx.stop_local();
                        }
                        // Relaxed: published by `done`.
                        r.filtered_iterations.store(under, Ordering::Relaxed);
                    }
                    0
                });
            }
            // Sends to the main lcore's inbox, which only this thread produces into (so no
            // multi-producer tail wait); nobody drains it, so most sends hit Full.
            {
                let r = Arc::clone(&r);
                let (mut ok, mut full, mut n) = (0u64, 0u64, 0u64);
                b.poller("to-main", move |ctx| {
                    n += 1;
                    if ctx.is_stopping() || n % 16 != 0 {
                        return 0;
                    }
                    match ctx.send(main, n) {
                        Ok(()) => ok += 1,
                        Err(lcore::SendError::Full(m)) if m == n => full += 1,
                        Err(_) => full += 1_000_000,
                    }
                    // Relaxed: published by `done`.
                    r.sent_to_main.store(ok, Ordering::Relaxed);
                    r.full_to_main.store(full, Ordering::Relaxed);
                    0
                });
            }
            // Timer churn: arm and cancel a one-shot every iteration.
            {
                let r = Arc::clone(&r);
                let mut churn = 0u64;
                b.poller("timer-churn", move |ctx| {
                    if let Ok(id) = ctx.arm_timer(Duration::from_secs(10), 0)
                        && ctx.timers().cancel(id)
                    {
                        churn += 1;
                    }
                    // Relaxed: published by `done`.
                    r.timer_churn.store(churn, Ordering::Relaxed);
                    0
                });
            }
            {
                let r = Arc::clone(&r);
                let mut calls = 0u64;
                b.timed_poller("tick", Duration::from_micros(20), move |_| {
                    calls += 1;
                    // Relaxed: published by `done`.
                    r.timed_calls.store(calls, Ordering::Relaxed);
                    0
                });
            }
            {
                let (r, received) = (Arc::clone(&r), Rc::clone(&received));
                let mut expected = 0u64;
                b.on_message(move |_, seq| {
                    if seq != expected {
                        // Relaxed: published by `done`.
                        r.out_of_order.fetch_add(1, Ordering::Relaxed);
                    }
                    expected = seq + 1;
                    received.set(received.get() + 1);
                    // Relaxed: published by `done`.
                    r.received.store(received.get(), Ordering::Relaxed);
                });
            }
            {
                let (r, fired) = (Arc::clone(&r), Rc::clone(&fired));
                b.on_timer(move |ctx, ev| {
                    fired.set(fired.get() + 1);
                    // Relaxed: published by `done`.
                    r.timers_fired.store(fired.get(), Ordering::Relaxed);
                    // One-shot chain: re-arm 30 µs later.
                    if ev.token == 1 {
                        let _ = ctx.arm_timer(Duration::from_micros(30), 1);
                    }
                });
            }
            let mut l = b.build().expect("valid loop config");
            let now = lcore::time::Clock::now(&clock);
            l.timers()
                .arm_periodic(
                    now + Duration::from_micros(50),
                    Duration::from_micros(50),
                    2,
                )
                .expect("timer slot");
            l.timers()
                .arm(now + Duration::from_micros(30), 1)
                .expect("timer slot");
            let report = lc.run(&mut l);
            // Relaxed: published by `done`.
            r.total_iterations
                .store(report.iterations, Ordering::Relaxed);
            // D1: Release, pairs with D2: publishes every result above (and, through program
            // order on this thread, every SIGSYS record).
            r.done.store(true, Ordering::Release);
            seccomp::park_forever();
        })
        .map_err(|e| e.to_string())?;

    // This (unfiltered) thread streams sequence numbers into the lcore's inbox.
    let mut tx = lcores.sender(worker).map_err(|e| e.to_string())?;
    let start = StdInstant::now();
    let mut seq = 0u64;
    while seq < MESSAGES {
        match tx.send(seq) {
            Ok(()) => seq += 1,
            Err(_) => std::thread::yield_now(),
        }
        if start.elapsed() > GUARD {
            return Err(format!("sender stuck at {seq}"));
        }
    }
    // D2: Acquire, pairs with D1.
    while !res.done.load(Ordering::Acquire) {
        if start.elapsed() > GUARD {
            return Err("the filtered lcore did not finish".to_owned());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // Relaxed loads: ordered by D1/D2.
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let errno = res.install_errno.load(Ordering::Relaxed);
    if errno != 0 {
        return Err(format!("installing the filter failed with errno {errno}"));
    }
    let summary = format!(
        "{} iterations ({} filtered), {} messages received ({} out of order), {} timers fired, \
         {} timed-poller calls, {} sends to main ({} Full), {} timer arm/cancel pairs",
        get(&res.total_iterations),
        get(&res.filtered_iterations),
        get(&res.received),
        get(&res.out_of_order),
        get(&res.timers_fired),
        get(&res.timed_calls),
        get(&res.sent_to_main),
        get(&res.full_to_main),
        get(&res.timer_churn),
    );
    let ok = get(&res.filtered_iterations) >= FILTERED
        && get(&res.received) == MESSAGES
        && get(&res.out_of_order) == 0
        && get(&res.timers_fired) >= 10
        && get(&res.timed_calls) > 0
        && get(&res.sent_to_main) > 0
        && get(&res.full_to_main) > 0
        && get(&res.full_to_main) < 1_000_000
        && get(&res.timer_churn) >= FILTERED;
    if ok {
        Ok(summary)
    } else {
        Err(format!("incomplete run: {summary}"))
    }
}

#[test]
fn filter_traps_and_records_a_syscall() {
    let report = seccomp::run_in_child("filter_traps_and_records_a_syscall", || {
        let done = Arc::new(AtomicBool::new(false));
        let ret = Arc::new(AtomicI64::new(0));
        let installed = Arc::new(AtomicI64::new(0));
        let (d, r, inst) = (Arc::clone(&done), Arc::clone(&ret), Arc::clone(&installed));
        std::thread::spawn(move || {
            if let Err(e) = seccomp::install_trap_filter() {
                // Relaxed: published by `d` (Release).
                inst.store(i64::from(e.raw_os_error().unwrap_or(-1)), Ordering::Relaxed);
                // E1 (see below).
                d.store(true, Ordering::Release);
                return;
            }
            // SAFETY: getppid has no preconditions; under the filter it is trapped.
            let v = unsafe { libc::getppid() };
            // Relaxed: published by `d`.
            r.store(i64::from(v), Ordering::Relaxed);
            // E1: Release, pairs with E2.
            d.store(true, Ordering::Release);
            seccomp::park_forever();
        });
        let start = StdInstant::now();
        // E2: Acquire, pairs with E1.
        while !done.load(Ordering::Acquire) {
            if start.elapsed() > GUARD {
                return Err("filtered thread did not report".to_owned());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let errno = installed.load(Ordering::Relaxed);
        if errno != 0 {
            return Err(format!("installing the filter failed with errno {errno}"));
        }
        let v = ret.load(Ordering::Relaxed);
        let trapped = seccomp::trapped_syscalls();
        // This (unfiltered) thread's own syscalls are not trapped.
        // SAFETY: getppid has no preconditions.
        let real_ppid = unsafe { libc::getppid() };
        if v != -i64::from(libc::ENOSYS) || real_ppid <= 0 {
            return Err(format!(
                "getppid returned {v} under the filter, {real_ppid} outside"
            ));
        }
        Ok(format!(
            "getppid under the filter returned {v}; trapped {trapped:?}"
        ))
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        report.ok && report.status.success(),
        "{}\n{}",
        report.message,
        report.stderr
    );
    assert_eq!(report.trapped_count, 1, "{:?}", report.trapped);
    assert_eq!(report.trapped, vec![libc::SYS_getppid]);
}

#[test]
fn instant_is_usable_as_a_plain_u64() {
    // Protocol code stores Instants in #[repr(C)] state; keep the layout a bare u64.
    assert_eq!(size_of::<Instant>(), 8);
    assert_eq!(align_of::<Instant>(), align_of::<u64>());
}
