//! Two-thread stress with a per-object ownership check: each thread stamps every object it gets
//! with its own id and a sequence number and verifies the stamp before putting the object back,
//! so an object handed to two owners at once (or lost or duplicated by the ring and the caches)
//! shows up as a wrong stamp or a wrong final count.
//!
//! The pool is small relative to what the threads hold, so gets fail with `Empty` regularly and
//! every cache path runs: hits, refills, the remainder fallback, flushes and bypasses. Threads
//! never outnumber the two cores; waits spin briefly and then yield, and a generous deadline
//! turns a livelock into a failure. Nothing depends on timing to pass.
#![cfg(not(loom))]

use std::sync::Arc;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use mempool::pool::{ObjId, Pool, PoolConfig};
use mempool::ring::SyncType;

/// Get/put rounds per thread (moderate so unoptimised builds finish in seconds).
const ROUNDS: u64 = 20_000;
/// Hang guard; a healthy run takes well under a second in release.
const DEADLINE: Duration = Duration::from_secs(120);

/// Tiny xorshift for batch sizes.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Writes `stamp` at both ends of the object.
fn stamp(pool: &Pool, id: ObjId, stamp: u64) {
    let p = pool.addr(id).as_ptr();
    // SAFETY: the caller owns the object; both words are inside its `obj_size` (>= 16) bytes
    // and 8-aligned (objects are 64-aligned, obj_size is a multiple of 8).
    unsafe {
        p.cast::<u64>().write(stamp);
        p.add(pool.obj_size() - 8).cast::<u64>().write(stamp);
    }
}

/// Reads both stamp words of the object.
fn read_stamp(pool: &Pool, id: ObjId) -> (u64, u64) {
    let p = pool.addr(id).as_ptr();
    // SAFETY: as in `stamp`; the caller owns the object.
    unsafe {
        (
            p.cast::<u64>().read(),
            p.add(pool.obj_size() - 8).cast::<u64>().read(),
        )
    }
}

/// Waits after a failed get while holding nothing: spin briefly, then yield.
fn wait(failures: &mut u32, started: Instant) {
    *failures += 1;
    if *failures < 64 {
        std::hint::spin_loop();
    } else {
        thread::yield_now();
    }
    assert!(started.elapsed() < DEADLINE, "no progress");
}

/// One thread's work: hold up to 4 batches of 1..=40 objects, stamping each object on get and
/// checking the stamp on put. A get that finds the pool empty returns a held batch instead
/// (or waits, holding nothing), so the two threads can never wait for each other forever.
fn churn(pool: Arc<Pool>, cache_size: u32, me: u64, seed: u64) -> (u64, u64) {
    let started = Instant::now();
    let mut cache = pool.cache_with_size(cache_size).unwrap();
    let mut rng = Rng(seed);
    let mut held: Vec<(Vec<ObjId>, u64)> = Vec::new();
    let (mut checked, mut empties, mut failures) = (0u64, 0u64, 0u32);
    let mut round = 0u64;
    while round < ROUNDS {
        let mut force_put = held.len() >= 4;
        if !force_put {
            let mut batch = vec![ObjId::default(); 1 + rng.below(40) as usize];
            if cache.get_bulk(&mut batch).is_ok() {
                let s = me << 56 | round;
                for &id in &batch {
                    stamp(&pool, id, s);
                }
                held.push((batch, s));
                round += 1;
                failures = 0;
            } else {
                empties += 1;
                if held.is_empty() {
                    wait(&mut failures, started);
                    continue;
                }
                force_put = true;
            }
        }
        if force_put || rng.below(3) == 0 {
            let (batch, s) = held.swap_remove(rng.below(held.len() as u64) as usize);
            for &id in &batch {
                assert_eq!(
                    read_stamp(&pool, id),
                    (s, s),
                    "thread {me}: {id} was written by someone else while owned"
                );
                checked += 1;
            }
            // SAFETY: the batch came from this pool and is put back once.
            unsafe { cache.put_bulk(&batch) };
        }
    }
    for (batch, _) in held {
        // SAFETY: as above.
        unsafe { cache.put_bulk(&batch) };
    }
    (checked, empties)
}

fn two_threads(cache_size: u32, count: u32, sync: SyncType) {
    let pool = Pool::new(
        PoolConfig::new("stress", 64, count)
            .cache_size(cache_size)
            .ring_sync(sync)
            .no_huge(),
    )
    .unwrap();
    assert_eq!(pool.ring_sync(), sync);
    let handles: Vec<_> = (0..2u64)
        .map(|me| {
            let pool = Arc::clone(&pool);
            thread::spawn(move || churn(pool, cache_size, me + 1, 0x9e37_79b9 + me))
        })
        .collect();
    let (mut checked, mut empties) = (0, 0);
    for h in handles {
        let (c, e) = h.join().unwrap();
        checked += c;
        empties += e;
    }
    assert!(checked > 0);
    assert_eq!(pool.stats().empty, empties);
    // Every cache was dropped: all objects are back in the ring, none lost or duplicated.
    assert_eq!(
        (pool.in_ring(), pool.available(), pool.caches()),
        (count as usize, count as usize, 0)
    );
    let mut all = vec![ObjId::default(); count as usize];
    pool.get_bulk(&mut all).unwrap();
    all.sort_unstable();
    assert!(all.iter().enumerate().all(|(i, id)| id.index() == i as u32));
    let s = pool.stats();
    assert_eq!(s.gets, s.puts + u64::from(count));
    // SAFETY: from `pool`, once.
    unsafe { pool.put_bulk(&all) };
}

#[test]
fn two_caches_never_share_an_object() {
    two_threads(16, 300, SyncType::Multi);
}

#[test]
fn two_cacheless_ports_never_share_an_object() {
    two_threads(0, 200, SyncType::Multi);
}

/// Two threads cycle single gets and puts of a few objects each through cache-less ports of a
/// pool whose ring is almost full (DPDK's mempool workload with a small keep): the case in
/// which gets still unpublished on one thread and puts on the other meet.
fn keep_cycles(sync: SyncType) {
    const COUNT: u32 = 256;
    const KEEP: usize = 8;
    let pool = Pool::new(
        PoolConfig::new("keep", 64, COUNT)
            .cache_size(0)
            .ring_sync(sync)
            .no_huge(),
    )
    .unwrap();
    let handles: Vec<_> = (0..2u64)
        .map(|me| {
            let pool = Arc::clone(&pool);
            thread::spawn(move || {
                let started = Instant::now();
                let mut port = pool.cache();
                let mut held = [ObjId::default(); KEEP];
                for round in 0..ROUNDS * 10 {
                    for slot in &mut held {
                        let mut failures = 0;
                        *slot = loop {
                            match port.get() {
                                Ok(id) => break id,
                                Err(_) => wait(&mut failures, started),
                            }
                        };
                        stamp(&pool, *slot, me << 56 | round);
                    }
                    for &id in &held {
                        assert_eq!(read_stamp(&pool, id), (me << 56 | round, me << 56 | round));
                        // SAFETY: got above from this pool, put back once.
                        unsafe { port.put(id) };
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(pool.in_ring(), COUNT as usize);
}

// A power-of-two count leaves no spare slot in a ring sized for the objects. The RTS pools
// overflowed such a ring (a refused put, reported as a double free) until their ring got extra
// room: an RTS get may return before its slot is released, and the object can be put back
// meanwhile.
#[test]
fn keep_cycles_never_overflow_the_ring() {
    for sync in [SyncType::Multi, SyncType::Rts, SyncType::Hts] {
        keep_cycles(sync);
    }
}

#[test]
fn rts_pools_never_share_or_overflow() {
    two_threads(0, 256, SyncType::Rts);
    two_threads(16, 256, SyncType::Rts);
}

#[test]
fn hts_pools_never_share_or_overflow() {
    two_threads(0, 256, SyncType::Hts);
    two_threads(16, 256, SyncType::Hts);
}

#[test]
fn multi_pools_with_no_spare_slot() {
    two_threads(0, 256, SyncType::Multi);
}

#[test]
fn objects_freed_on_another_thread_come_back() {
    // Thread A gets and stamps, thread B checks and puts into its own cache: frees cross
    // lcores, objects travel A -> B's cache -> ring -> A's cache.
    let pool = Pool::new(PoolConfig::new("handoff", 64, 256).cache_size(32).no_huge()).unwrap();
    let (tx, rx) = mpsc::sync_channel::<(Vec<ObjId>, u64)>(4);
    let a_pool = Arc::clone(&pool);
    let a = thread::spawn(move || {
        let started = Instant::now();
        let mut cache = a_pool.cache();
        let mut rng = Rng(7);
        for round in 0..ROUNDS {
            let mut batch = vec![ObjId::default(); 1 + rng.below(24) as usize];
            // B returns everything it receives, so waiting here cannot deadlock (A holds
            // nothing but its cache, and the channel holds at most 4 x 24 objects).
            let mut failures = 0;
            while cache.get_bulk(&mut batch).is_err() {
                wait(&mut failures, started);
            }
            for &id in &batch {
                stamp(&a_pool, id, round);
            }
            tx.send((batch, round)).unwrap();
        }
    });
    let b_pool = Arc::clone(&pool);
    let b = thread::spawn(move || {
        let mut cache = b_pool.cache();
        let mut n = 0u64;
        for (batch, round) in rx {
            for &id in &batch {
                assert_eq!(read_stamp(&b_pool, id), (round, round), "{id}");
            }
            // SAFETY: A handed the objects over; they are put back once.
            unsafe { cache.put_bulk(&batch) };
            n += batch.len() as u64;
        }
        n
    });
    a.join().unwrap();
    let moved = b.join().unwrap();
    assert_eq!(pool.stats().puts, moved);
    assert_eq!(pool.in_ring(), 256);
}
