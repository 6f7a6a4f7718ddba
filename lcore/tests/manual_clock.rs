//! Deterministic poll-loop tests on a virtual clock: busy/idle accounting, timers, timed
//! pollers and the drain phase. No threads, no real time.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use lcore::time::{Clock, Instant, ManualClock};
use lcore::{
    DrainPolicy, LoopBuilder, LoopConfig, LoopExit, LoopState, PollMode, PollerKind, StopToken,
    TimerEvent,
};

const MS: u64 = 1_000_000;

/// Hybrid mode with a spin longer than any test's virtual run, so it never sleeps.
fn config(timer_interval: u32, drain: DrainPolicy) -> LoopConfig {
    LoopConfig {
        name: "test".to_owned(),
        mode: PollMode::Hybrid {
            spin: Duration::from_secs(3600),
            sleep: Duration::from_micros(50),
        },
        timer_interval,
        timer_capacity: 8192,
        drain,
        ..LoopConfig::default()
    }
}

fn stop_immediately() -> DrainPolicy {
    DrainPolicy {
        idle_iterations: 0,
        timeout: Duration::from_secs(1),
    }
}

#[test]
fn busy_idle_accounting_is_exact() {
    let clock = ManualClock::new(Instant::from_nanos(1_000));
    let mut b = LoopBuilder::<(), _>::new(config(1, stop_immediately()), clock.clone());
    // Busy on these iterations, doing 3 units of work and taking 100 ns; idle ones take 10 ns.
    let busy_on = [0u64, 2, 3, 7, 8];
    let c = clock.clone();
    let mut i = 0u64;
    b.poller("scripted", move |ctx| {
        let busy = busy_on.contains(&i);
        c.advance_nanos(if busy { 100 } else { 10 });
        i += 1;
        if i.is_multiple_of(12) {
            ctx.stop_local();
        }
        if busy { 3 } else { 0 }
    });
    let c = clock.clone();
    b.poller("steady", move |_| {
        c.advance_nanos(1);
        0
    });
    let mut l = b.build().unwrap();
    let start = clock.now();
    let r = l.run_detached(&StopToken::new());
    let elapsed = clock.now().nanos_since(start);

    assert_eq!(r.exit, LoopExit::Idle);
    assert_eq!(r.iterations, 12);
    assert_eq!(r.busy_iterations, 5);
    assert_eq!(r.busy_nanos, 5 * 101);
    assert_eq!(r.idle_nanos, 7 * 11);
    assert_eq!(r.busy_nanos + r.idle_nanos, elapsed);

    let s = l.snapshot();
    assert_eq!(s.state, LoopState::Finished);
    assert_eq!((s.iterations, s.busy_iterations), (12, 5));
    assert_eq!((s.busy_nanos, s.idle_nanos, s.sleeps), (505, 77, 0));
    let p = s.poller("scripted").unwrap();
    assert_eq!(p.kind, PollerKind::Active);
    assert_eq!(
        (p.calls, p.busy_calls, p.work, p.nanos),
        (12, 5, 15, 5 * 100 + 7 * 10)
    );
    let q = s.poller("steady").unwrap();
    assert_eq!((q.calls, q.busy_calls, q.work, q.nanos), (12, 0, 0, 12));
    assert_eq!(
        s.timers.calls, 12,
        "timer_interval 1 checks every iteration"
    );
    assert_eq!(s.inbox.calls, 0, "a detached loop has no inbox");
    assert!((s.busy_ratio() - 505.0 / 582.0).abs() < 1e-12);

    // A second run keeps accumulating.
    let r2 = l.run_detached(&StopToken::new());
    assert_eq!(r2.iterations, 12);
    assert_eq!(l.snapshot().iterations, 24);
}

/// Runs a loop whose only poller advances the clock by 1 ms per iteration, for `iterations`,
/// recording every timer event with the time it was handled.
fn run_timers(
    timer_interval: u32,
    iterations: u64,
    setup: impl FnOnce(&mut lcore::Timers),
    mut on_timer: impl FnMut(&mut lcore::Ctx<'_, ()>, TimerEvent) + 'static,
) -> Vec<(u64, Instant, Instant)> {
    let clock = ManualClock::new(Instant::ZERO);
    let mut b =
        LoopBuilder::<(), _>::new(config(timer_interval, stop_immediately()), clock.clone());
    let c = clock.clone();
    let mut n = 0;
    b.poller("tick", move |ctx| {
        c.advance_nanos(MS);
        n += 1;
        if n == iterations {
            ctx.stop_local();
        }
        0
    });
    let log = Rc::new(RefCell::new(Vec::new()));
    let l2 = Rc::clone(&log);
    b.on_timer(move |ctx, ev| {
        l2.borrow_mut().push((ev.token, ev.deadline, ctx.now()));
        on_timer(ctx, ev);
    });
    let mut l = b.build().unwrap();
    setup(l.timers());
    l.run_detached(&StopToken::new());
    assert_eq!(l.snapshot().timers.work, log.borrow().len() as u64);
    drop(l);
    Rc::try_unwrap(log).unwrap().into_inner()
}

#[test]
fn timers_fire_in_deadline_order_at_their_deadline() {
    let log = run_timers(
        1,
        10,
        |t| {
            t.arm(Instant::from_nanos(5 * MS), 5).unwrap();
            t.arm(Instant::from_nanos(MS), 1).unwrap();
            t.arm(Instant::from_nanos(3 * MS), 30).unwrap();
            t.arm(Instant::from_nanos(3 * MS), 31).unwrap();
            t.arm(Instant::from_nanos(20 * MS), 99).unwrap();
        },
        |_, _| {},
    );
    let tokens: Vec<u64> = log.iter().map(|e| e.0).collect();
    assert_eq!(tokens, vec![1, 30, 31, 5], "99 is beyond the run");
    for (_, deadline, fired) in &log {
        assert_eq!(
            deadline, fired,
            "checked every iteration, so handled exactly at deadline"
        );
    }
}

#[test]
fn timer_checks_happen_once_per_batch() {
    // Checked every 8 iterations = every 8 ms of virtual time.
    let log = run_timers(
        8,
        20,
        |t| {
            t.arm(Instant::from_nanos(MS), 1).unwrap();
            t.arm(Instant::from_nanos(9 * MS), 2).unwrap();
        },
        |_, _| {},
    );
    assert_eq!(
        log,
        vec![
            (1, Instant::from_nanos(MS), Instant::from_nanos(8 * MS)),
            (2, Instant::from_nanos(9 * MS), Instant::from_nanos(16 * MS)),
        ]
    );
}

#[test]
fn periodic_timer_and_cancel_from_handler() {
    let fired = Rc::new(Cell::new(0));
    let f2 = Rc::clone(&fired);
    let log = run_timers(
        1,
        30,
        |t| {
            t.arm_periodic(Instant::from_nanos(2 * MS), Duration::from_millis(2), 7)
                .unwrap();
        },
        move |ctx, ev| {
            f2.set(f2.get() + 1);
            if f2.get() == 4 {
                assert!(ctx.timers().cancel(ev.id));
            }
        },
    );
    assert_eq!(fired.get(), 4);
    let deadlines: Vec<u64> = log.iter().map(|e| e.1.as_nanos() / MS).collect();
    assert_eq!(deadlines, vec![2, 4, 6, 8]);
}

#[test]
fn cancelled_timer_never_fires_and_handler_can_rearm() {
    let clock = ManualClock::new(Instant::ZERO);
    let mut b = LoopBuilder::<(), _>::new(config(1, stop_immediately()), clock.clone());
    let victim = Rc::new(Cell::new(None));
    let v2 = Rc::clone(&victim);
    let c = clock.clone();
    let mut n = 0;
    b.poller("tick", move |ctx| {
        c.advance_nanos(MS);
        n += 1;
        if n == 2 {
            // Cancel the 5 ms timer before it is due.
            assert!(ctx.timers().cancel(v2.get().unwrap()));
        }
        if n == 20 {
            ctx.stop_local();
        }
        0
    });
    let log = Rc::new(RefCell::new(Vec::new()));
    let l2 = Rc::clone(&log);
    b.on_timer(move |ctx, ev| {
        l2.borrow_mut().push(ev.token);
        // A one-shot timer re-arms itself twice, 4 ms later each time.
        if ev.token < 3 {
            ctx.arm_timer(Duration::from_millis(4), ev.token + 1)
                .unwrap();
        }
    });
    let mut l = b.build().unwrap();
    l.timers().arm(Instant::from_nanos(3 * MS), 1).unwrap();
    victim.set(Some(
        l.timers().arm(Instant::from_nanos(5 * MS), 100).unwrap(),
    ));
    l.run_detached(&StopToken::new());
    assert_eq!(*log.borrow(), vec![1, 2, 3]);
    assert!(l.timers().is_empty());
}

#[test]
fn many_timers_fire_in_order_within_one_check() {
    let n = 5_000u64;
    let log = run_timers(
        4,
        1_100,
        |t| {
            for i in 0..n {
                // Deadlines spread over 0..1000 ms in a scrambled order.
                let d = (i * 7_919) % 1_000_003;
                t.arm(Instant::from_nanos(d * 1_000), i).unwrap();
            }
        },
        |_, _| {},
    );
    assert_eq!(log.len() as u64, n);
    assert!(log.windows(2).all(|w| w[0].1 <= w[1].1), "deadline order");
    for (_, deadline, fired) in &log {
        assert!(fired >= deadline);
        assert!(
            fired.nanos_since(*deadline) <= 4 * MS,
            "noticed by the next check"
        );
    }
}

#[test]
fn timed_poller_runs_at_its_period() {
    let clock = ManualClock::new(Instant::ZERO);
    let mut b = LoopBuilder::<(), _>::new(config(16, stop_immediately()), clock.clone());
    let c = clock.clone();
    let mut n = 0;
    b.poller("tick", move |ctx| {
        c.advance_nanos(MS);
        n += 1;
        if n == 10 {
            ctx.stop_local();
        }
        0
    });
    let calls = Rc::new(RefCell::new(Vec::new()));
    let c2 = Rc::clone(&calls);
    b.timed_poller("every-3ms", Duration::from_millis(3), move |ctx| {
        c2.borrow_mut().push(ctx.now().as_nanos() / MS);
        1
    });
    let mut l = b.build().unwrap();
    let r = l.run_detached(&StopToken::new());
    assert_eq!(*calls.borrow(), vec![3, 6, 9]);
    assert_eq!(r.busy_iterations, 3);
    let s = l.snapshot();
    let p = s.poller("every-3ms").unwrap();
    assert_eq!(p.kind, PollerKind::Timed(Duration::from_millis(3)));
    assert_eq!((p.calls, p.work), (3, 3));
}

#[test]
fn zero_period_and_bad_batch_are_rejected() {
    let mut b = LoopBuilder::<(), _>::new(LoopConfig::default(), ManualClock::default());
    b.timed_poller("bad", Duration::ZERO, |_| 0);
    assert_eq!(
        b.build().unwrap_err(),
        lcore::LoopConfigError::ZeroPeriod("bad".into())
    );
    let cfg = LoopConfig {
        msg_batch: 0,
        ..LoopConfig::default()
    };
    let b = LoopBuilder::<(), _>::new(cfg, ManualClock::default());
    assert_eq!(b.build().unwrap_err(), lcore::LoopConfigError::MsgBatch(0));
    let cfg = LoopConfig {
        timer_interval: 0,
        ..LoopConfig::default()
    };
    let b = LoopBuilder::<(), _>::new(cfg, ManualClock::default());
    assert_eq!(
        b.build().unwrap_err(),
        lcore::LoopConfigError::TimerInterval
    );
}

#[test]
fn drain_waits_for_idle_iterations() {
    let clock = ManualClock::new(Instant::ZERO);
    let drain = DrainPolicy {
        idle_iterations: 5,
        timeout: Duration::from_secs(1),
    };
    let mut b = LoopBuilder::<(), _>::new(config(16, drain), clock.clone());
    let c = clock.clone();
    b.poller("producer", move |ctx| {
        c.advance_nanos(MS);
        usize::from(!ctx.is_stopping())
    });
    let mut l = b.build().unwrap();
    let stop = StopToken::new();
    stop.stop();
    let r = l.run_detached(&stop);
    // Iteration 0 is busy and sees the stop; iterations 1..=5 are idle while draining.
    assert_eq!(r.exit, LoopExit::Idle);
    assert_eq!((r.iterations, r.busy_iterations), (6, 1));
    assert_eq!(r.drain_nanos, 5 * MS);
}

#[test]
fn drain_timeout_bounds_a_poller_that_never_goes_idle() {
    let clock = ManualClock::new(Instant::ZERO);
    let drain = DrainPolicy {
        idle_iterations: 5,
        timeout: Duration::from_millis(10),
    };
    let mut b = LoopBuilder::<(), _>::new(config(16, drain), clock.clone());
    let c = clock.clone();
    let mut n = 0;
    b.poller("stubborn", move |ctx| {
        c.advance_nanos(MS);
        n += 1;
        if n == 3 {
            ctx.stop_all();
        }
        1
    });
    let mut l = b.build().unwrap();
    let stop = StopToken::new();
    let r = l.run_detached(&stop);
    assert!(stop.is_stopped(), "stop_all raised the shared token");
    assert_eq!(r.exit, LoopExit::DrainTimeout);
    // Stop seen at the end of iteration 3 (t = 3 ms); returns at t = 13 ms.
    assert_eq!(r.iterations, 13);
    assert_eq!(r.drain_nanos, 10 * MS);
    assert_eq!(r.busy_iterations, 13);
}
