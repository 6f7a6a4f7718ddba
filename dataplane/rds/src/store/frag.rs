//! Message bytes: a fixed set of 4 KiB fragment buffers in one `mempool` region.
//!
//! Fragment `i` is bytes `i * 4096 .. (i + 1) * 4096` of the region, for the pool's life. A
//! message's payload is a chain of fragments (an intrusive singly linked list through the
//! `next` table), so fragment `k` of a message is exactly wire fragment `k` on a message
//! transport: a fabric transport registers the region once and posts each wire fragment as
//! one scatter entry pointing into it (no copy), a stream transport writes the chain.
//!
//! The pool is sized once ([`FragPool::new`]) and never grows: it is the engine's hard
//! bound on message memory. Sends may take fragments only while more than `rx_reserve`
//! remain, so queued sends can never take the last buffers the receive path needs to
//! make progress (and acks arrive in received frames).

use std::sync::Arc;

use mempool::memory::{HugePolicy, MemError, Region, RegionConfig};

use crate::wire::FRAG_SIZE;

/// "No fragment" in links and chain ends.
const NIL: u32 = u32::MAX;

/// A fragment buffer's index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FragId(pub u32);

impl FragId {
    /// Offset of the fragment's first byte in the pool's region.
    pub const fn offset(self) -> usize {
        self.0 as usize * FRAG_SIZE
    }
}

/// A message's fragments, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chain {
    head: u32,
    tail: u32,
    count: u32,
}

impl Chain {
    /// No fragments.
    pub const EMPTY: Self = Self {
        head: NIL,
        tail: NIL,
        count: 0,
    };

    /// Number of fragments.
    pub const fn count(&self) -> u32 {
        self.count
    }

    /// True if the chain has no fragment.
    pub const fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The first fragment.
    pub fn first(&self) -> Option<FragId> {
        (self.head != NIL).then_some(FragId(self.head))
    }

    /// The last fragment.
    pub fn last(&self) -> Option<FragId> {
        (self.tail != NIL).then_some(FragId(self.tail))
    }
}

impl Default for Chain {
    fn default() -> Self {
        Self::EMPTY
    }
}

/// Where the fragment buffers live, and how to allocate them.
#[derive(Clone, Debug)]
pub struct FragConfig {
    /// Number of 4 KiB fragments (the bound on message memory).
    pub count: u32,
    /// Fragments kept for the receive path: sends fail with `ENOMEM` rather than take them.
    pub rx_reserve: u32,
    /// Hugepage policy of the region.
    pub huge: HugePolicy,
    /// Back the region with a memfd a peer process can map (for a shared-memory transport).
    pub shareable: bool,
}

impl Default for FragConfig {
    fn default() -> Self {
        Self {
            count: 16 * 1024,
            rx_reserve: 1024,
            huge: HugePolicy::Auto,
            shareable: false,
        }
    }
}

/// The fragment pool.
pub struct FragPool {
    region: Arc<Region>,
    next: Vec<u32>,
    free: Vec<u32>,
    rx_reserve: u32,
    ctrl_reserve: u32,
    low_water: u32,
}

/// Fragments the receive path leaves free for the engine's control messages (a
/// congestion-map update takes two), at most a sixteenth of the pool: a receiver whose
/// store filled must still be able to tell its peers that it is congested.
pub const CTRL_RESERVE_FRAGS: u32 = 16;

impl core::fmt::Debug for FragPool {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("FragPool")
            .field("count", &self.next.len())
            .field("free", &self.free.len())
            .field("rx_reserve", &self.rx_reserve)
            .finish()
    }
}

impl FragPool {
    /// Allocates the region (pre-faulted, locked when the memlock limit allows) and the
    /// tables; nothing allocates afterwards.
    ///
    /// # Errors
    ///
    /// The region could not be created (see [`MemError`]).
    pub fn new(name: &str, cfg: &FragConfig) -> Result<Self, MemError> {
        let count = cfg.count.max(1);
        let rcfg = RegionConfig::new(name, count as usize * FRAG_SIZE)
            .huge(cfg.huge)
            .shareable(cfg.shareable)
            .quiet();
        let region = Arc::new(Region::new(&rcfg)?);
        Ok(Self {
            region,
            next: vec![NIL; count as usize],
            free: (0..count).rev().collect(),
            rx_reserve: cfg.rx_reserve.min(count / 2),
            ctrl_reserve: CTRL_RESERVE_FRAGS.min(count / 16),
            low_water: count,
        })
    }

    /// The region holding every fragment (register it with a fabric once).
    pub fn region(&self) -> &Arc<Region> {
        &self.region
    }

    /// Fragments in the pool.
    pub fn count(&self) -> u32 {
        self.next.len() as u32
    }

    /// Fragments free now.
    pub fn available(&self) -> u32 {
        self.free.len() as u32
    }

    /// The fewest fragments that were ever free at once.
    pub fn low_water(&self) -> u32 {
        self.low_water
    }

    /// Fragments a send of `n` fragments may take: true if `n` are free beyond the receive
    /// reserve.
    pub fn can_send(&self, n: u32) -> bool {
        self.available() >= n.saturating_add(self.rx_reserve)
    }

    fn note_low(&mut self) {
        self.low_water = self.low_water.min(self.free.len() as u32);
    }

    /// Takes `n` fragments as a chain for a send, all or nothing, respecting the receive
    /// reserve.
    pub fn alloc_tx(&mut self, n: u32) -> Option<Chain> {
        if !self.can_send(n) {
            return None;
        }
        self.alloc_chain(n)
    }

    /// Takes `n` fragments as a chain, all or nothing, from the whole pool.
    pub fn alloc_chain(&mut self, n: u32) -> Option<Chain> {
        if self.available() < n {
            return None;
        }
        let mut chain = Chain::EMPTY;
        for _ in 0..n {
            let f = self.free.pop()?;
            self.push_back(&mut chain, FragId(f));
        }
        self.note_low();
        Some(chain)
    }

    /// True if [`append_one`](Self::append_one) would take a fragment now.
    pub fn can_append(&self) -> bool {
        self.available() > self.ctrl_reserve
    }

    /// Takes one fragment and appends it to `chain` (the receive path, fragment by
    /// fragment). `None` if only the control reserve ([`CTRL_RESERVE_FRAGS`]) is left.
    pub fn append_one(&mut self, chain: &mut Chain) -> Option<FragId> {
        if !self.can_append() {
            return None;
        }
        let f = FragId(self.free.pop()?);
        self.push_back(chain, f);
        self.note_low();
        Some(f)
    }

    fn push_back(&mut self, chain: &mut Chain, f: FragId) {
        self.next[f.0 as usize] = NIL;
        if chain.tail == NIL {
            chain.head = f.0;
        } else {
            self.next[chain.tail as usize] = f.0;
        }
        chain.tail = f.0;
        chain.count += 1;
    }

    /// Returns every fragment of `chain` to the pool and empties it.
    pub fn free_chain(&mut self, chain: &mut Chain) {
        let mut f = chain.head;
        while f != NIL {
            let n = self.next[f as usize];
            self.next[f as usize] = NIL;
            self.free.push(f);
            f = n;
        }
        *chain = Chain::EMPTY;
    }

    /// The chain's fragments, in order.
    pub fn iter(&self, chain: &Chain) -> ChainIter<'_> {
        ChainIter {
            next: &self.next,
            at: chain.head,
            left: chain.count,
        }
    }

    /// Fragment `k` of the chain (walks the chain; `None` past its end).
    pub fn nth(&self, chain: &Chain, k: u32) -> Option<FragId> {
        self.iter(chain).nth(k as usize)
    }

    /// Copies `src` into fragment `f` at `off`.
    ///
    /// # Panics
    ///
    /// If `off + src.len()` exceeds 4096 (a caller bug).
    pub fn write(&self, f: FragId, off: usize, src: &[u8]) {
        assert!(off + src.len() <= FRAG_SIZE, "write past a fragment");
        self.region.copy_in(f.offset() + off, src);
    }

    /// Copies bytes of fragment `f` at `off` into `dst`.
    ///
    /// # Panics
    ///
    /// If `off + dst.len()` exceeds 4096 (a caller bug).
    pub fn read(&self, f: FragId, off: usize, dst: &mut [u8]) {
        assert!(off + dst.len() <= FRAG_SIZE, "read past a fragment");
        self.region.copy_out(f.offset() + off, dst);
    }

    /// Copies `src` into a chain that holds at least `src.len()` bytes, fragment by fragment.
    pub fn write_chain(&self, chain: &Chain, src: &[u8]) {
        for (f, part) in self.iter(chain).zip(src.chunks(FRAG_SIZE)) {
            self.write(f, 0, part);
        }
    }

    /// Copies the first `dst.len()` bytes of a chain into `dst`, skipping `skip` bytes.
    pub fn read_chain(&self, chain: &Chain, skip: usize, dst: &mut [u8]) {
        let mut done = 0;
        let mut pos = 0;
        for f in self.iter(chain) {
            if done == dst.len() {
                break;
            }
            let end = pos + FRAG_SIZE;
            if end > skip {
                let from = skip.saturating_sub(pos);
                let n = (FRAG_SIZE - from).min(dst.len() - done);
                self.read(f, from, &mut dst[done..done + n]);
                done += n;
            }
            pos = end;
        }
    }
}

/// Iterator over a chain's fragments.
#[derive(Debug)]
pub struct ChainIter<'a> {
    next: &'a [u32],
    at: u32,
    left: u32,
}

impl Iterator for ChainIter<'_> {
    type Item = FragId;

    fn next(&mut self) -> Option<FragId> {
        if self.left == 0 || self.at == NIL {
            return None;
        }
        let f = self.at;
        self.at = self.next[f as usize];
        self.left -= 1;
        Some(FragId(f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(n: u32, reserve: u32) -> FragPool {
        FragPool::new(
            "rds-frag-test",
            &FragConfig {
                count: n,
                rx_reserve: reserve,
                huge: HugePolicy::Never,
                shareable: false,
            },
        )
        .unwrap()
    }

    #[test]
    fn test_frag_chain_write_read_and_free() {
        let mut p = pool(8, 0);
        let c = p.alloc_tx(3).unwrap();
        assert_eq!(p.available(), 5);
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        p.write_chain(&c, &data);
        let mut back = vec![0u8; 10_000];
        p.read_chain(&c, 0, &mut back);
        assert_eq!(back, data);
        let mut tail = vec![0u8; 5000];
        p.read_chain(&c, 5000, &mut tail);
        assert_eq!(tail, &data[5000..]);
        let mut c = c;
        p.free_chain(&mut c);
        assert_eq!(p.available(), 8);
        assert!(c.is_empty());
    }

    #[test]
    fn test_frag_alloc_is_all_or_nothing_and_keeps_the_rx_reserve() {
        let mut p = pool(8, 3);
        assert!(p.alloc_tx(6).is_none(), "6 + 3 reserved > 8");
        assert_eq!(p.available(), 8, "nothing taken");
        let mut a = p.alloc_tx(5).unwrap();
        assert!(p.alloc_tx(1).is_none(), "only the reserve is left");
        let mut rx = Chain::EMPTY;
        for _ in 0..3 {
            p.append_one(&mut rx).unwrap();
        }
        assert!(p.append_one(&mut rx).is_none());
        assert_eq!(rx.count(), 3);
        assert_eq!(p.low_water(), 0);
        p.free_chain(&mut a);
        p.free_chain(&mut rx);
        assert_eq!(p.available(), 8);
    }

    #[test]
    fn test_frag_receive_leaves_the_control_reserve_for_a_map_update() {
        let mut p = pool(64, 0);
        let mut rx = Chain::EMPTY;
        while p.append_one(&mut rx).is_some() {}
        assert_eq!(
            p.available(),
            64 / 16,
            "the receive path stops at the reserve"
        );
        assert!(!p.can_append());
        let mut map = p
            .alloc_chain(2)
            .expect("a congestion-map update still fits");
        p.free_chain(&mut map);
        p.free_chain(&mut rx);
        assert_eq!(p.available(), 64);
    }
}
