//! Model-based test of a cache in front of the ring: random sequences of gets, puts, flushes
//! and cache-less operations, checked after every step against an executable statement of the
//! DPDK rules in the module docs (exact cache length, ring count and counters), plus the
//! pool-wide invariants (every object is in exactly one place; ids are never duplicated).
#![cfg(not(loom))]

use std::collections::HashSet;

use mempool::pool::{ObjId, Pool, PoolConfig, flush_threshold};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    /// Get this many objects through the cache.
    Get(usize),
    /// Put this many of the held objects (most recently got first) through the cache.
    Put(usize),
    /// Get this many straight from the ring.
    RingGet(usize),
    /// Put this many held objects straight to the ring.
    RingPut(usize),
    /// Flush the cache.
    Flush,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..40).prop_map(Op::Get),
        4 => (0usize..40).prop_map(Op::Put),
        1 => (0usize..20).prop_map(Op::RingGet),
        1 => (0usize..20).prop_map(Op::RingPut),
        1 => Just(Op::Flush),
    ]
}

/// The expected state: objects in the cache and in the ring, and the counters.
#[derive(Debug, Default, PartialEq, Eq)]
struct Model {
    cache: usize,
    ring: usize,
    gets: u64,
    puts: u64,
    hits: u64,
    empty: u64,
    refills: u64,
    flushes: u64,
}

impl Model {
    /// A cache get of `n` with cache size `size`; `false` if it must fail.
    fn get(&mut self, n: usize, size: usize) -> bool {
        let len = self.cache;
        if n <= len {
            self.cache -= n;
            self.hits += n as u64;
        } else {
            let remaining = n - len;
            if remaining <= size && self.ring >= size + remaining {
                self.ring -= size + remaining;
                self.cache = size;
                self.refills += 1;
            } else if self.ring >= remaining {
                self.ring -= remaining;
                self.cache = 0;
            } else {
                self.empty += 1;
                return false;
            }
            self.hits += len as u64;
        }
        self.gets += n as u64;
        true
    }

    /// A cache put of `k` with cache size `size`.
    fn put(&mut self, k: usize, size: usize) {
        self.puts += k as u64;
        if k > size {
            self.ring += k;
            return;
        }
        self.cache += k;
        let flush_at = (flush_threshold(size as u32) as usize).max(size + 1);
        if self.cache >= flush_at {
            self.ring += self.cache - size;
            self.cache = size;
            self.flushes += 1;
        }
    }
}

fn run(count: u32, size: u32, ops: &[Op]) {
    let pool = Pool::new(
        PoolConfig::new("model", 16, count)
            .cache_size(size)
            .no_huge(),
    )
    .unwrap();
    let mut cache = pool.cache();
    let size = size as usize;
    let mut m = Model {
        ring: count as usize,
        ..Model::default()
    };
    let mut held: Vec<ObjId> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Get(n) => {
                let mut out = vec![ObjId::default(); n];
                let ok = cache.get_bulk(&mut out).is_ok();
                assert_eq!(ok, m.get(n, size), "step {step}: {op:?} with {m:?}");
                if ok {
                    held.extend(out);
                }
            }
            Op::Put(k) => {
                let k = k.min(held.len());
                let ids = held.split_off(held.len() - k);
                // SAFETY: held ids came from this pool and are put once.
                unsafe { cache.put_bulk(&ids) };
                m.put(k, size);
            }
            Op::RingGet(n) => {
                let mut out = vec![ObjId::default(); n];
                let ok = pool.get_bulk(&mut out).is_ok();
                assert_eq!(ok, m.ring >= n, "step {step}: {op:?} with {m:?}");
                if ok {
                    m.ring -= n;
                    m.gets += n as u64;
                    held.extend(out);
                } else {
                    m.empty += 1;
                }
            }
            Op::RingPut(k) => {
                let k = k.min(held.len());
                let ids = held.split_off(held.len() - k);
                // SAFETY: as above.
                unsafe { pool.put_bulk(&ids) };
                m.ring += k;
                m.puts += k as u64;
            }
            Op::Flush => {
                cache.flush();
                m.ring += m.cache;
                m.cache = 0;
            }
        }
        cache.publish_stats();
        let s = pool.stats();
        let actual = Model {
            cache: cache.len(),
            ring: pool.in_ring(),
            gets: s.gets,
            puts: s.puts,
            hits: s.cache_hits,
            empty: s.empty,
            refills: s.refills,
            flushes: s.flushes,
        };
        assert_eq!(actual, m, "step {step}: after {op:?}");
        assert_eq!(m.cache + m.ring + held.len(), count as usize);
        assert_eq!(pool.available(), m.cache + m.ring);
        let unique: HashSet<u32> = held.iter().map(|id| id.index()).collect();
        assert_eq!(
            unique.len(),
            held.len(),
            "step {step}: an object is held twice"
        );
    }
    drop(cache);
    // SAFETY: as above.
    unsafe { pool.put_bulk(&held) };
    assert_eq!(pool.in_ring(), count as usize);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn cache_follows_the_dpdk_rules(
        // Size 0 is the pass-through port; counts start at the flush threshold.
        (count, size) in (0u32..=12).prop_flat_map(|size| {
            (flush_threshold(size).max(1)..=120u32, Just(size))
        }),
        ops in proptest::collection::vec(op(), 1..150),
    ) {
        run(count, size, &ops);
    }
}
