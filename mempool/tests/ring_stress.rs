//! Multi-thread stress of the ring flavours (Single and Multi on each side, RTS and HTS on their
//! own and mixed with the others): every element arrives exactly once, and each consumer sees
//! each producer's elements in the order they were produced.
//!
//! Elements are `producer_id << 32 | sequence`. Producers and consumers mix single, bulk and
//! burst operations of varying sizes. Threads outnumber the two cores of the CI box, so every
//! wait falls back to `yield_now`, and a generous deadline turns a livelock into a failure
//! instead of a hang. Nothing here depends on timing to pass.
#![cfg(not(loom))]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use mempool::ring::{Consumer, Producer, Ring, SyncMode};

/// Per-producer element count (kept moderate so debug builds finish in seconds).
const PER_PRODUCER: u64 = 200_000;
/// Hang guard; a healthy run takes well under a second.
const DEADLINE: Duration = Duration::from_secs(120);

/// Tiny xorshift to vary batch sizes deterministically per thread.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Waits a little after an unsuccessful attempt: spin first, then yield (the box has 2 cores).
fn backoff(failures: &mut u32, started: Instant, what: &str) {
    *failures += 1;
    if *failures < 64 {
        std::hint::spin_loop();
    } else {
        thread::yield_now();
        assert!(
            started.elapsed() < DEADLINE,
            "{what}: no progress before the deadline"
        );
    }
}

fn produce<P: SyncMode>(mut tx: Producer<u64, P>, id: u64, n: u64) {
    let started = Instant::now();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (id + 1));
    let mut seq = 0u64;
    let mut failures = 0;
    let mut batch = Vec::with_capacity(64);
    while seq < n {
        let r = rng.next();
        let want = ((r % 48) + 1).min(n - seq);
        batch.clear();
        batch.extend((seq..seq + want).map(|s| id << 32 | s));
        let done = match r % 3 {
            0 => match tx.enqueue(batch[0]) {
                Ok(()) => 1,
                Err(v) => {
                    assert_eq!(v, batch[0], "enqueue must give the value back");
                    0
                }
            },
            1 => {
                let k = tx.enqueue_bulk(&batch);
                assert!(
                    k == 0 || k == batch.len(),
                    "bulk moved {k} of {}",
                    batch.len()
                );
                k
            }
            _ => tx.enqueue_burst(&batch),
        };
        if done == 0 {
            backoff(&mut failures, started, "producer");
        } else {
            failures = 0;
        }
        seq += done as u64;
    }
}

/// What one consumer saw: per-producer count and checksum; order is checked on the fly.
struct Seen {
    count: Vec<u64>,
    sum: Vec<u64>,
}

fn consume<C: SyncMode>(
    mut rx: Consumer<u64, C>,
    producers: usize,
    total: u64,
    taken: &AtomicU64,
    seed: u64,
) -> Seen {
    let started = Instant::now();
    let mut rng = Rng(seed);
    let mut last: Vec<Option<u64>> = vec![None; producers];
    let mut seen = Seen {
        count: vec![0; producers],
        sum: vec![0; producers],
    };
    let mut buf = [0u64; 64];
    let mut failures = 0;
    // The shared counter ends the loop once every element has been taken by some consumer.
    while taken.load(Ordering::Acquire) < total {
        let r = rng.next();
        let want = ((r % 48) + 1) as usize;
        let got = match r % 3 {
            0 => match rx.dequeue() {
                Some(v) => {
                    buf[0] = v;
                    1
                }
                None => 0,
            },
            1 => {
                let k = rx.dequeue_bulk(&mut buf[..want]);
                assert!(k == 0 || k == want, "bulk moved {k} of {want}");
                k
            }
            _ => rx.dequeue_burst(&mut buf[..want]),
        };
        if got == 0 {
            backoff(&mut failures, started, "consumer");
            continue;
        }
        failures = 0;
        taken.fetch_add(got as u64, Ordering::AcqRel);
        for &v in &buf[..got] {
            let (p, s) = ((v >> 32) as usize, v & 0xFFFF_FFFF);
            assert!(p < producers, "element {v:#x} names no producer");
            if let Some(prev) = last[p] {
                assert!(
                    s > prev,
                    "producer {p}: {s} after {prev} (reordered or duplicated)"
                );
            }
            last[p] = Some(s);
            seen.count[p] += 1;
            seen.sum[p] += s;
        }
    }
    seen
}

/// Runs `producers` x `consumers` threads over one ring and checks the union of what the
/// consumers saw: exactly `0..PER_PRODUCER` from each producer (count and sum; together with the
/// strictly increasing per-consumer order this rules out loss and duplication).
fn run<P: SyncMode, C: SyncMode>(
    capacity: usize,
    start: u32,
    producers: usize,
    consumers: usize,
    make_tx: impl Fn(&Producer<u64, P>) -> Producer<u64, P>,
    make_rx: impl Fn(&Consumer<u64, C>) -> Consumer<u64, C>,
) {
    let (tx, rx) = Ring::<u64>::with_capacity_and_start::<P, C>(capacity, start).unwrap();
    let total = PER_PRODUCER * producers as u64;
    let taken = Arc::new(AtomicU64::new(0));
    let mut txs: Vec<_> = (1..producers).map(|_| make_tx(&tx)).collect();
    txs.push(tx);
    let mut rxs: Vec<_> = (1..consumers).map(|_| make_rx(&rx)).collect();
    rxs.push(rx);

    let seen = thread::scope(|s| {
        for (id, tx) in txs.into_iter().enumerate() {
            s.spawn(move || produce(tx, id as u64, PER_PRODUCER));
        }
        let handles: Vec<_> = rxs
            .into_iter()
            .enumerate()
            .map(|(i, rx)| {
                let taken = Arc::clone(&taken);
                s.spawn(move || consume(rx, producers, total, &taken, 0xDEAD_BEEF + i as u64))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("consumer panicked"))
            .collect::<Vec<_>>()
    });

    let expected_sum = PER_PRODUCER * (PER_PRODUCER - 1) / 2;
    for p in 0..producers {
        let count: u64 = seen.iter().map(|s| s.count[p]).sum();
        let sum: u64 = seen.iter().map(|s| s.sum[p]).sum();
        assert_eq!(count, PER_PRODUCER, "producer {p}: element count");
        assert_eq!(sum, expected_sum, "producer {p}: checksum");
    }
    assert_eq!(taken.load(Ordering::Acquire), total);
}

#[test]
fn spsc_two_threads() {
    run::<mempool::ring::Single, mempool::ring::Single>(
        64,
        u32::MAX - 1000,
        1,
        1,
        |_| unreachable!(),
        |_| unreachable!(),
    );
}

#[test]
fn mpsc_two_producers() {
    run::<mempool::ring::Multi, mempool::ring::Single>(
        64,
        u32::MAX - 1000,
        2,
        1,
        Clone::clone,
        |_| unreachable!(),
    );
}

#[test]
fn spmc_two_consumers() {
    run::<mempool::ring::Single, mempool::ring::Multi>(
        64,
        u32::MAX - 1000,
        1,
        2,
        |_| unreachable!(),
        Clone::clone,
    );
}

#[test]
fn mpmc_two_by_two() {
    run::<mempool::ring::Multi, mempool::ring::Multi>(
        64,
        u32::MAX - 1000,
        2,
        2,
        Clone::clone,
        Clone::clone,
    );
}

#[test]
fn mpmc_two_by_two_tiny_ring() {
    // Capacity 4 maximises full/empty transitions and tail-wait contention.
    run::<mempool::ring::Multi, mempool::ring::Multi>(4, 0, 2, 2, Clone::clone, Clone::clone);
}

#[test]
fn rts_two_by_two() {
    use mempool::ring::Rts;
    run::<Rts, Rts>(64, u32::MAX - 1000, 2, 2, Clone::clone, Clone::clone);
}

#[test]
fn rts_unthrottled_tiny_ring() {
    // htd_max = capacity: claims never wait for the tail, so finishes come in any order.
    use mempool::ring::Rts;
    let unthrottled_tx = |tx: &Producer<u64, Rts>| {
        let mut tx = tx.clone();
        tx.set_htd_max(4);
        tx
    };
    let unthrottled_rx = |rx: &Consumer<u64, Rts>| {
        let mut rx = rx.clone();
        rx.set_htd_max(4);
        rx
    };
    run::<Rts, Rts>(4, 0, 3, 2, unthrottled_tx, unthrottled_rx);
}

#[test]
fn hts_two_by_two() {
    use mempool::ring::Hts;
    run::<Hts, Hts>(64, u32::MAX - 1000, 2, 2, Clone::clone, Clone::clone);
}

#[test]
fn hts_two_by_two_tiny_ring() {
    use mempool::ring::Hts;
    run::<Hts, Hts>(4, 0, 2, 2, Clone::clone, Clone::clone);
}

#[test]
fn modes_mixed_across_sides() {
    use mempool::ring::{Hts, Multi, Rts, Single};
    run::<Rts, Hts>(16, u32::MAX - 1000, 2, 2, Clone::clone, Clone::clone);
    run::<Hts, Rts>(16, u32::MAX - 1000, 2, 2, Clone::clone, Clone::clone);
    run::<Multi, Rts>(16, 0, 2, 2, Clone::clone, Clone::clone);
    run::<Hts, Single>(16, 0, 2, 1, Clone::clone, |_| unreachable!());
    run::<Single, Rts>(16, 0, 1, 2, |_| unreachable!(), Clone::clone);
}
