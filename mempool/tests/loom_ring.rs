//! loom models of the rings: every interleaving (up to the preemption bound) of small
//! producer/consumer programs, with loom checking the memory orderings of the index protocol
//! and every slot access (a slot read that is not ordered after its write, or a write not
//! ordered after the previous read of that slot, is reported as a causality violation).
//!
//! Run (about 30 s in release on the 2-core CI box, most of it `mpmc 2x2 reuse`):
//!
//! ```text
//! LOOM_MAX_PREEMPTIONS=3 RUSTFLAGS="--cfg loom" \
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
//! only waiting left is inside the ring: the Multi tail wait, which is what we want loom to
//! look at. Elements are `producer << 4 | sequence`; each model checks that what was dequeued is
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
//! The models are known to be sharp: weakening any single ordering edge of
//! `src/ring/headtail.rs` to `Relaxed` makes at least one model fail with a causality
//! violation (checked by hand when the models were written):
//!
//! | weakened edge                          | failing models                       |
//! |----------------------------------------|--------------------------------------|
//! | R1/R2 tail store                       | all                                  |
//! | A1/A2 opposite-tail load, Single path  | spsc, spsc wrap, mpsc 2x1            |
//! | A1/A2 opposite-tail load, Multi path   | mpsc, spmc, mpmc 2x1, mpmc 2x2       |
//! | R3 head CAS success                    | mpsc, spmc, mpmc 2x1, mpmc 2x2       |
//! | A3 head load                           | mpsc, spmc, mpmc 2x1, mpmc 2x2       |
//! | A4 tail wait, producer side            | mpsc, mpmc 2x1, mpmc 2x2             |
//! | A4 tail wait, consumer side            | mpmc 2x2, mpmc 2x2 reuse             |
#![cfg(loom)]

use std::sync::atomic::{AtomicUsize, Ordering};

use loom::thread;
use mempool::ring::{Consumer, Multi, Producer, Ring, Single, SyncMode};

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
    for on_main in 0..n_roles {
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
