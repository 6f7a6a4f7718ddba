//! The doorbell's notification (sleepers and the futex): a ring after an arm ends the
//! sleep, a ring between arm and sleep is not lost, and rings without sleepers make no
//! system call. A post list rings the peer's doorbell once.

use crate::hostile_tests::pair;
use crate::layout::Doorbell;
use core::sync::atomic::Ordering;
use dp_fabric::{Completion, CompletionQueue, Payload, RcQueuePair, RecvWr, SendOp, SendWr};
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

/// One `post_send` of eight SENDs rings the peer's doorbell once, after the eight are
/// published: a sleeping peer is woken once and finds all of them.
#[test]
fn a_post_list_rings_the_peer_once() {
    let (mut p, dir) = pair(22_300);
    for i in 0..8 {
        p.b.qp
            .post_recv(&[RecvWr { wr_id: i, sgl: &[] }])
            .expect("post_recv");
    }
    let db = {
        let peer = p.a.qp.core.peer.get().expect("connected");
        let db: *const Doorbell = peer.doorbell();
        // SAFETY: the peer's doorbell segment stays mapped while the pair lives (p outlives
        // every use below).
        unsafe { &*db }
    };
    // A sleeper announced: every ring counts a wake.
    let t = db.arm();
    let wrs = [SendWr {
        wr_id: 0,
        op: SendOp::Send,
        payload: Payload::Inline(&[]),
        flags: dp_fabric::SendFlags::NONE,
    }; 8];
    p.a.qp.post_send(&wrs).expect("post_send");
    let rings = db.wake_seq.load(Ordering::SeqCst).wrapping_sub(t);
    db.disarm();
    assert_eq!(
        rings, 1,
        "eight SENDs posted in one call rang {rings} times"
    );
    let mut out = [Completion::default(); 16];
    let mut got = 0;
    for _ in 0..1_000_000 {
        got += p.b.cq.poll(&mut out);
        if got == 8 {
            break;
        }
    }
    assert_eq!(got, 8, "the peer received every SEND of the list");
    drop(p);
    let _ = std::fs::remove_dir_all(&dir);
}
