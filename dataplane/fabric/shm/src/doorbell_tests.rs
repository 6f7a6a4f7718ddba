//! The doorbell's notification (sleepers and the futex): a ring after an arm ends the
//! sleep, a ring between arm and sleep is not lost, and rings without sleepers make no
//! system call.

use crate::layout::Doorbell;
use core::sync::atomic::Ordering;
use std::time::{Duration, Instant};

fn doorbell() -> Box<Doorbell> {
    // SAFETY: Doorbell is plain atomics and bytes, for which all-zero is valid (a fresh
    // shared segment is zeroed the same way).
    unsafe { Box::<Doorbell>::new_zeroed().assume_init() }
}

#[test]
fn a_ring_after_the_arm_ends_the_sleep() {
    let db: &'static Doorbell = Box::leak(doorbell());
    let t = db.arm();
    let ringer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        db.ring(3);
    });
    let t0 = Instant::now();
    db.sleep(t, Duration::from_secs(30));
    let slept = t0.elapsed();
    ringer.join().unwrap();
    assert!(
        slept < Duration::from_secs(15),
        "the ring did not wake the sleeper ({slept:?})"
    );
    assert_eq!(db.sleepers.load(Ordering::SeqCst), 0, "sleep disarms");
}

#[test]
fn a_ring_between_arm_and_sleep_is_not_lost() {
    let db = doorbell();
    let t = db.arm();
    db.ring(7);
    let t0 = Instant::now();
    db.sleep(t, Duration::from_secs(30));
    assert!(
        t0.elapsed() < Duration::from_secs(15),
        "slept through a ring"
    );
}

#[test]
fn rings_without_sleepers_leave_the_futex_alone() {
    let db = doorbell();
    db.ring(1);
    db.ring(2);
    assert_eq!(db.wake_seq.load(Ordering::SeqCst), 0);
    let t = db.arm();
    db.disarm();
    db.ring(1);
    assert_eq!(db.wake_seq.load(Ordering::SeqCst), t, "disarmed: no wake");
    // A peer that cleared the count cannot make it wrap.
    db.disarm();
    assert_eq!(db.sleepers.load(Ordering::SeqCst), 0);
}
