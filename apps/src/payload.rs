//! Payload bytes: the patterns generators write and consumers check, market-data ticks, and
//! access to payloads held in mempool pools.

use std::sync::Arc;

use mempool::pool::{Empty, ObjId, Pool, PoolCache};

use crate::msg::{Msg, Pattern};

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

fn random_seed(flow: u16, seq: u64) -> u64 {
    (seq ^ (u64::from(flow) << 48)).wrapping_mul(GOLDEN) | 1
}

/// One step of xorshift64*.
#[inline]
fn xorshift(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    x.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

/// Writes the payload of message (`flow`, `seq`) with `pattern` into `buf`.
pub fn fill(pattern: Pattern, flow: u16, seq: u64, buf: &mut [u8]) {
    match pattern {
        Pattern::Zeros | Pattern::Ticks => buf.fill(0),
        Pattern::Counter => {
            let base = seq as u8;
            for (i, b) in buf.iter_mut().enumerate() {
                *b = base.wrapping_add(i as u8);
            }
        }
        Pattern::Random => {
            let mut s = random_seed(flow, seq);
            let mut chunks = buf.chunks_exact_mut(8);
            for c in &mut chunks {
                c.copy_from_slice(&xorshift(&mut s).to_le_bytes());
            }
            let rest = chunks.into_remainder();
            let n = rest.len();
            rest.copy_from_slice(&xorshift(&mut s).to_le_bytes()[..n]);
        }
    }
}

/// Whether `buf` is the payload of message (`flow`, `seq`) with `pattern`.
pub fn check(pattern: Pattern, flow: u16, seq: u64, buf: &[u8]) -> bool {
    match pattern {
        Pattern::Zeros | Pattern::Ticks => buf.iter().all(|&b| b == 0),
        Pattern::Counter => {
            let base = seq as u8;
            buf.iter()
                .enumerate()
                .all(|(i, &b)| b == base.wrapping_add(i as u8))
        }
        Pattern::Random => {
            let mut s = random_seed(flow, seq);
            let mut chunks = buf.chunks_exact(8);
            for c in &mut chunks {
                if c != xorshift(&mut s).to_le_bytes() {
                    return false;
                }
            }
            let rest = chunks.remainder();
            rest == &xorshift(&mut s).to_le_bytes()[..rest.len()]
        }
    }
}

/// Whether the header fields of a tick make sense: a positive price and a size in round
/// lots of 100.
pub fn tick_ok(word: u64) -> bool {
    let price = word as u32;
    let size = (word >> 32) as u32;
    price > 0 && size > 0 && size.is_multiple_of(100)
}

/// A market-data feed: `symbols` instruments whose prices take small random steps.
#[derive(Debug, Clone)]
pub struct TickSource {
    prices: Vec<u32>,
    rng: u64,
}

impl TickSource {
    /// A feed of `symbols` instruments (at least 1), deterministic for a given `seed`.
    pub fn new(symbols: u32, seed: u64) -> Self {
        Self {
            prices: (0..symbols.max(1)).map(|i| 10_000 + 37 * i).collect(),
            rng: seed.wrapping_mul(GOLDEN) | 1,
        }
    }

    /// The next tick: symbol id and the packed header word (price in cents, size << 32).
    #[inline]
    pub fn next_tick(&mut self) -> (u32, u64) {
        let r = xorshift(&mut self.rng);
        let sym = (r % self.prices.len() as u64) as usize;
        let step = ((r >> 20) % 5) as i64 - 2;
        let p = &mut self.prices[sym];
        *p = (i64::from(*p) + step).max(100) as u32;
        let size = 100 * (1 + ((r >> 40) % 10) as u32);
        (sym as u32, u64::from(*p) | (u64::from(size) << 32))
    }
}

/// Per-stage access to the payload pools: one cache per pool (a stage runs on one lcore, so
/// its caches are per-lcore caches in DPDK's sense).
pub struct Payloads {
    pools: Vec<Arc<Pool>>,
    caches: Vec<PoolCache>,
}

impl std::fmt::Debug for Payloads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Payloads")
            .field("pools", &self.pools.len())
            .finish()
    }
}

impl Payloads {
    /// Caches on `pools`; message `pool` byte `i + 1` names `pools[i]`.
    pub fn new(pools: &[Arc<Pool>]) -> Self {
        Self {
            pools: pools.to_vec(),
            caches: pools.iter().map(Pool::cache).collect(),
        }
    }

    /// Fills `out` with free objects of pool byte `pool` (all or nothing).
    ///
    /// # Errors
    ///
    /// [`Empty`] if the pool cannot supply them now.
    #[inline]
    pub fn alloc(&mut self, pool: u8, out: &mut [ObjId]) -> Result<(), Empty> {
        self.caches[usize::from(pool) - 1].get_bulk(out)
    }

    /// The payload bytes of `m` (`m.payload_len()` of them), writable.
    ///
    /// # Safety
    ///
    /// `m.pool != 0`, `m.obj` was allocated from that pool through these `Payloads` or
    /// another stage's and not freed since, and the caller holds the only descriptor of it
    /// (see the ownership rule in [`crate::msg`]): nobody else reads or writes the object.
    #[inline]
    pub unsafe fn bytes_mut(&mut self, m: &Msg) -> &mut [u8] {
        let pool = &self.pools[usize::from(m.pool) - 1];
        let len = m.payload_len().min(pool.obj_size());
        let p = pool.addr(m.obj);
        // SAFETY: the object is `obj_size` bytes at `p`, inside the pool's mapping that
        // `self.pools` keeps alive; the caller owns it exclusively (contract above).
        unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), len) }
    }

    /// The payload bytes of `m`.
    ///
    /// # Safety
    ///
    /// As for [`bytes_mut`](Self::bytes_mut).
    #[inline]
    pub unsafe fn bytes(&self, m: &Msg) -> &[u8] {
        let pool = &self.pools[usize::from(m.pool) - 1];
        let len = m.payload_len().min(pool.obj_size());
        let p = pool.addr(m.obj);
        // SAFETY: as in `bytes_mut`; shared access while the caller owns the object.
        unsafe { std::slice::from_raw_parts(p.as_ptr(), len) }
    }

    /// Gives the payload object of `m` back to its pool (a no-op without one).
    ///
    /// # Safety
    ///
    /// As for [`bytes_mut`](Self::bytes_mut); afterwards no copy of `m` may be used for its
    /// payload.
    #[inline]
    pub unsafe fn free(&mut self, m: &Msg) {
        if m.pool != 0 {
            // SAFETY: the caller owns the object, which came from this pool (contract above),
            // and gives it up here.
            unsafe { self.caches[usize::from(m.pool) - 1].put(m.obj) };
        }
    }

    /// A copy of `m` with its own payload object holding the same bytes (`m` itself when it
    /// has no pool payload).
    ///
    /// # Errors
    ///
    /// [`Empty`] if the pool has no free object.
    ///
    /// # Safety
    ///
    /// As for [`bytes_mut`](Self::bytes_mut) for `m`.
    #[inline]
    pub unsafe fn duplicate(&mut self, m: &Msg) -> Result<Msg, Empty> {
        if m.pool == 0 {
            return Ok(*m);
        }
        let mut id = [ObjId::default()];
        self.alloc(m.pool, &mut id)?;
        let copy = Msg { obj: id[0], ..*m };
        let pool = &self.pools[usize::from(m.pool) - 1];
        let len = m.payload_len().min(pool.obj_size());
        let src = pool.addr(m.obj);
        let dst = pool.addr(id[0]);
        // SAFETY: both objects are `obj_size >= len` bytes in the live pool mapping; `src`
        // is owned by the caller, `dst` was just allocated, and they are distinct objects, so
        // the ranges do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_ptr(), len) };
        Ok(copy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_check_what_they_fill() {
        for p in [
            Pattern::Zeros,
            Pattern::Counter,
            Pattern::Random,
            Pattern::Ticks,
        ] {
            for len in [0usize, 1, 7, 8, 9, 100, 1460] {
                let mut b = vec![0xAAu8; len];
                fill(p, 3, 12345, &mut b);
                assert!(check(p, 3, 12345, &b), "{p:?} {len}");
                if len > 0 {
                    b[len / 2] ^= 0x40;
                    assert!(!check(p, 3, 12345, &b), "{p:?} {len}: a flipped bit passed");
                }
            }
        }
        // Different messages have different random payloads.
        let (mut a, mut b) = ([0u8; 64], [0u8; 64]);
        fill(Pattern::Random, 0, 1, &mut a);
        fill(Pattern::Random, 0, 2, &mut b);
        assert_ne!(a, b);
    }

    #[test]
    fn ticks_are_plausible() {
        let mut t = TickSource::new(8, 1);
        for _ in 0..10_000 {
            let (sym, word) = t.next_tick();
            assert!(sym < 8);
            assert!(tick_ok(word), "{word:#x}");
        }
    }

    #[test]
    fn pool_payloads_copy_and_free() {
        let pool = Pool::new(mempool::pool::PoolConfig::new("t", 256, 64).no_huge()).unwrap();
        let mut p = Payloads::new(std::slice::from_ref(&pool));
        let mut id = [ObjId::default()];
        p.alloc(1, &mut id).unwrap();
        let m = Msg {
            len: 200,
            pool: 1,
            obj: id[0],
            pattern: Pattern::Counter,
            seq: 5,
            ..Msg::default()
        };
        // SAFETY: `m` owns the object just allocated.
        fill(Pattern::Counter, 0, 5, unsafe { p.bytes_mut(&m) });
        // SAFETY: as above.
        let c = unsafe { p.duplicate(&m) }.unwrap();
        assert_ne!(c.obj, m.obj);
        // SAFETY: `c` owns its copy.
        assert!(check(Pattern::Counter, 0, 5, unsafe { p.bytes(&c) }));
        // SAFETY: each descriptor is freed once.
        unsafe {
            p.free(&m);
            p.free(&c);
        }
        drop(p);
        assert_eq!(pool.available(), 64);
    }
}
