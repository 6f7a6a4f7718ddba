//! loom models of the rings: every interleaving (up to the preemption bound) of small
//! producer/consumer programs, with loom checking the memory orderings of the index protocol
//! and every slot access (a slot read that is not ordered after its write, or a write not
//! ordered after the previous read of that slot, is reported as a causality violation).
//!
//! Run (CI does, in `scripts/test.sh`; a few minutes in release on the 2-core box):
//!
//! ```text
//! LOOM_MAX_PREEMPTIONS=2 RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p mempool --test loom_ring --release
//! ```
//!
//! loom cannot see memory we `mmap` ourselves, so these models use heap rings; the heap and
//! shared-memory constructors share the same layout and code.
//!
//! The programs never wait for each other: loom explores every scheduling choice at every
//! retry of a spin loop, so a consumer polling an empty ring (or a producer polling a full one)
//! makes the state space explode. Instead each thread runs a fixed script of single, bulk and
//! burst operations whose outcome depends on the interleaving (full and empty rings happen at
//! capacity 2), records what succeeded, and after the joins the consumers drain the rest. The
//! only waiting left is inside the ring (the Multi tail wait, the HTS wait for an idle side,
//! the RTS head/tail distance wait), which is what we want loom to look at. Elements are `producer << 4 | sequence`; each model checks that what was dequeued is
//! exactly what was enqueued (no loss, no duplication) and that every consumer saw each
//! producer's elements in increasing order (FIFO per producer).
//!
//! Every model runs once per role with that role on loom's main thread. loom's DPOR remembers
//! only the last access to each atomic, so a race "A loads X; B loads X; B stores X" (exactly
//! what a Multi producer does with its own tail in the tail wait) is explored only if B runs
//! first in the initial schedule. Starting each role first in turn recovers those
//! interleavings; with a single start order, weakening R1 to Relaxed went unnoticed in the
//! Multi models.
//!
//! The models are known to be sharp: weakening any single ordering edge of the index protocol
//! (`src/ring/headtail.rs`, `index.rs`, `mt.rs`, `rts.rs`, `hts.rs`) to `Relaxed` makes at
//! least one model fail (checked by hand: the edges of the Multi and Single paths when the
//! models were written, the RTS and HTS edges and the shared-mode reload when those came):
//!
//! | weakened edge                                | failing models                                   |
//! |----------------------------------------------|--------------------------------------------------|
//! | R1/R2 tail store, Single                     | spsc, spsc wrap, spmc                            |
//! | R1/R2 tail store, Multi                      | mpsc, mpmc 2x1, mpmc 2x2, mpmc reuse             |
//! | A1/A2 opposite-tail load (`opp_pos`, all modes) | every model                                   |
//! | R3 head CAS success (Multi)                  | mpsc, spmc, spmc cached, mpmc 2x1, mpmc 2x2, mpmc reuse |
//! | A3 head load (Multi)                         | mpsc, mpmc 2x1, mpmc 2x2, mpmc reuse             |
//! | A3 head CAS failure (Multi)                  | mpsc, mpmc reuse                                 |
//! | A4 tail wait, first load or spin (Multi)     | mpsc, mpmc 2x1, mpmc 2x2, mpmc reuse             |
//! | R3 head CAS success (RTS)                    | rts 2x2, rts reuse, rts throttled, multi x rts, single x rts |
//! | A3 head load (RTS)                           | rts 2x2, rts reuse, rts throttled, multi x rts, single x rts |
//! | R1/R2 tail CAS success (RTS)                 | rts 2x2, rts reuse, rts throttled, rts x hts, multi x rts |
//! | A6 tail load (RTS finish)                    | rts 3x1                                          |
//! | A6 tail CAS failure (RTS finish)             | rts reuse, rts x hts                             |
//! | A5 word load, claim and wait (HTS)           | hts 2x2, hts reuse, hts x multi, rts x hts, hts x single |
//! | A5 CAS failure (HTS)                         | hts 2x2, hts reuse, hts x multi, rts x hts, hts x single |
//! | R1/R2 publishing store (HTS)                 | hts 2x2, hts reuse, hts x multi, rts x hts, hts x single |
//!
//! The three deliberately Relaxed accesses (the HTS claim CAS, the RTS finisher's head load,
//! the RTS distance check) are argued in `hts.rs` and `rts.rs`.
#![cfg(loom)]

use std::sync::atomic::{AtomicUsize, Ordering};

use loom::thread;
use mempool::ring::{Consumer, Hts, Multi, Producer, Ring, Rts, Single, SyncMode};

/// `loom::model` that also reports how many executions it explored (visible with
/// `--nocapture`), so a model that silently stopped exploring is noticed.
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

/// One step of a scripted thread: `One` uses `enqueue`/`dequeue`, `Bulk(n)` and `Burst(n)`
/// move up to `n` elements.
#[derive(Debug, Clone, Copy)]
enum Step {
    One,
    Bulk(usize),
    Burst(usize),
}

/// What a role returns: a producer's enqueued elements, or a consumer's dequeued elements plus
/// a closure that drains the ring with the same handle once every thread is joined.
enum Out {
    Sent(Vec<u8>),
    Got(Vec<u8>, Box<dyn FnOnce() -> Vec<u8> + Send>),
}

/// A thread's script, bound to its handle.
type Role = Box<dyn FnOnce() -> Out + Send>;

/// A producer role; `id` must be its index among the scenario's producers.
fn producer<P: SyncMode>(mut tx: Producer<u8, P>, id: u8, script: &'static [Step]) -> Role {
    Box::new(move || Out::Sent(produce(&mut tx, id, script)))
}

/// A consumer role.
fn consumer<C: SyncMode>(mut rx: Consumer<u8, C>, script: &'static [Step]) -> Role {
    Box::new(move || {
        let got = consume(&mut rx, script);
        Out::Got(got, Box::new(move || drain(&mut rx)))
    })
}

/// Runs `roles` concurrently with role `on_main` on the current thread, joins, drains, and
/// checks the outcome.
fn run(mut roles: Vec<Role>, on_main: usize) {
    let main_role = roles.remove(on_main);
    let handles: Vec<_> = roles.into_iter().map(thread::spawn).collect();
    let main_out = main_role();
    let mut outs: Vec<Out> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    outs.insert(on_main, main_out);

    let mut sent = Vec::new();
    let mut received = Vec::new();
    for out in outs {
        match out {
            Out::Sent(s) => sent.push(s),
            Out::Got(mut got, drain) => {
                got.extend(drain());
                received.push(got);
            }
        }
    }
    check(&sent, &received);
}

/// Runs the scenario built by `roles` once per choice of the role on loom's main thread.
fn scenario(name: &str, n_roles: usize, roles: fn() -> Vec<Role>) {
    let all: Vec<usize> = (0..n_roles).collect();
    scenario_firsts(name, n_roles, &all, roles);
}

/// [`scenario`] with only the roles in `firsts` on loom's main thread in turn: for scenarios
/// whose roles are symmetric, one of each kind is enough.
fn scenario_firsts(name: &str, n_roles: usize, firsts: &[usize], roles: fn() -> Vec<Role>) {
    for &on_main in firsts {
        model(&format!("{name} (role {on_main} first)"), move || {
            let r = roles();
            assert_eq!(r.len(), n_roles);
            run(r, on_main);
        });
    }
}

/// Runs `script` on the producer `id`; returns the elements that were enqueued, in order.
/// Sequence numbers of failed attempts are skipped, so order stays checkable.
fn produce<P: SyncMode>(tx: &mut Producer<u8, P>, id: u8, script: &[Step]) -> Vec<u8> {
    let mut seq = 0u8;
    let mut sent = Vec::new();
    for step in script {
        let want = match *step {
            Step::One => 1,
            Step::Bulk(n) | Step::Burst(n) => n,
        };
        let batch: Vec<u8> = (seq..seq + want as u8).map(|s| id << 4 | s).collect();
        let n = match *step {
            Step::One => usize::from(tx.enqueue(batch[0]).is_ok()),
            Step::Bulk(_) => {
                let n = tx.enqueue_bulk(&batch);
                assert!(n == 0 || n == want, "bulk enqueued {n} of {want}");
                n
            }
            Step::Burst(_) => tx.enqueue_burst(&batch),
        };
        sent.extend_from_slice(&batch[..n]);
        seq += want as u8;
    }
    sent
}

/// Runs `script` on a consumer; returns what it dequeued, in order.
fn consume<C: SyncMode>(rx: &mut Consumer<u8, C>, script: &[Step]) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4];
    for step in script {
        match *step {
            Step::One => got.extend(rx.dequeue()),
            Step::Bulk(n) => {
                let k = rx.dequeue_bulk(&mut buf[..n]);
                assert!(k == 0 || k == n, "bulk dequeued {k} of {n}");
                got.extend_from_slice(&buf[..k]);
            }
            Step::Burst(n) => {
                let k = rx.dequeue_burst(&mut buf[..n]);
                got.extend_from_slice(&buf[..k]);
            }
        }
    }
    got
}

/// Dequeues everything left (after all threads are joined).
fn drain<C: SyncMode>(rx: &mut Consumer<u8, C>) -> Vec<u8> {
    let mut got = Vec::new();
    while let Some(v) = rx.dequeue() {
        got.push(v);
    }
    got
}

/// No loss or duplication, and FIFO per producer within each consumer's stream.
fn check(sent: &[Vec<u8>], received: &[Vec<u8>]) {
    for got in received {
        for p in 0..sent.len() as u8 {
            let seq: Vec<u8> = got
                .iter()
                .filter(|v| *v >> 4 == p)
                .map(|v| v & 0xF)
                .collect();
            assert!(
                seq.windows(2).all(|w| w[0] < w[1]),
                "producer {p} reordered: {got:?}"
            );
        }
    }
    let mut all_sent: Vec<u8> = sent.iter().flatten().copied().collect();
    let mut all_received: Vec<u8> = received.iter().flatten().copied().collect();
    all_sent.sort_unstable();
    all_received.sort_unstable();
    assert_eq!(all_received, all_sent, "lost or duplicated elements");
}

#[test]
fn spsc_single_bulk_burst() {
    scenario("spsc", 2, || {
        let (tx, rx) = Ring::<u8>::spsc(2).unwrap();
        vec![
            producer(
                tx,
                0,
                &[Step::One, Step::Bulk(2), Step::Burst(2), Step::One],
            ),
            consumer(rx, &[Step::Burst(2), Step::One, Step::Bulk(2)]),
        ]
    });
}

#[test]
fn spsc_wraps_counters() {
    // Counters start at u32::MAX, so the model crosses the wrap on the first operation.
    scenario("spsc wrap", 2, || {
        let (tx, rx) = Ring::<u8>::with_capacity_and_start::<Single, Single>(2, u32::MAX).unwrap();
        vec![
            producer(tx, 0, &[Step::Bulk(2), Step::Burst(2)]),
            consumer(rx, &[Step::One, Step::Burst(2)]),
        ]
    });
}

#[test]
fn mpsc_two_producers() {
    scenario("mpsc 2x1", 3, || {
        let (tx, rx) = Ring::<u8>::mpsc(2).unwrap();
        vec![
            producer(tx.clone(), 0, &[Step::Bulk(2), Step::One]),
            producer(tx, 1, &[Step::One, Step::Burst(2)]),
            consumer(rx, &[Step::Burst(2), Step::One]),
        ]
    });
}

#[test]
fn spmc_two_consumers() {
    scenario("spmc 1x2", 3, || {
        let (tx, rx) = Ring::<u8>::spmc(2).unwrap();
        vec![
            producer(tx, 0, &[Step::Bulk(2), Step::One, Step::Burst(2)]),
            consumer(rx.clone(), &[Step::Bulk(2), Step::One]),
            consumer(rx, &[Step::One, Step::Burst(2)]),
        ]
    });
}

/// A Multi consumer claims from the producer position another consumer loaded and cached in
/// the head word, without loading the producer tail itself: its slot reads are ordered after
/// the producer's writes only through the other consumer's claim (A1, then R3 -> A3).
#[test]
fn spmc_claim_from_a_position_cached_by_another_consumer() {
    scenario("spmc cached", 3, || {
        let (tx, rx) = Ring::<u8>::spmc(2).unwrap();
        vec![
            producer(tx, 0, &[Step::Bulk(2)]),
            consumer(rx.clone(), &[Step::One]),
            consumer(rx, &[Step::One]),
        ]
    });
}

#[test]
fn mpmc_two_producers_one_consumer() {
    scenario("mpmc 2x1", 3, || {
        let (tx, rx) = Ring::<u8>::mpmc(2).unwrap();
        vec![
            producer(tx.clone(), 0, &[Step::One, Step::Bulk(2)]),
            producer(tx, 1, &[Step::Burst(2), Step::One]),
            consumer(rx, &[Step::One, Step::Bulk(2), Step::Burst(2)]),
        ]
    });
}

#[test]
fn mpmc_two_producers_two_consumers() {
    scenario("mpmc 2x2", 4, || {
        let (tx, rx) = Ring::<u8>::with_capacity::<Multi, Multi>(2).unwrap();
        vec![
            producer(tx.clone(), 0, &[Step::Bulk(2)]),
            producer(tx, 1, &[Step::One]),
            consumer(rx.clone(), &[Step::One]),
            consumer(rx, &[Step::Burst(2)]),
        ]
    });
}

#[test]
fn mpmc_two_by_two_slot_reuse() {
    // Three elements through two slots: the third enqueue must reuse a slot that a consumer
    // read, which exercises R2/A2 and the consumer-side tail wait (A4) across threads.
    scenario("mpmc 2x2 reuse", 4, || {
        let (tx, rx) = Ring::<u8>::mpmc(2).unwrap();
        vec![
            producer(tx.clone(), 0, &[Step::Bulk(2), Step::One]),
            producer(tx, 1, &[Step::One]),
            consumer(rx.clone(), &[Step::One, Step::Bulk(2)]),
            consumer(rx, &[Step::Burst(2)]),
        ]
    });
}

// RTS and HTS. Each side's mode is independent of the other's (the opposite side only reads
// the tail position), so the models also mix modes across the two sides.

#[test]
fn rts_two_by_two() {
    // htd_max = capacity: no throttling, so two claims of a side can be in flight and finish in
    // either order; only the last finisher may move the tail.
    scenario("rts 2x2", 4, || {
        let (mut tx, mut rx) = Ring::<u8>::with_capacity::<Rts, Rts>(2).unwrap();
        tx.set_htd_max(2);
        rx.set_htd_max(2);
        vec![
            producer(tx.clone(), 0, &[Step::Bulk(2)]),
            producer(tx, 1, &[Step::One]),
            consumer(rx.clone(), &[Step::One]),
            consumer(rx, &[Step::Burst(2)]),
        ]
    });
}

#[test]
fn rts_slot_reuse() {
    // Three elements through two slots with unthrottled RTS on both sides: a slot is rewritten
    // only after the consumer tail, moved by whichever consumer finished last, releases it.
    scenario("rts 2x2 reuse", 4, || {
        let (mut tx, mut rx) = Ring::<u8>::with_capacity::<Rts, Rts>(2).unwrap();
        tx.set_htd_max(2);
        rx.set_htd_max(2);
        vec![
            producer(tx.clone(), 0, &[Step::Bulk(2), Step::One]),
            producer(tx, 1, &[Step::One]),
            consumer(rx.clone(), &[Step::One, Step::Bulk(2)]),
            consumer(rx, &[Step::Burst(2)]),
        ]
    });
}

#[test]
fn rts_three_producers() {
    // Three claims in flight on one side: a finisher that counted a later claim's finish must
    // not then read a head older than that finisher saw, or it would publish the middle claim
    // before it is written (A6 on the tail load).
    // The three producers run the same script, so one of them first covers the others.
    scenario_firsts("rts 3x1", 4, &[0, 3], || {
        let (mut tx, rx) = Ring::<u8>::with_capacity::<Rts, Single>(4).unwrap();
        tx.set_htd_max(4);
        vec![
            producer(tx.clone(), 0, &[Step::One]),
            producer(tx.clone(), 1, &[Step::One]),
            producer(tx, 2, &[Step::One]),
            consumer(rx, &[Step::Burst(3)]),
        ]
    });
}

#[test]
fn rts_throttled_producers_single_consumer() {
    // The default htd_max of a 2-slot ring is 0: each RTS claim waits until the previous one
    // of its side has finished (the distance wait), which loom explores as a spin.
    scenario("rts 2x1 throttled", 3, || {
        let (tx, rx) = Ring::<u8>::with_capacity::<Rts, Single>(2).unwrap();
        assert_eq!(tx.htd_max(), 0);
        vec![
            producer(tx.clone(), 0, &[Step::One, Step::Bulk(2)]),
            producer(tx, 1, &[Step::Burst(2)]),
            consumer(rx, &[Step::One, Step::Burst(2)]),
        ]
    });
}

#[test]
fn hts_two_by_two() {
    scenario("hts 2x2", 4, || {
        let (tx, rx) = Ring::<u8>::with_capacity::<Hts, Hts>(2).unwrap();
        vec![
            producer(tx.clone(), 0, &[Step::Bulk(2)]),
            producer(tx, 1, &[Step::One]),
            consumer(rx.clone(), &[Step::One]),
            consumer(rx, &[Step::Burst(2)]),
        ]
    });
}

#[test]
fn hts_slot_reuse() {
    scenario("hts 2x2 reuse", 4, || {
        let (tx, rx) = Ring::<u8>::with_capacity::<Hts, Hts>(2).unwrap();
        vec![
            producer(tx.clone(), 0, &[Step::Bulk(2), Step::One]),
            producer(tx, 1, &[Step::One]),
            consumer(rx.clone(), &[Step::One, Step::Bulk(2)]),
            consumer(rx, &[Step::Burst(2)]),
        ]
    });
}

#[test]
fn rts_producers_hts_consumers() {
    scenario("rts x hts", 4, || {
        let (mut tx, rx) = Ring::<u8>::with_capacity::<Rts, Hts>(2).unwrap();
        tx.set_htd_max(2);
        vec![
            producer(tx.clone(), 0, &[Step::One, Step::One]),
            producer(tx, 1, &[Step::One]),
            consumer(rx.clone(), &[Step::Bulk(2)]),
            consumer(rx, &[Step::One]),
        ]
    });
}

#[test]
fn hts_producers_multi_consumers() {
    scenario("hts x multi", 4, || {
        let (tx, rx) = Ring::<u8>::with_capacity::<Hts, Multi>(2).unwrap();
        vec![
            producer(tx.clone(), 0, &[Step::Bulk(2), Step::One]),
            producer(tx, 1, &[Step::One]),
            consumer(rx.clone(), &[Step::One, Step::One]),
            consumer(rx, &[Step::Burst(2)]),
        ]
    });
}

#[test]
fn multi_producers_rts_consumers() {
    scenario("multi x rts", 4, || {
        let (tx, mut rx) = Ring::<u8>::with_capacity::<Multi, Rts>(2).unwrap();
        rx.set_htd_max(2);
        vec![
            producer(tx.clone(), 0, &[Step::Bulk(2), Step::One]),
            producer(tx, 1, &[Step::One]),
            consumer(rx.clone(), &[Step::One, Step::Bulk(2)]),
            consumer(rx, &[Step::Burst(2)]),
        ]
    });
}

#[test]
fn single_producer_rts_and_hts_consumers() {
    scenario("single x rts", 3, || {
        let (tx, mut rx) = Ring::<u8>::with_capacity::<Single, Rts>(2).unwrap();
        rx.set_htd_max(2);
        vec![
            producer(tx, 0, &[Step::Bulk(2), Step::One, Step::Burst(2)]),
            consumer(rx.clone(), &[Step::Bulk(2), Step::One]),
            consumer(rx, &[Step::One, Step::Burst(2)]),
        ]
    });
    scenario("hts x single", 3, || {
        let (tx, rx) = Ring::<u8>::with_capacity::<Hts, Single>(2).unwrap();
        vec![
            producer(tx.clone(), 0, &[Step::Bulk(2), Step::One]),
            producer(tx, 1, &[Step::One, Step::Burst(2)]),
            consumer(rx, &[Step::Burst(2), Step::One]),
        ]
    });
}
