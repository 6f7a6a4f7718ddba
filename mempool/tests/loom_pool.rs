//! loom models of a pool: two threads getting and putting through caches and the cache-less
//! path on a pool of four objects.
//!
//! Run (a few seconds in release):
//!
//! ```text
//! LOOM_MAX_PREEMPTIONS=2 RUSTFLAGS="--cfg loom" \
//!     cargo test -p mempool --test loom_pool --release
//! ```
//!
//! The pool's own atomics are its statistics counters (single-writer load + store per cache,
//! `fetch_add` on the cache-less path) and the loom mutex of the cache registry; objects change
//! hands only through the free ring. What the models check:
//!
//! - **Exclusive ownership.** Each object has a shadow `loom::cell::UnsafeCell` standing in for
//!   its bytes (loom cannot see the mmapped region). An owner writes its stamp into the shadow
//!   after a get and checks it before the put; loom reports a causality violation if an object
//!   reached a second owner without the first owner's accesses happening-before (the ring's
//!   release/acquire edges, carried through the cache), and the stamp check catches two
//!   owners at once.
//! - **No loss, no duplication.** After the joins every object is back in the ring exactly once.
//! - **Counters.** The totals over live, dropped and cache-less counters add up: gets equal
//!   puts, and `empty` equals the failures the threads saw.
//!
//! The programs never wait for each other (a failed get is recorded, not retried), so the only
//! waiting is the ring's own Multi tail wait. The mmapped object memory itself is not touched.
#![cfg(loom)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use loom::cell::UnsafeCell;
use loom::thread;
use mempool::memory::set_notice_sink;
use mempool::pool::{ObjId, Pool, PoolCache, PoolConfig};
use mempool::ring::SyncType;

/// Pool size of every model.
const COUNT: u32 = 4;

/// `loom::model` that also reports how many executions it explored.
fn model(name: &str, f: impl Fn() + Sync + Send + 'static) {
    set_notice_sink(|_| {});
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    loom::model(move || {
        counter.fetch_add(1, Ordering::Relaxed);
        f();
    });
    let n = runs.load(Ordering::Relaxed);
    println!("{name}: {n} executions");
    assert!(n > 1, "{name}: loom explored a single execution");
}

/// A tiny pool plus one shadow cell per object. Shared through `loom::sync::Arc` (loom runs
/// its threads on one OS thread, and its cells are not `Sync`).
struct Fixture {
    pool: Arc<Pool>,
    shadow: Vec<UnsafeCell<u32>>,
}

impl Fixture {
    fn new() -> loom::sync::Arc<Self> {
        Self::with(1, SyncType::Multi)
    }

    /// A pool with caches of `cache_size` and a free ring in mode `ring`.
    fn with(cache_size: u32, ring: SyncType) -> loom::sync::Arc<Self> {
        let cfg = PoolConfig::new("loom", 64, COUNT)
            .cache_size(cache_size)
            .ring_sync(ring)
            .no_huge();
        let pool = Pool::new(cfg).expect("pool");
        let shadow = (0..COUNT).map(|_| UnsafeCell::new(0)).collect();
        loom::sync::Arc::new(Self { pool, shadow })
    }

    /// Takes ownership of `ids` for `me`: stamps their shadows.
    fn own(&self, ids: &[ObjId], me: u32) {
        for id in ids {
            self.shadow[id.index() as usize].with_mut(|p| {
                // SAFETY: loom checks that this access is ordered after every earlier access
                // of the cell; a violation fails the model instead of being UB.
                let prev = unsafe { p.replace(me) };
                assert_eq!(prev, 0, "{id:?} got by {me} while owned by {prev}");
            });
        }
    }

    /// Gives up ownership of `ids`: checks and clears their shadows.
    fn release(&self, ids: &[ObjId], me: u32) {
        for id in ids {
            self.shadow[id.index() as usize].with_mut(|p| {
                // SAFETY: as in `own`.
                let prev = unsafe { p.replace(0) };
                assert_eq!(prev, me, "{id:?} owned by {prev} while {me} held it");
            });
        }
    }

    /// After the joins: every object is back in the ring once, and the counters add up.
    fn check_quiescent(&self, empties: u64) {
        assert_eq!(self.pool.caches(), 0);
        assert_eq!(self.pool.in_ring(), COUNT as usize);
        let s = self.pool.stats();
        assert_eq!(s.gets, s.puts);
        assert_eq!(s.empty, empties);
        let mut all = [ObjId::default(); COUNT as usize];
        self.pool.get_bulk(&mut all).expect("all objects are back");
        let mut seen: Vec<u32> = all.iter().map(|id| id.index()).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..COUNT).collect::<Vec<_>>());
    }
}

/// A cache user: a bulk of 2 (refill or remainder fallback), then a single get/put pair, then
/// the drop (flush to the ring). Returns how many gets failed.
fn cache_user(f: &Fixture, mut cache: PoolCache, me: u32) -> u64 {
    let mut empties = 0;
    let mut two = [ObjId::default(); 2];
    if cache.get_bulk(&mut two).is_ok() {
        f.own(&two, me);
        f.release(&two, me);
        // SAFETY: got from this pool above, put once.
        unsafe { cache.put_bulk(&two) };
    } else {
        empties += 1;
    }
    match cache.get() {
        Ok(id) => {
            f.own(&[id], me);
            f.release(&[id], me);
            // SAFETY: as above.
            unsafe { cache.put(id) };
        }
        Err(_) => empties += 1,
    }
    drop(cache);
    empties
}

/// Runs `a` on a spawned thread and `b` on the model's main thread, then checks the pool.
fn run(a: impl FnOnce(&Fixture) -> u64 + Send + 'static, b: impl FnOnce(&Fixture) -> u64) {
    let f = Fixture::new();
    let fa = loom::sync::Arc::clone(&f);
    let t = thread::spawn(move || a(&fa));
    let eb = b(&f);
    let ea = t.join().unwrap();
    f.check_quiescent(ea + eb);
}

#[test]
fn two_caches() {
    // Caches are created on the main thread (registry lock outside the race) and moved.
    model("two caches", || {
        let f = Fixture::new();
        let (ca, cb) = (f.pool.cache(), f.pool.cache());
        let fa = loom::sync::Arc::clone(&f);
        let t = thread::spawn(move || cache_user(&fa, ca, 1));
        let eb = cache_user(&f, cb, 2);
        let ea = t.join().unwrap();
        f.check_quiescent(ea + eb);
    });
}

#[test]
fn cache_and_cacheless() {
    // The cache-less side works through the pool's shared ring handles (borrowed clones) and
    // its shared counters; the cache is created on its own thread (registry lock in the race).
    for cacheless_first in [false, true] {
        let cacheless = |f: &Fixture| {
            let mut empties = 0;
            let mut three = [ObjId::default(); 3];
            if f.pool.get_bulk(&mut three).is_ok() {
                f.own(&three, 3);
                f.release(&three, 3);
                // SAFETY: got from this pool above, put once.
                unsafe { f.pool.put_bulk(&three) };
            } else {
                empties += 1;
            }
            empties
        };
        let cached = |f: &Fixture| cache_user(f, f.pool.cache(), 4);
        if cacheless_first {
            model("cache-less spawned", move || run(cacheless, cached));
        } else {
            model("cache spawned", move || run(cached, cacheless));
        }
    }
}

#[test]
fn cacheless_ports_on_rts_and_hts_rings() {
    // Two cache-less ports (caches of size 0: every get and put is a ring operation, through
    // handles the ports own) on pools whose free ring is RTS or HTS. With RTS an object can be
    // put back before the get that took it has released its slot; the ring is sized for that.
    for ring in [SyncType::Rts, SyncType::Hts] {
        model(&format!("two cache-less ports, {ring} ring"), move || {
            let f = Fixture::with(0, ring);
            let (ca, cb) = (f.pool.cache(), f.pool.cache());
            let fa = loom::sync::Arc::clone(&f);
            let t = thread::spawn(move || cache_user(&fa, ca, 1));
            let eb = cache_user(&f, cb, 2);
            let ea = t.join().unwrap();
            f.check_quiescent(ea + eb);
        });
    }
}
