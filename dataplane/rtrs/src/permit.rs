//! Permits: the client's credits for the server's chunks.
//!
//! A session has `queue_depth` chunks on the server, and a permit *is* a chunk: permit `i`
//! may place one request in chunk `i`, on whichever path carries it (Linux
//! `rtrs_clt_get_permit`, `__rtrs_get_permit`). So at most `queue_depth` requests are in
//! flight per session, across all its paths, and a request that fails over keeps its permit
//! and its chunk.
//!
//! [`Permits`] is a lock-free bitmap shared by every lcore that submits IO through the
//! session: a get finds a zero bit and sets it with an atomic `fetch_or` (retrying if another
//! lcore set it first), a put clears it with `fetch_and`. No lock, no allocation, no system
//! call. Each 64-bit word of the bitmap sits on its own 128-byte line, and a getter starts its
//! search at the word of its lane (lcore), so lcores that take and return permits in steady
//! state do not share lines.
//!
//! A chunk can be **fenced** by the session: a fenced permit that its holder returns stays
//! taken ("parked") until the session unfences it. The session fences the chunk of every
//! request it fails over from a dead path: that path's server may still be working in the
//! chunk (the chunk is the same memory on all paths), so after the failed-over copy
//! completes the chunk must not carry another request until the dead path's server side is
//! known to be done with it (see [`ClientSession`](crate::clt::ClientSession), "Failover").
//!
//! Two modes, as in Linux ([`Wait`]): `NoWait` returns `None` when every permit is taken;
//! `Wait` spins until one is returned (on an lcore that is the run-to-completion analogue of
//! Linux's uninterruptible sleep: use it only where blocking the loop is acceptable, such as
//! an admin request from a control thread; the data path uses `NoWait` and requeues).
//!
//! # Orderings
//!
//! * **A1** (`fetch_or`, `Acquire`, in [`Permits::get`]) pairs with **R1** (`fetch_and`,
//!   `Release`, in [`Permits::put`]): everything the previous holder of a permit did with it
//!   (its chunk's request slot, the user area of the request) happens-before the new holder
//!   sees the permit as its own.
//! * The scan that picks a candidate bit is a `Relaxed` load: it is only a hint; the
//!   `fetch_or` decides, and a stale hint costs one retry.
//! * The in-use counter is `Relaxed`: statistics only.
//! * **Fences** ([`Permits::fence`], [`Permits::unfence`]) keep a chunk out of use after its
//!   holder returns it. `put` of a fenced permit sets its bit in `parked` and then looks at
//!   `fenced` again; `unfence` clears `fenced` and then `parked`. All four are `SeqCst`, so
//!   the two cannot miss each other: if the put still sees the fence, the unfence comes
//!   later and finds the parked bit; otherwise both race to clear the parked bit and the one
//!   that clears it frees the permit (R1), exactly once.
//!
//! `tests/loom_permits.rs` model-checks exclusivity (no permit has two holders), that puts
//! publish the holder's writes, and that a waiter is woken by a put.

use crate::sync::{AtomicU32, AtomicU64, Ordering, spin_loop, yield_now};

/// What a permit is for: the connection its request goes on (`enum rtrs_clt_con_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConType {
    /// `RTRS_ADMIN_CON`: connection 0 of the path (RNBD's session info and open).
    Admin,
    /// `RTRS_IO_CON`: an IO connection, chosen by the permit's lane.
    Io,
}

/// Whether [`Permits::get`] waits for a permit when all are taken (`enum wait_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Wait {
    /// `RTRS_PERMIT_NOWAIT`: return `None`.
    NoWait,
    /// `RTRS_PERMIT_WAIT`: spin (then yield) until one is returned.
    Wait,
}

/// One permit: the right to place one request in chunk [`id`](Permit::id).
///
/// Not `Clone`: exactly one holder. Give it back with [`Permits::put`]; a permit that is
/// dropped instead is lost to the session until it is closed.
#[must_use = "a permit must be returned with Permits::put"]
#[derive(Debug, PartialEq, Eq)]
pub struct Permit {
    id: u16,
    con: ConType,
    lane: u16,
    pool: u32,
}

impl Permit {
    /// The chunk index (`mem_id`).
    #[inline]
    pub const fn id(&self) -> u16 {
        self.id
    }

    /// The connection type it was taken for.
    #[inline]
    pub const fn con_type(&self) -> ConType {
        self.con
    }

    /// The lane (lcore) that took it: an IO permit's request goes on IO connection
    /// `lane % io_connections + 1` (Linux: `cpu_id % (irq_con_num - 1) + 1`).
    #[inline]
    pub const fn lane(&self) -> u16 {
        self.lane
    }

    /// The tag of the pool it came from.
    #[inline]
    pub const fn pool(&self) -> u32 {
        self.pool
    }
}

/// A 64-bit bitmap word on a line of its own (128 bytes: x86 prefetches line pairs).
#[repr(align(128))]
#[derive(Debug)]
struct Word(AtomicU64);

/// The permit bitmap of one session (see the module doc).
#[derive(Debug)]
pub struct Permits {
    words: Box<[Word]>,
    fenced: Box<[Word]>,
    parked: Box<[Word]>,
    depth: u16,
    pool: u32,
    in_use: AtomicU32,
}

/// Spins of a waiting get before each yield.
const SPINS_PER_YIELD: u32 = 64;

impl Permits {
    /// A bitmap of `depth` free permits, tagged `pool` (the session checks that the permits
    /// it is given are its own).
    ///
    /// # Panics
    /// If `depth` is 0 (a session always has a queue depth of at least 1).
    pub fn new(depth: u16, pool: u32) -> Self {
        assert!(depth > 0, "a permit pool needs at least one permit");
        let n = usize::from(depth).div_ceil(64);
        let words: Box<[Word]> = (0..n)
            .map(|i| {
                // Bits past `depth` in the last word are permanently taken.
                let first = i * 64;
                let valid = (usize::from(depth) - first).min(64);
                let taken = if valid == 64 { 0 } else { !0u64 << valid };
                Word(AtomicU64::new(taken))
            })
            .collect();
        let zero = || (0..n).map(|_| Word(AtomicU64::new(0))).collect();
        Self {
            words,
            fenced: zero(),
            parked: zero(),
            depth,
            pool,
            in_use: AtomicU32::new(0),
        }
    }

    /// Permits in the pool (the queue depth).
    #[inline]
    pub const fn depth(&self) -> u16 {
        self.depth
    }

    /// The pool's tag.
    #[inline]
    pub const fn pool(&self) -> u32 {
        self.pool
    }

    /// Permits currently taken (a statistic: it may lag concurrent gets and puts).
    #[inline]
    pub fn in_use(&self) -> u32 {
        self.in_use.load(Ordering::Relaxed)
    }

    /// True if permit `id` is currently taken.
    pub fn is_taken(&self, id: u16) -> bool {
        if id >= self.depth {
            return false;
        }
        let (w, bit) = (usize::from(id) / 64, id % 64);
        // Relaxed: a snapshot for checks and statistics, not a synchronisation point.
        self.words[w].0.load(Ordering::Relaxed) & (1 << bit) != 0
    }

    /// One attempt over the whole bitmap, starting at the lane's word.
    fn try_take(&self, lane: u16) -> Option<u16> {
        let n = self.words.len();
        let start = usize::from(lane) % n;
        for k in 0..n {
            let w = (start + k) % n;
            let word = &self.words[w].0;
            // Relaxed: only a hint; the fetch_or below decides.
            let mut cur = word.load(Ordering::Relaxed);
            while cur != !0 {
                let bit = (!cur).trailing_zeros();
                let mask = 1u64 << bit;
                // A1: Acquire, pairs with R1 in `put`: the previous holder's use of this
                // permit happens-before ours.
                let old = word.fetch_or(mask, Ordering::Acquire);
                if old & mask == 0 {
                    self.in_use.fetch_add(1, Ordering::Relaxed);
                    return Some((w * 64) as u16 + bit as u16);
                }
                cur = old;
            }
        }
        None
    }

    /// Takes a permit for a request on a `con` connection, from lane `lane`. With
    /// [`Wait::NoWait`] returns `None` when every permit is taken; with [`Wait::Wait`] spins
    /// and yields until one is returned.
    pub fn get(&self, con: ConType, lane: u16, wait: Wait) -> Option<Permit> {
        let mut spins = 0u32;
        loop {
            if let Some(id) = self.try_take(lane) {
                return Some(Permit {
                    id,
                    con,
                    lane,
                    pool: self.pool,
                });
            }
            if wait == Wait::NoWait {
                return None;
            }
            spins += 1;
            if cfg!(loom) || spins.is_multiple_of(SPINS_PER_YIELD) {
                yield_now();
            } else {
                spin_loop();
            }
        }
    }

    /// Returns a permit (`rtrs_clt_put_permit`).
    ///
    /// # Panics
    /// If the permit is not from this pool or is not taken (a double put): both are bugs of
    /// the caller, which holds permits by value.
    pub fn put(&self, p: Permit) {
        assert_eq!(p.pool, self.pool, "permit returned to the wrong pool");
        let (w, bit) = (usize::from(p.id) / 64, p.id % 64);
        let mask = 1u64 << bit;
        assert!(
            self.words[w].0.load(Ordering::Relaxed) & mask != 0,
            "permit {} returned twice",
            p.id
        );
        // The fence protocol of the module doc: park, then look at the fence again.
        if self.fenced[w].0.load(Ordering::SeqCst) & mask != 0 {
            self.parked[w].0.fetch_or(mask, Ordering::SeqCst);
            if self.fenced[w].0.load(Ordering::SeqCst) & mask != 0 {
                return; // `unfence` frees it
            }
            if self.parked[w].0.fetch_and(!mask, Ordering::SeqCst) & mask == 0 {
                return; // `unfence` took the parked bit and freed it
            }
        }
        self.free(w, mask);
    }

    /// Clears a taken bit (R1).
    fn free(&self, w: usize, mask: u64) {
        // R1: Release, pairs with A1 in `try_take`: our use of the permit happens-before the
        // next holder's.
        let old = self.words[w].0.fetch_and(!mask, Ordering::Release);
        debug_assert!(old & mask != 0, "a free permit freed again");
        self.in_use.fetch_sub(1, Ordering::Relaxed);
    }

    /// Keeps chunk `id` out of use once it is returned: a [`put`](Self::put) of it parks
    /// it (it stays taken) until [`unfence`](Self::unfence). Call it while the permit is
    /// taken. Out-of-range ids are ignored.
    pub fn fence(&self, id: u16) {
        if id < self.depth {
            let (w, bit) = (usize::from(id) / 64, id % 64);
            self.fenced[w].0.fetch_or(1 << bit, Ordering::SeqCst);
        }
    }

    /// Lifts the fence of chunk `id`; if it was returned meanwhile it becomes free now.
    pub fn unfence(&self, id: u16) {
        if id >= self.depth {
            return;
        }
        let (w, bit) = (usize::from(id) / 64, id % 64);
        let mask = 1u64 << bit;
        self.fenced[w].0.fetch_and(!mask, Ordering::SeqCst);
        if self.parked[w].0.fetch_and(!mask, Ordering::SeqCst) & mask != 0 {
            self.free(w, mask);
        }
    }

    /// True if chunk `id` is fenced.
    pub fn is_fenced(&self, id: u16) -> bool {
        id < self.depth
            && self.fenced[usize::from(id) / 64].0.load(Ordering::Relaxed) & (1 << (id % 64)) != 0
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn test_permit_nowait_exhausts() {
        let p = Permits::new(70, 9);
        let mut got: Vec<Permit> = (0..70)
            .map(|_| p.get(ConType::Io, 0, Wait::NoWait).unwrap())
            .collect();
        let mut ids: Vec<u16> = got.iter().map(Permit::id).collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..70).collect::<Vec<_>>(), "every chunk exactly once");
        assert!(
            p.get(ConType::Io, 3, Wait::NoWait).is_none(),
            "NOWAIT: none left"
        );
        assert_eq!(p.in_use(), 70);
        let back = got.remove(17);
        let id = back.id();
        p.put(back);
        assert!(!p.is_taken(id));
        let again = p.get(ConType::Admin, 5, Wait::NoWait).unwrap();
        assert_eq!(again.id(), id, "the returned permit is the free one");
        assert_eq!(again.con_type(), ConType::Admin);
        assert_eq!(again.lane(), 5);
        got.push(again);
        for g in got {
            p.put(g);
        }
        assert_eq!(p.in_use(), 0);
    }

    #[test]
    fn test_permit_fenced_put_parks_until_unfence() {
        let p = Permits::new(4, 1);
        let a = p.get(ConType::Io, 0, Wait::NoWait).unwrap();
        let id = a.id();
        p.fence(id);
        p.put(a);
        assert!(p.is_taken(id), "a fenced permit stays taken after its put");
        let others: Vec<Permit> = (0..3)
            .map(|_| p.get(ConType::Io, 0, Wait::NoWait).unwrap())
            .collect();
        assert!(others.iter().all(|o| o.id() != id));
        assert!(p.get(ConType::Io, 0, Wait::NoWait).is_none(), "parked");
        p.unfence(id);
        assert!(!p.is_taken(id) && !p.is_fenced(id));
        let again = p.get(ConType::Io, 0, Wait::NoWait).unwrap();
        assert_eq!(again.id(), id);
        // Unfenced before the put: the put frees it at once.
        p.fence(id);
        p.unfence(id);
        p.put(again);
        assert!(!p.is_taken(id));
        for o in others {
            p.put(o);
        }
        assert_eq!(p.in_use(), 0);
    }

    #[test]
    fn test_permit_lane_spreads_words() {
        let p = Permits::new(256, 1);
        let a = p.get(ConType::Io, 0, Wait::NoWait).unwrap();
        let b = p.get(ConType::Io, 1, Wait::NoWait).unwrap();
        assert_eq!(a.id() / 64, 0);
        assert_eq!(b.id() / 64, 1, "lane 1 starts at word 1");
        p.put(a);
        p.put(b);
    }

    #[test]
    #[should_panic(expected = "wrong pool")]
    fn test_permit_foreign_pool_refused() {
        let a = Permits::new(4, 1);
        let b = Permits::new(4, 2);
        let p = a.get(ConType::Io, 0, Wait::NoWait).unwrap();
        b.put(p);
    }

    #[test]
    fn test_permit_wait_is_woken_by_put() {
        use std::sync::Arc;
        let p = Arc::new(Permits::new(1, 3));
        let held = p.get(ConType::Io, 0, Wait::NoWait).unwrap();
        let q = Arc::clone(&p);
        let t = std::thread::spawn(move || {
            let got = q.get(ConType::Io, 1, Wait::Wait).unwrap();
            let id = got.id();
            q.put(got);
            id
        });
        std::thread::sleep(std::time::Duration::from_millis(20));
        p.put(held);
        assert_eq!(t.join().unwrap(), 0);
    }

    #[test]
    fn test_permit_threads_never_share() {
        use std::sync::Arc;
        use std::sync::atomic::AtomicU8;
        let p = Arc::new(Permits::new(8, 4));
        let owners: Arc<Vec<AtomicU8>> = Arc::new((0..8).map(|_| AtomicU8::new(0)).collect());
        let ts: Vec<_> = (0..2u16)
            .map(|lane| {
                let (p, owners) = (Arc::clone(&p), Arc::clone(&owners));
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        if let Some(x) = p.get(ConType::Io, lane, Wait::NoWait) {
                            let o = &owners[usize::from(x.id())];
                            assert_eq!(o.swap(1, Ordering::Relaxed), 0, "two holders");
                            o.store(0, Ordering::Relaxed);
                            p.put(x);
                        }
                    }
                })
            })
            .collect();
        for t in ts {
            t.join().unwrap();
        }
        assert_eq!(p.in_use(), 0);
    }
}
