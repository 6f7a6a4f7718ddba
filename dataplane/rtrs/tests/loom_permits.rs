//! loom models of the permit bitmap (`dp_rtrs::permit::Permits`).
//!
//! Run (seconds in release; `scripts/test.sh` runs it):
//!
//! ```text
//! LOOM_MAX_PREEMPTIONS=2 RUSTFLAGS="--cfg loom" \
//!     cargo test -p dp-rtrs --test loom_permits --release
//! ```
//!
//! What the models check:
//!
//! - **Exclusivity and publication.** Each permit has a shadow `loom::cell::UnsafeCell`
//!   standing in for its chunk's request slot. A holder writes its stamp after the get and
//!   reads it back before the put; loom reports a causality violation if a permit reached a
//!   second holder without the first holder's accesses happening-before (the `fetch_or`
//!   Acquire / `fetch_and` Release pair, A1/R1), and the stamp check catches two holders.
//! - **No loss, no duplication.** After the joins every permit is free and the in-use
//!   counter is 0; every get that returned `None` happened while all permits were taken.
//! - **WAIT.** A getter in `Wait` mode on an exhausted pool returns once the holder puts.
//! - **Fences.** A put of a fenced permit racing its unfence frees it exactly once, and the
//!   next holder sees the last holder's writes.
#![cfg(loom)]

use std::sync::atomic::{AtomicUsize, Ordering};

use dp_rtrs::permit::{ConType, Permits, Wait};
use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;

/// `loom::model` that also reports how many executions it explored.
fn model(name: &str, f: impl Fn() + Sync + Send + 'static) {
    let runs = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = std::sync::Arc::clone(&runs);
    loom::model(move || {
        counter.fetch_add(1, Ordering::Relaxed);
        f();
    });
    let n = runs.load(Ordering::Relaxed);
    println!("{name}: {n} executions");
    assert!(n > 1, "{name}: loom explored a single execution");
}

struct Fixture {
    permits: Permits,
    slots: Vec<UnsafeCell<u32>>,
}

impl Fixture {
    fn new(depth: u16) -> Arc<Self> {
        Arc::new(Self {
            permits: Permits::new(depth, 1),
            slots: (0..depth).map(|_| UnsafeCell::new(0)).collect(),
        })
    }

    /// Takes a permit, stamps its slot, checks the stamp, returns it. `None` if exhausted.
    fn cycle(&self, lane: u16, stamp: u32, wait: Wait) -> Option<u16> {
        let p = self.permits.get(ConType::Io, lane, wait)?;
        let id = p.id();
        let slot = &self.slots[usize::from(id)];
        slot.with_mut(|s| write_cell(s, stamp));
        assert_eq!(
            slot.with(|s| read_cell(s)),
            stamp,
            "two holders of permit {id}"
        );
        self.permits.put(p);
        Some(id)
    }
}

// loom's cells hand out raw pointers; these two helpers are the models' only accesses.
fn write_cell(p: *mut u32, v: u32) {
    // SAFETY: loom's `with_mut` gives exclusive access for the closure's duration, and loom
    // itself reports any concurrent access as a causality violation.
    unsafe { *p = v }
}

fn read_cell(p: *const u32) -> u32 {
    // SAFETY: loom's `with` gives shared access for the closure's duration.
    unsafe { *p }
}

#[test]
fn loom_two_getters_one_permit() {
    model("two getters, one permit", || {
        let f = Fixture::new(1);
        let g = Arc::clone(&f);
        let t = thread::spawn(move || g.cycle(1, 2, Wait::NoWait));
        let a = f.cycle(0, 1, Wait::NoWait);
        let b = t.join().unwrap();
        assert!(a.is_some() || b.is_some(), "somebody got the only permit");
        assert_eq!(f.permits.in_use(), 0);
        assert!(!f.permits.is_taken(0));
    });
}

#[test]
fn loom_two_getters_two_permits() {
    model("two getters, two permits, two rounds", || {
        let f = Fixture::new(2);
        let g = Arc::clone(&f);
        let t = thread::spawn(move || {
            let x = g.cycle(1, 20, Wait::NoWait);
            let y = g.cycle(1, 21, Wait::NoWait);
            (x, y)
        });
        let a = f.cycle(0, 10, Wait::NoWait);
        let (x, y) = t.join().unwrap();
        // Two permits, at most two holders at a time: nobody was ever refused.
        assert!(a.is_some() && x.is_some() && y.is_some());
        assert_eq!(f.permits.in_use(), 0);
    });
}

#[test]
fn loom_wait_is_woken_by_put() {
    model("WAIT getter woken by a put", || {
        let f = Fixture::new(1);
        let held = f.permits.get(ConType::Io, 0, Wait::NoWait).unwrap();
        let g = Arc::clone(&f);
        let t = thread::spawn(move || {
            let p = g.permits.get(ConType::Admin, 1, Wait::Wait).unwrap();
            // The holder's write (made after the spawn) is visible: R1/A1 published it.
            let seen = g.slots[0].with(|s| read_cell(s));
            g.permits.put(p);
            seen
        });
        f.slots[0].with_mut(|s| write_cell(s, 7));
        f.permits.put(held);
        assert_eq!(t.join().unwrap(), 7);
        assert_eq!(f.permits.in_use(), 0);
    });
}

#[test]
fn loom_fenced_put_races_unfence() {
    model("put of a fenced permit against its unfence", || {
        let f = Fixture::new(1);
        let p = f.permits.get(ConType::Io, 0, Wait::NoWait).unwrap();
        f.permits.fence(0);
        let g = Arc::clone(&f);
        let t = thread::spawn(move || {
            g.slots[0].with_mut(|s| write_cell(s, 5));
            g.permits.put(p);
        });
        f.permits.unfence(0);
        t.join().unwrap();
        // Freed exactly once: not parked for ever, and the in-use count did not wrap.
        assert!(!f.permits.is_taken(0), "a parked permit was never freed");
        assert_eq!(f.permits.in_use(), 0, "freed twice");
        // The next holder sees the last holder's write, whichever side freed it.
        let q = f.permits.get(ConType::Io, 0, Wait::NoWait).unwrap();
        assert_eq!(f.slots[0].with(|s| read_cell(s)), 5);
        f.permits.put(q);
    });
}
