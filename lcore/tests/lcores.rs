//! Real threads on CPUs 0 and 1: pinning, launch/join, panics, messages and stopping under
//! load. Every loop runs in hybrid mode so the tests share the machine's two cores; waits are
//! bounded hang guards, never timing assertions.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant as StdInstant};

use lcore::time::RealClock;
use lcore::{
    CoreList, CpuSet, DrainPolicy, LcoreError, LcoreId, Lcores, LcoresConfig, LoopBuilder,
    LoopConfig, LoopExit, LoopState, PollMode, Role, SendError, StopReason,
};

/// Hang guard for anything that waits on another thread.
const GUARD: Duration = Duration::from_secs(120);

fn two_lcores<M: Copy + Send + 'static>(inbox: usize) -> Lcores<M> {
    let mut cfg = LcoresConfig::new(CoreList::parse("0-1").unwrap());
    cfg.inbox_capacity = inbox;
    Lcores::init(&cfg).expect("this test needs CPUs 0 and 1")
}

fn hybrid(name: &str) -> LoopConfig {
    LoopConfig {
        name: name.to_owned(),
        mode: PollMode::Hybrid {
            spin: Duration::from_micros(20),
            sleep: Duration::from_micros(50),
        },
        drain: DrainPolicy {
            idle_iterations: 64,
            timeout: Duration::from_secs(5),
        },
        ..LoopConfig::default()
    }
}

/// Adds a timed poller that raises the shared stop if the test runs longer than [`GUARD`], so
/// a bug shows up as a failed assertion instead of a hung test.
fn watchdog<M: Copy + Send + 'static>(b: &mut LoopBuilder<M, RealClock>) {
    let start = StdInstant::now();
    b.timed_poller("watchdog", Duration::from_millis(100), move |ctx| {
        if start.elapsed() > GUARD {
            ctx.stop_all();
        }
        0
    });
}

fn join_guarded<R>(h: lcore::LcoreHandle<R>) -> Result<R, LcoreError> {
    let start = StdInstant::now();
    while !h.is_finished() {
        assert!(start.elapsed() < GUARD, "{} did not finish", h.info());
        std::thread::sleep(Duration::from_millis(1));
    }
    h.join()
}

#[test]
fn workers_and_main_are_pinned_to_their_cpu() {
    let lcores = two_lcores::<u64>(64);
    let main = lcores.main_lcore();
    let worker = lcores.workers().next().unwrap();
    assert_eq!(lcores.info(main).unwrap().cpu, 0);
    assert_eq!(lcores.info(worker).unwrap().cpu, 1);
    assert_eq!(lcores.info(worker).unwrap().role, Role::Worker);

    let h = lcores
        .launch(worker, |lc| {
            // SAFETY: sched_getcpu has no preconditions.
            let on = unsafe { libc::sched_getcpu() };
            (
                lc.cpu(),
                lc.role(),
                on,
                CpuSet::current_thread_affinity().unwrap(),
            )
        })
        .unwrap();
    let (cpu, role, on, mask) = h.join().unwrap();
    assert_eq!((cpu, role, on), (1, Role::Worker, 1));
    assert_eq!(mask, [1].into_iter().collect::<CpuSet>());

    let before = CpuSet::current_thread_affinity().unwrap();
    let (on, mask) = lcores
        .run_on_main(|lc| {
            assert_eq!(lc.role(), Role::Main);
            // SAFETY: sched_getcpu has no preconditions.
            (
                unsafe { libc::sched_getcpu() },
                CpuSet::current_thread_affinity().unwrap(),
            )
        })
        .unwrap();
    assert_eq!(on, 0);
    assert_eq!(mask, [0].into_iter().collect::<CpuSet>());
    assert_eq!(
        CpuSet::current_thread_affinity().unwrap(),
        before,
        "affinity restored"
    );
}

#[test]
fn launch_errors_and_relaunch() {
    let lcores = two_lcores::<u64>(64);
    let main = lcores.main_lcore();
    let worker = lcores.workers().next().unwrap();
    assert!(matches!(
        lcores.launch(main, |_| ()),
        Err(LcoreError::NotAWorker { .. })
    ));
    assert!(matches!(
        lcores.launch(LcoreId::new(9), |_| ()),
        Err(LcoreError::NoSuchLcore { count: 2, .. })
    ));
    let release = std::sync::Arc::new(AtomicBool::new(false));
    let r2 = std::sync::Arc::clone(&release);
    let h = lcores
        .launch(worker, move |_| {
            // A1: Acquire, pairs with R1 below.
            while !r2.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(1));
            }
            7
        })
        .unwrap();
    assert!(matches!(
        lcores.launch(worker, |_| 0),
        Err(LcoreError::Busy { .. })
    ));
    assert!(matches!(
        lcores.drain_inbox(worker, |_| ()),
        Err(LcoreError::Busy { .. })
    ));
    // R1: Release, pairs with A1.
    release.store(true, Ordering::Release);
    assert_eq!(join_guarded(h).unwrap(), 7);
    // Launchable again, with its environment back.
    let h = lcores.launch_workers(|lc| lc.id()).unwrap();
    assert_eq!(lcore::join_all(h).unwrap(), vec![worker]);
}

#[test]
fn launch_loop_runs_a_loop_and_returns_its_report() {
    let lcores = two_lcores::<u64>(64);
    let worker = lcores.workers().next().unwrap();
    let h = lcores
        .launch_loop(worker, hybrid("quick"), |b| {
            let mut n = 0;
            b.poller("count", move |ctx| {
                n += 1;
                if n == 100 {
                    ctx.stop_local();
                }
                usize::from(!ctx.is_stopping())
            });
        })
        .unwrap();
    let r = join_guarded(h).unwrap().unwrap();
    // 100 busy iterations (the last one sees the stop), then 64 idle ones while draining.
    assert_eq!(r.exit, LoopExit::Idle);
    assert_eq!((r.iterations, r.busy_iterations), (164, 100));
    assert_eq!(
        lcores
            .snapshot(worker)
            .unwrap()
            .poller("count")
            .unwrap()
            .calls,
        r.iterations
    );
    let bad = LoopConfig {
        msg_batch: 0,
        ..hybrid("bad")
    };
    let h = lcores.launch_loop(worker, bad, |_| ()).unwrap();
    assert!(join_guarded(h).unwrap().is_err());
}

#[test]
fn full_inbox_hands_the_message_back() {
    let lcores = two_lcores::<u64>(8);
    let worker = lcores.workers().next().unwrap();
    let mut tx = lcores.sender(worker).unwrap();
    let mut sent = 0u64;
    let rejected = loop {
        match tx.send(sent) {
            Ok(()) => sent += 1,
            Err(e) => break e,
        }
    };
    assert_eq!(sent, 8);
    assert_eq!(rejected, SendError::Full(8));
    assert_eq!(rejected.into_inner(), 8);
    let mut got = Vec::new();
    assert_eq!(lcores.drain_inbox(worker, |m| got.push(m)).unwrap(), 8);
    assert_eq!(got, (0..8).collect::<Vec<_>>());
}

#[test]
fn panic_on_a_worker_is_reported_and_stops_the_others() {
    let lcores = two_lcores::<u64>(64);
    let worker = lcores.workers().next().unwrap();
    let h = lcores
        .launch(worker, |lc| {
            let mut b = LoopBuilder::<u64, _>::new(hybrid("doomed"), RealClock::new());
            let mut n = 0;
            b.poller("bomb", move |_| {
                n += 1;
                if n == 1_000 {
                    panic!("boom after {n} polls");
                }
                1
            });
            let mut l = b.build().unwrap();
            lc.run(&mut l)
        })
        .unwrap();
    let report = lcores
        .run_on_main(|lc| {
            let mut b = LoopBuilder::<u64, _>::new(hybrid("survivor"), RealClock::new());
            b.poller("idle", |_| 0);
            watchdog(&mut b);
            let mut l = b.build().unwrap();
            lc.run(&mut l)
        })
        .unwrap();
    // The main loop returned because the panic raised the shared stop.
    assert_eq!(report.exit, LoopExit::Idle);
    assert_eq!(
        lcores.stop_token().reason(),
        Some(StopReason::Panic(worker))
    );
    let err = join_guarded(h).unwrap_err();
    match &err {
        LcoreError::Panicked {
            lcore,
            cpu,
            message,
        } => {
            assert_eq!((*lcore, *cpu), (worker, 1));
            assert!(message.contains("boom after 1000 polls"), "{message}");
        }
        other => panic!("unexpected {other:?}"),
    }
    let text = err.to_string();
    assert!(text.contains("lcore 1 (cpu 1) panicked"), "{text}");
}

#[test]
fn panic_on_main_is_reported_and_stops_workers() {
    let lcores = two_lcores::<u64>(64);
    let main = lcores.main_lcore();
    let worker = lcores.workers().next().unwrap();
    let h = lcores
        .launch(worker, |lc| {
            let mut b = LoopBuilder::<u64, _>::new(hybrid("worker"), RealClock::new());
            b.poller("idle", |_| 0);
            watchdog(&mut b);
            let mut l = b.build().unwrap();
            lc.run(&mut l)
        })
        .unwrap();
    let err = lcores
        .run_on_main(|_| -> () { panic!("main gave up") })
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("lcore 0 (cpu 0) panicked: main gave up"),
        "{err}"
    );
    assert_eq!(lcores.stop_token().reason(), Some(StopReason::Panic(main)));
    assert_eq!(join_guarded(h).unwrap().exit, LoopExit::Idle);
}

#[test]
fn one_million_messages_in_order() {
    const N: u64 = 1_000_000;
    let lcores = two_lcores::<u64>(4096);
    let main = lcores.main_lcore();
    let worker = lcores.workers().next().unwrap();
    let producer = lcores
        .launch(worker, move |lc| {
            let mut b = LoopBuilder::<u64, _>::new(hybrid("producer"), RealClock::new());
            let mut next = 0u64;
            let mut buf = [0u64; 32];
            b.poller("stream", move |ctx| {
                if next == N || ctx.is_stopping() {
                    return 0;
                }
                let n = (N - next).min(32) as usize;
                for (i, m) in buf[..n].iter_mut().enumerate() {
                    *m = next + i as u64;
                }
                let sent = ctx.send_burst(main, &buf[..n]);
                next += sent as u64;
                sent
            });
            watchdog(&mut b);
            let mut l = b.build().unwrap();
            lc.run(&mut l);
            l.snapshot()
        })
        .unwrap();
    let (received, in_order, snap) = lcores
        .run_on_main(|lc| {
            let mut b = LoopBuilder::<u64, _>::new(hybrid("consumer"), RealClock::new());
            let expected = Rc::new(Cell::new(0u64));
            let in_order = Rc::new(Cell::new(true));
            let (e2, o2) = (Rc::clone(&expected), Rc::clone(&in_order));
            b.on_message(move |ctx, seq| {
                if seq != e2.get() {
                    o2.set(false);
                }
                e2.set(e2.get() + 1);
                if e2.get() == N {
                    ctx.stop_all();
                }
            });
            watchdog(&mut b);
            let mut l = b.build().unwrap();
            lc.run(&mut l);
            (expected.get(), in_order.get(), l.snapshot())
        })
        .unwrap();
    let psnap = join_guarded(producer).unwrap();
    assert_eq!(received, N);
    assert!(in_order, "messages arrived out of order");
    assert_eq!(snap.inbox.work, N);
    assert_eq!(psnap.poller("stream").unwrap().work, N);
    assert_eq!(
        lcores.drain_inbox(main, |_| ()).unwrap(),
        0,
        "nothing left over"
    );
}

#[test]
fn stop_under_load_drains_and_keeps_the_stats() {
    let lcores = two_lcores::<u64>(1024);
    let main = lcores.main_lcore();
    let worker = lcores.workers().next().unwrap();
    let producer = lcores
        .launch(worker, move |lc| {
            let mut b = LoopBuilder::<u64, _>::new(hybrid("producer"), RealClock::new());
            let mut next = 0u64;
            let sent = Rc::new(Cell::new(0u64));
            let s2 = Rc::clone(&sent);
            b.poller("generate", move |ctx| {
                if ctx.is_stopping() {
                    return 0;
                }
                let msgs: [u64; 16] = core::array::from_fn(|i| next + i as u64);
                let n = ctx.send_burst(main, &msgs);
                next += n as u64;
                s2.set(next);
                n
            });
            let local = Rc::new(Cell::new(0u64));
            let l2 = Rc::clone(&local);
            b.poller("local-work", move |ctx| {
                if ctx.is_stopping() {
                    return 0;
                }
                l2.set(l2.get() + 1);
                1
            });
            watchdog(&mut b);
            let mut l = b.build().unwrap();
            let report = lc.run(&mut l);
            (report, sent.get(), local.get(), l.snapshot())
        })
        .unwrap();

    let (consumer, stop_to_return) = std::thread::scope(|s| {
        // A monitor thread reads live stats and raises the stop once enough flowed.
        let monitor = s.spawn(|| {
            let start = StdInstant::now();
            loop {
                assert!(start.elapsed() < GUARD, "no progress");
                let got = lcores.snapshot(main).map_or(0, |s| s.inbox.work);
                let live = lcores.snapshot(worker);
                if got >= 200_000 && live.as_ref().is_some_and(|w| w.state == LoopState::Running) {
                    let w = live.unwrap();
                    assert!(w.iterations > 0 && w.poller("generate").unwrap().work > 0);
                    lcores.stop();
                    return StdInstant::now();
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        let consumer = lcores
            .run_on_main(|lc| {
                let mut b = LoopBuilder::<u64, _>::new(hybrid("consumer"), RealClock::new());
                let expected = Rc::new(Cell::new(0u64));
                let in_order = Rc::new(Cell::new(true));
                let (e2, o2) = (Rc::clone(&expected), Rc::clone(&in_order));
                b.on_message(move |_, seq| {
                    if seq != e2.get() {
                        o2.set(false);
                    }
                    e2.set(e2.get() + 1);
                });
                watchdog(&mut b);
                let mut l = b.build().unwrap();
                let r = lc.run(&mut l);
                (r, expected.get(), in_order.get(), l.snapshot())
            })
            .unwrap();
        let stopped_at = monitor.join().unwrap();
        (consumer, stopped_at)
    });
    let (p_report, sent, local, p_snap) = join_guarded(producer).unwrap();
    assert!(stop_to_return.elapsed() < GUARD);
    let (c_report, received, in_order, c_snap) = consumer;

    // Nothing lost: every message sent was handled or is still in the inbox.
    let mut leftover = Vec::new();
    lcores.drain_inbox(main, |m| leftover.push(m)).unwrap();
    assert!(in_order);
    assert_eq!(sent, received + leftover.len() as u64);
    assert!(
        leftover.iter().copied().eq(received..sent),
        "leftovers continue the sequence"
    );
    assert!(received >= 200_000);

    // Final stats reflect all the work.
    assert_eq!(lcores.stop_token().reason(), Some(StopReason::Requested));
    assert_eq!(
        (p_snap.state, c_snap.state),
        (LoopState::Finished, LoopState::Finished)
    );
    assert_eq!(p_snap.poller("generate").unwrap().work, sent);
    assert_eq!(p_snap.poller("local-work").unwrap().work, local);
    assert_eq!(c_snap.inbox.work, received);
    assert_eq!(c_report.messages, received);
    assert_eq!(p_report.iterations, p_snap.iterations);
    assert_eq!(
        p_snap.busy_nanos + p_snap.idle_nanos,
        p_report.busy_nanos + p_report.idle_nanos
    );
    assert_eq!(
        lcores.snapshot(worker).unwrap(),
        p_snap,
        "Lcores sees the final snapshot"
    );
    for r in [p_report, c_report] {
        assert!(matches!(r.exit, LoopExit::Idle | LoopExit::DrainTimeout));
    }
}

#[test]
fn perf_entry_point_runs_on_two_cpus() {
    let cfg = lcore::perf::PerfConfig {
        idle_pollers: 4,
        loop_iterations: 20_000,
        latency_samples: 500,
        throughput_messages: 50_000,
        ..lcore::perf::PerfConfig::default()
    };
    let r = lcore::perf::measure(&cfg).unwrap();
    assert!(r.loop_ns_per_iter > 0.0);
    assert!(r.latency_min_ns <= r.latency_p50_ns && r.latency_p50_ns <= r.latency_p99_ns);
    assert!(r.msgs_per_sec > 0.0);
    assert_eq!((r.cpus, r.burst), ([0, 1], 32));
    let bad = lcore::perf::PerfConfig {
        cpus: [1, 1],
        ..cfg
    };
    assert!(lcore::perf::measure(&bad).is_err());
}
