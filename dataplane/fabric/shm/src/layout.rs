//! Layouts of the structures the shm provider places in shared memory, and the lock-free
//! protocols on them.
//!
//! Every structure here lives in a memfd segment mapped by two or more processes, so each is
//! `#[repr(C)]`, holds no pointers, and has its size fixed by a compile-time assertion. Every
//! field another process may access concurrently is an atomic. Segments:
//!
//! * **Key table** (one per protection domain; the owner writes, peers read): one
//!   [`KeyEntry`] per memory region, updated under a seqlock so a reader sees either the old
//!   or the new registration, never a mix. A key is `generation << 20 | index << 8 |
//!   consumer` (12, 12 and 8 bits): the low 8 bits are the consumer key a memory-window
//!   bind chooses (`ibv_inc_rkey` rotates them), and a lookup compares the whole key with
//!   the entry's, so a new generation or a new consumer key revokes every copy of the old
//!   key at once. A memory region's key takes a fresh 20-bit tag (generation and consumer
//!   bits together) at every registration.
//! * **Doorbell** (one per completion queue; peers set bits, the owner clears them): a
//!   two-level bitmap of the queue pairs that have new inbound work.
//! * **Queue-pair segment** (one per RC queue pair; the owner and its one peer write
//!   disjoint fields): the owner's state, its count of posted receives and their lengths
//!   (the peer's credits), the inbound message slots the peer fills, and the bounce buffer
//!   that carries SEND payloads. Its layout and protocol are in module `qpseg`, which
//!   builds on the [`SegHeader`] defined here.
//! * **UD segment** (one per UD queue pair; any process may send): a bounded
//!   multi-producer queue of datagram slots.

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};
use crossbeam_utils::CachePadded;

/// Magic at the start of every segment: `"DPSHMSEG"`.
pub(crate) const SEG_MAGIC: u64 = u64::from_le_bytes(*b"DPSHMSEG");
/// Layout version; bump on any incompatible change.
pub(crate) const SEG_VERSION: u32 = 4;

/// What a segment holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum SegKind {
    /// A protection domain's key table.
    KeyTable = 1,
    /// A completion queue's doorbell.
    Doorbell = 2,
    /// An RC queue pair's inbound side.
    Qp = 3,
    /// A UD queue pair's inbound queue.
    Ud = 4,
}

/// Common header of every segment.
#[repr(C)]
pub(crate) struct SegHeader {
    /// [`SEG_MAGIC`].
    pub magic: u64,
    /// [`SegKind`] as u32.
    pub kind: u32,
    /// [`SEG_VERSION`].
    pub version: u32,
    /// Total segment length in bytes.
    pub len: u64,
    /// Creating context id.
    pub ctx_id: u32,
    /// Reserved, zero.
    pub _reserved: u32,
}
const _: () = assert!(size_of::<SegHeader>() == 32);

impl SegHeader {
    pub(crate) fn new(kind: SegKind, len: usize, ctx_id: u32) -> Self {
        Self {
            magic: SEG_MAGIC,
            kind: kind as u32,
            version: SEG_VERSION,
            len: len as u64,
            ctx_id,
            _reserved: 0,
        }
    }

    /// Checks a peer's header: magic, version, kind and that the mapping covers `len`.
    pub(crate) fn check(&self, kind: SegKind, mapped: usize) -> Result<(), &'static str> {
        if self.magic != SEG_MAGIC {
            return Err("peer segment has a bad magic number");
        }
        if self.version != SEG_VERSION {
            return Err("peer segment has an unsupported layout version");
        }
        if self.kind != kind as u32 {
            return Err("peer segment is of the wrong kind");
        }
        if self.len as usize > mapped {
            return Err("peer segment is larger than its memfd");
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Key table
// ---------------------------------------------------------------------------------------

/// Most memory-region slots a protection domain's key table may have (the key's index
/// bits).
pub(crate) const MAX_KEY_SLOTS: usize = 1 << KEY_INDEX_BITS;
/// Slots of a protection domain's key table unless asked otherwise: 16 KiB of table, small
/// enough for a domain per connection.
pub(crate) const DEFAULT_KEY_SLOTS: usize = 256;
/// Bits of a key that index the table (bits 8..20).
pub(crate) const KEY_INDEX_BITS: u32 = 12;
/// Low bits of a key that are the consumer key (`ibv_inc_rkey` changes only these).
pub(crate) const KEY_CONSUMER_BITS: u32 = 8;
const KEY_INDEX_MASK: u32 = (1 << KEY_INDEX_BITS) - 1;
/// The tag of a key: everything but its index (generation in bits 8..20, consumer key in
/// bits 0..8), 20 bits.
pub(crate) const KEY_TAG_MASK: u32 = (1 << (32 - KEY_INDEX_BITS)) - 1;
const KEY_CONSUMER_MASK: u32 = (1 << KEY_CONSUMER_BITS) - 1;

/// One registration. Written only by the owning process under its protection-domain lock.
#[repr(C, align(64))]
pub(crate) struct KeyEntry {
    /// Seqlock: odd while the owner rewrites the entry.
    seq: AtomicU64,
    /// The key (`generation << 20 | index << 8 | consumer`), 0 when the slot is free or
    /// its window unbound.
    key: AtomicU32,
    /// [`Access`](dp_fabric::Access) bits.
    access: AtomicU32,
    /// Slot of the registration in the owner's export table (`u32::MAX`: not exported,
    /// local only).
    region_slot: AtomicU32,
    _pad: u32,
    /// Virtual address of the first byte in the owner's address space.
    base: AtomicU64,
    /// Length in bytes.
    len: AtomicU64,
    /// Offset of the first byte within the export.
    region_off: AtomicU64,
}
const _: () = assert!(size_of::<KeyEntry>() == 64);

/// A consistent copy of one [`KeyEntry`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KeySnap {
    pub key: u32,
    pub access: u32,
    pub region_slot: u32,
    pub base: u64,
    pub len: u64,
    pub region_off: u64,
}

impl KeySnap {
    /// True if `[addr, addr + len)` lies inside the registration.
    #[inline]
    pub(crate) fn covers(&self, addr: u64, len: u64) -> bool {
        // Both ends are checked arithmetic: the entry may be a peer's.
        addr >= self.base
            && addr
                .checked_add(len)
                .zip(self.base.checked_add(self.len))
                .is_some_and(|(end, limit)| end <= limit)
    }
}

/// Fixed part of a key table; `slots` [`KeyEntry`]s follow it.
#[repr(C)]
pub(crate) struct KeyTableHeader {
    pub hdr: SegHeader,
    /// Number of entries.
    pub slots: u32,
    _pad: [u8; 28],
}
const _: () = assert!(size_of::<KeyTableHeader>() == 64);

/// Bytes of a key table with `slots` entries.
pub(crate) const fn key_table_len(slots: usize) -> usize {
    size_of::<KeyTableHeader>() + slots * size_of::<KeyEntry>()
}

/// Typed access to a mapped key table: header plus its entries.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyTable {
    base: *const u8,
    slots: usize,
}

// SAFETY: entries are reached through atomics only; the mapping is kept alive by the
// view's owner.
unsafe impl Send for KeyTable {}
// SAFETY: as above.
unsafe impl Sync for KeyTable {}

/// Splits a key into (index, tag): the tag is the generation (high 12 bits of the key)
/// over the consumer key (low 8 bits), `generation << 8 | consumer`.
#[inline]
pub(crate) const fn key_parts(key: u32) -> (usize, u32) {
    let index = (key >> KEY_CONSUMER_BITS) & KEY_INDEX_MASK;
    let tag = (key >> (KEY_CONSUMER_BITS + KEY_INDEX_BITS)) << KEY_CONSUMER_BITS
        | (key & KEY_CONSUMER_MASK);
    (index as usize, tag)
}

/// Builds a key from an index and a 20-bit tag (`generation << 8 | consumer`, see
/// [`key_parts`]); tag 0 is never used, so no valid key is 0.
#[inline]
pub(crate) const fn make_key(index: usize, tag: u32) -> u32 {
    let tag = tag & KEY_TAG_MASK;
    (tag >> KEY_CONSUMER_BITS) << (KEY_CONSUMER_BITS + KEY_INDEX_BITS)
        | ((index as u32 & KEY_INDEX_MASK) << KEY_CONSUMER_BITS)
        | (tag & KEY_CONSUMER_MASK)
}

impl KeyTable {
    /// Formats zeroed memory as a table of `slots` entries.
    ///
    /// # Safety
    /// `base` must point to `key_table_len(slots)` writable, zero-filled, 64-aligned bytes
    /// that nobody else has yet and that stay mapped for the life of every view.
    pub(crate) unsafe fn init(base: *mut u8, slots: usize, ctx_id: u32) -> Self {
        debug_assert!(slots <= MAX_KEY_SLOTS);
        let h = base.cast::<KeyTableHeader>();
        // SAFETY: valid, aligned, not yet shared (caller's contract): plain writes.
        unsafe {
            (&raw mut (*h).hdr).write(SegHeader::new(
                SegKind::KeyTable,
                key_table_len(slots),
                ctx_id,
            ));
            (&raw mut (*h).slots).write(slots as u32);
        }
        Self { base, slots }
    }

    /// Validates and views a peer's key table.
    ///
    /// # Safety
    /// `base` must point to `mapped` readable bytes, 64-aligned, that stay mapped for the
    /// life of the view.
    pub(crate) unsafe fn attach(base: *const u8, mapped: usize) -> Result<Self, &'static str> {
        if mapped < size_of::<KeyTableHeader>() {
            return Err("peer key table too small");
        }
        // SAFETY: a header's worth of bytes is mapped (checked above).
        let h = unsafe { &*base.cast::<KeyTableHeader>() };
        h.hdr.check(SegKind::KeyTable, mapped)?;
        let slots = h.slots as usize;
        if slots > MAX_KEY_SLOTS || key_table_len(slots) > mapped {
            return Err("peer key table has an impossible number of entries");
        }
        Ok(Self { base, slots })
    }

    /// Number of entries.
    pub(crate) fn slots(&self) -> usize {
        self.slots
    }

    #[inline]
    fn entry(&self, idx: usize) -> Option<&KeyEntry> {
        if idx >= self.slots {
            return None;
        }
        // SAFETY: idx < slots, and the table's mapping holds `slots` entries after the
        // header (init/attach).
        Some(unsafe {
            &*self
                .base
                .add(size_of::<KeyTableHeader>() + idx * size_of::<KeyEntry>())
                .cast::<KeyEntry>()
        })
    }

    /// Reads the registration `key` names, or `None` if the key is not (or no longer)
    /// registered. Never blocks: an entry being rewritten at this instant reads as invalid,
    /// which is what it is.
    #[inline]
    pub(crate) fn lookup(&self, key: u32) -> Option<KeySnap> {
        let (idx, tag) = key_parts(key);
        if tag == 0 {
            return None;
        }
        let e = self.entry(idx)?;
        for _ in 0..4 {
            // K1: Acquire, pairs with K4 in `publish`/`revoke`: the fields read below are
            // at least as new as this sequence value.
            let s1 = e.seq.load(Ordering::Acquire);
            if s1 & 1 == 1 {
                return None;
            }
            // Relaxed: the seqlock (K1..K3) decides whether these reads are consistent.
            let snap = KeySnap {
                key: e.key.load(Ordering::Relaxed),
                access: e.access.load(Ordering::Relaxed),
                region_slot: e.region_slot.load(Ordering::Relaxed),
                base: e.base.load(Ordering::Relaxed),
                len: e.len.load(Ordering::Relaxed),
                region_off: e.region_off.load(Ordering::Relaxed),
            };
            // K2: Acquire fence: orders the field reads before the re-read of `seq` (K3).
            fence(Ordering::Acquire);
            // K3: Relaxed re-read; if unchanged no write overlapped the reads.
            if e.seq.load(Ordering::Relaxed) == s1 {
                return (snap.key == key).then_some(snap);
            }
        }
        None
    }

    /// Writes a registration into slot `idx`. Only the owner calls this, one writer per
    /// entry at a time: its protection domain's state lock serialises memory-region
    /// entries, its window lock window entries (module `pd`).
    pub(crate) fn publish(&self, idx: usize, snap: &KeySnap) {
        let Some(e) = self.entry(idx) else {
            debug_assert!(false, "publishing key slot {idx} of {}", self.slots);
            return;
        };
        let s = e.seq.load(Ordering::Relaxed);
        // Relaxed store of the odd value, then K5: Release fence so no field write below
        // becomes visible before the odd sequence (pairs with K2 in `lookup`).
        e.seq.store(s | 1, Ordering::Relaxed);
        fence(Ordering::Release);
        e.key.store(snap.key, Ordering::Relaxed);
        e.access.store(snap.access, Ordering::Relaxed);
        e.region_slot.store(snap.region_slot, Ordering::Relaxed);
        e.base.store(snap.base, Ordering::Relaxed);
        e.len.store(snap.len, Ordering::Relaxed);
        e.region_off.store(snap.region_off, Ordering::Relaxed);
        // K4: Release, pairs with K1 in `lookup`: publishes the fields with an even value.
        e.seq.store((s | 1) + 1, Ordering::Release);
    }

    /// Invalidates slot `idx`: every key naming it stops working at once.
    pub(crate) fn revoke(&self, idx: usize) {
        let Some(e) = self.entry(idx) else {
            return;
        };
        let s = e.seq.load(Ordering::Relaxed);
        e.seq.store(s | 1, Ordering::Relaxed);
        fence(Ordering::Release); // K5, as in `publish`.
        e.key.store(0, Ordering::Relaxed);
        // K4: Release, pairs with K1.
        e.seq.store((s | 1) + 1, Ordering::Release);
    }
}

// ---------------------------------------------------------------------------------------
// Doorbell
// ---------------------------------------------------------------------------------------

/// Queue-pair slots per completion queue.
pub(crate) const DOORBELL_SLOTS: usize = 4096;

/// A completion queue's doorbell: bit `i` of word `i / 64` says queue pair slot `i` has new
/// inbound work; bit `w` of `summary` says word `w` may be non-zero.
///
/// `sleepers` and `wake_seq` are the queue's notification (its completion channel): a
/// poller that found nothing announces itself in `sleepers` and sleeps on the futex
/// `wake_seq`; a ringer that sees a sleeper bumps `wake_seq` and wakes it. Peers can write
/// both words: a hostile one can only make this queue's sleeps end early or last until
/// their timeout, or make its own rings slower.
#[repr(C)]
pub(crate) struct Doorbell {
    pub hdr: SegHeader,
    pub(crate) sleepers: AtomicU32,
    pub(crate) wake_seq: AtomicU32,
    _pad: [u8; 88],
    summary: CachePadded<AtomicU64>,
    words: [AtomicU64; DOORBELL_SLOTS / 64],
}
const _: () = assert!(size_of::<Doorbell>() == 128 + 128 + 8 * (DOORBELL_SLOTS / 64));

impl Doorbell {
    /// Writes a fresh header into zeroed memory.
    pub(crate) fn init(&mut self, ctx_id: u32) {
        self.hdr = SegHeader::new(SegKind::Doorbell, size_of::<Self>(), ctx_id);
    }

    /// Marks `slot` as having work. Call after publishing the work (Release).
    ///
    /// Correctness rests on read-modify-writes of one word being totally ordered: either
    /// this `fetch_or` precedes the owner's `swap` of the word (which then sees the bit and,
    /// through D1/D2, the work), or it follows it and finds the word empty, in which case it
    /// also sets the summary bit for the next `take`.
    #[inline]
    pub(crate) fn ring(&self, slot: u32) {
        let w = (slot / 64) as usize % self.words.len();
        let bit = 1u64 << (slot % 64);
        // D1: SeqCst RMW; its Release half pairs with D3 in `take` and publishes the work
        // written before this call; SeqCst for N1 below.
        let prev = self.words[w].fetch_or(bit, Ordering::SeqCst);
        if prev == 0 {
            // D2: Release, pairs with D4 in `take`.
            self.summary.fetch_or(1 << w, Ordering::Release);
        }
        // N1: SeqCst load, pairs with N2 in `arm` (store then load on both sides): either
        // this load sees the sleeper, or the sleeper's poll after its arm sees the work
        // published before D1. On x86 D1 is a locked instruction (a full barrier) and this a
        // plain load; on AArch64 the release RMW orders before this acquire load (RCsc).
        // Sleeps are bounded by their timeout besides. No sleeper: no system call.
        self.wake_sleepers();
    }

    /// Wakes the pollers sleeping on this doorbell, if any announced themselves (N1: see
    /// `ring`). Call after publishing the work they should see.
    #[inline]
    pub(crate) fn wake_sleepers(&self) {
        if self.sleepers.load(Ordering::SeqCst) != 0 {
            self.wake();
        }
    }

    /// Wakes every poller sleeping on this doorbell.
    #[cold]
    pub(crate) fn wake(&self) {
        // Relaxed: the futex compares the value itself; ordering is N1/N2's.
        self.wake_seq.fetch_add(1, Ordering::Relaxed);
        dp_fabric::sys::futex_wake(&self.wake_seq);
    }

    /// Announces a sleeping poller; returns the token for [`Doorbell::sleep`].
    pub(crate) fn arm(&self) -> u32 {
        // N2: SeqCst RMW then a SeqCst fence, pairs with N1 in `ring`: the poll the caller
        // makes next sees any work rung before this, or its ringer sees the sleeper.
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        self.wake_seq.load(Ordering::Acquire)
    }

    /// Sleeps until a ring after the arm that returned `token`, or `timeout`; disarms.
    pub(crate) fn sleep(&self, token: u32, timeout: std::time::Duration) {
        dp_fabric::sys::futex_wait(&self.wake_seq, token, timeout);
        self.disarm();
    }

    /// Ends an arm. Saturating: a peer may have cleared the count.
    pub(crate) fn disarm(&self) {
        // SeqCst: part of the N1/N2 protocol's total order.
        let _ = self
            .sleepers
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1));
    }

    /// Takes every set bit, calling `f(slot)` for each.
    #[inline]
    pub(crate) fn take(&self, mut f: impl FnMut(u32)) {
        // Relaxed pre-check: a stale zero only delays work to the next call; bits stay set.
        if self.summary.load(Ordering::Relaxed) == 0 {
            return;
        }
        // D4: Acquire, pairs with D2.
        let mut s = self.summary.swap(0, Ordering::Acquire);
        while s != 0 {
            let w = s.trailing_zeros() as usize;
            s &= s - 1;
            // D3: Acquire, pairs with D1: the work of every bit taken here is visible.
            let mut bits = self.words[w].swap(0, Ordering::Acquire);
            while bits != 0 {
                let b = bits.trailing_zeros();
                bits &= bits - 1;
                f(w as u32 * 64 + b);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// UD segment
// ---------------------------------------------------------------------------------------

/// Largest UD payload (the path MTU the shm provider reports).
pub(crate) const UD_MTU: usize = 4096;
/// Most slots of a UD segment.
pub(crate) const UD_MAX_SLOTS: u32 = 1 << 16;

/// Fixed part of a UD segment.
#[repr(C)]
pub(crate) struct UdSegHeader {
    pub hdr: SegHeader,
    pub qpn: u32,
    pub qkey: u32,
    /// Slots (power of two).
    pub nslots: u32,
    _r: u32,
    _pad: [u8; 80],
    /// Next position to reserve. Senders CAS.
    pub enq: CachePadded<AtomicU64>,
    /// The owner's state (raw QpState); senders drop datagrams to a dead queue pair.
    pub state: CachePadded<AtomicU32>,
    /// Posted receives not yet claimed by a datagram. The owner adds; a sender claims one
    /// before it enqueues, so a datagram that arrives with no receive posted is dropped at
    /// once, as on hardware.
    pub rq_avail: CachePadded<AtomicU64>,
}
const _: () = assert!(size_of::<UdSegHeader>() == 128 + 3 * 128);

/// One datagram slot header; the payload follows in the same slot.
#[repr(C, align(64))]
pub(crate) struct UdSlotHdr {
    /// Vyukov sequence: `pos` free for position `pos`, `pos + 1` published, and
    /// `pos + nslots` consumed (free for the next lap).
    seq: AtomicU64,
    src_qpn: AtomicU32,
    qkey: AtomicU32,
    len: AtomicU32,
    imm: AtomicU32,
    has_imm: AtomicU32,
}
const _: () = assert!(size_of::<UdSlotHdr>() == 64);

const UD_SLOT_STRIDE: usize = 64 + UD_MTU;

/// Bytes of a UD segment with `nslots` slots.
pub(crate) const fn ud_seg_len(nslots: u32) -> usize {
    (size_of::<UdSegHeader>() + UD_SLOT_STRIDE * nslots as usize).next_multiple_of(4096)
}

/// A received datagram's metadata.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct UdMsg {
    pub src_qpn: u32,
    pub qkey: u32,
    pub len: u32,
    pub imm: Option<u32>,
}

/// Typed access to a mapped UD segment.
#[derive(Clone, Copy, Debug)]
pub(crate) struct UdSegView {
    base: *mut u8,
    nslots: u32,
}

// SAFETY: shared fields are atomics; payload bytes are ordered by the slot sequence (U1/U2).
unsafe impl Send for UdSegView {}
// SAFETY: as above.
unsafe impl Sync for UdSegView {}

impl UdSegView {
    /// Formats zeroed memory.
    ///
    /// # Safety
    /// `base` must point to `ud_seg_len(nslots)` writable zeroed bytes, 4096-aligned, that
    /// stay mapped for the life of every view.
    pub(crate) unsafe fn init(
        base: *mut u8,
        nslots: u32,
        qpn: u32,
        qkey: u32,
        ctx_id: u32,
    ) -> Self {
        debug_assert!(nslots.is_power_of_two());
        let h = base.cast::<UdSegHeader>();
        // SAFETY: valid, aligned, not yet shared (caller's contract).
        unsafe {
            (&raw mut (*h).hdr).write(SegHeader::new(SegKind::Ud, ud_seg_len(nslots), ctx_id));
            (&raw mut (*h).qpn).write(qpn);
            (&raw mut (*h).qkey).write(qkey);
            (&raw mut (*h).nslots).write(nslots);
        }
        let v = Self { base, nslots };
        for i in 0..nslots {
            // Relaxed: not yet shared.
            v.slot(u64::from(i))
                .seq
                .store(u64::from(i), Ordering::Relaxed);
        }
        v
    }

    /// Validates and views a peer's segment.
    ///
    /// # Safety
    /// `base` must point to `mapped` readable/writable bytes that stay mapped for the life
    /// of the view.
    pub(crate) unsafe fn attach(base: *mut u8, mapped: usize) -> Result<Self, &'static str> {
        if mapped < size_of::<UdSegHeader>() {
            return Err("peer UD segment too small");
        }
        // SAFETY: a header's worth of bytes is mapped.
        let h = unsafe { &*base.cast::<UdSegHeader>() };
        h.hdr.check(SegKind::Ud, mapped)?;
        let nslots = h.nslots;
        if !nslots.is_power_of_two() || nslots > UD_MAX_SLOTS || ud_seg_len(nslots) > mapped {
            return Err("peer UD segment has impossible sizes");
        }
        Ok(Self { base, nslots })
    }

    #[inline]
    pub(crate) fn header(&self) -> &UdSegHeader {
        // SAFETY: validated at init/attach.
        unsafe { &*self.base.cast::<UdSegHeader>() }
    }

    #[inline]
    fn slot(&self, pos: u64) -> &UdSlotHdr {
        let i = (pos & u64::from(self.nslots - 1)) as usize;
        // SAFETY: i < nslots; the slot lies inside the segment.
        unsafe {
            &*self
                .base
                .add(size_of::<UdSegHeader>() + i * UD_SLOT_STRIDE)
                .cast::<UdSlotHdr>()
        }
    }

    #[inline]
    fn payload(&self, pos: u64) -> *mut u8 {
        (self.slot(pos) as *const UdSlotHdr as *mut u8).wrapping_add(64)
    }

    /// Owner: `n` more receives are posted.
    pub(crate) fn add_recv(&self, n: u64) {
        // U4: Release, pairs with U5: the receive is queued locally before it is claimable.
        self.header().rq_avail.fetch_add(n, Ordering::Release);
    }

    /// Sender: claims one posted receive; false if none is posted.
    pub(crate) fn claim_recv(&self) -> bool {
        let a = &self.header().rq_avail;
        // Relaxed first read; the CAS below validates it.
        let mut cur = a.load(Ordering::Relaxed);
        while cur > 0 {
            // U5: Acquire on success, pairs with U4.
            match a.compare_exchange_weak(cur, cur - 1, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(v) => cur = v,
            }
        }
        false
    }

    /// Sender: returns a claimed receive it could not use.
    pub(crate) fn unclaim_recv(&self) {
        // Relaxed: the count only ever gates claims, which re-synchronise through U4/U5.
        self.header().rq_avail.fetch_add(1, Ordering::Relaxed);
    }

    /// Sender: enqueues one datagram assembled by `fill(dst)` (which writes `len` bytes).
    /// Returns false (datagram dropped) if the queue is full or the datagram too long.
    pub(crate) fn send(&self, meta: &UdMsg, fill: impl FnOnce(*mut u8)) -> bool {
        if meta.len as usize > UD_MTU {
            return false;
        }
        let h = self.header();
        // Relaxed: a starting guess; the CAS below validates it.
        let mut pos = h.enq.load(Ordering::Relaxed);
        loop {
            let s = self.slot(pos);
            // U0: Acquire, pairs with U3 in `recv`: the owner is done with the slot's
            // previous contents.
            let seq = s.seq.load(Ordering::Acquire);
            if seq == pos {
                // Relaxed CAS: the slot itself is published by U1.
                match h.enq.compare_exchange_weak(
                    pos,
                    pos + 1,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => break,
                    Err(p) => pos = p,
                }
            } else if seq < pos {
                return false; // full: the owner has not consumed this slot's last lap
            } else {
                pos = h.enq.load(Ordering::Relaxed);
            }
        }
        let s = self.slot(pos);
        s.src_qpn.store(meta.src_qpn, Ordering::Relaxed);
        s.qkey.store(meta.qkey, Ordering::Relaxed);
        s.len.store(meta.len, Ordering::Relaxed);
        s.imm.store(meta.imm.unwrap_or(0), Ordering::Relaxed);
        s.has_imm
            .store(u32::from(meta.imm.is_some()), Ordering::Relaxed);
        fill(self.payload(pos));
        // U1: Release CAS, pairs with U2: publishes fields and payload. A CAS rather than a
        // store so a slot the owner skipped (we stalled too long) is not resurrected.
        s.seq
            .compare_exchange(pos, pos + 1, Ordering::Release, Ordering::Relaxed)
            .is_ok()
    }

    /// Owner: the datagram at position `pos`, copied out with `take(src, meta)`, then the
    /// slot is freed. `None` if nothing is published there yet.
    pub(crate) fn recv(&self, pos: u64, take: impl FnOnce(*const u8, &UdMsg)) -> Option<()> {
        let s = self.slot(pos);
        // U2: Acquire, pairs with U1.
        if s.seq.load(Ordering::Acquire) != pos + 1 {
            return None;
        }
        let has_imm = s.has_imm.load(Ordering::Relaxed) != 0;
        let meta = UdMsg {
            src_qpn: s.src_qpn.load(Ordering::Relaxed),
            qkey: s.qkey.load(Ordering::Relaxed),
            len: s.len.load(Ordering::Relaxed).min(UD_MTU as u32),
            imm: has_imm.then(|| s.imm.load(Ordering::Relaxed)),
        };
        take(self.payload(pos), &meta);
        // U3: Release, pairs with U0: we are done reading the slot.
        s.seq.store(pos + u64::from(self.nslots), Ordering::Release);
        Some(())
    }

    /// Owner: true if position `pos` was reserved by a sender that has not published it
    /// (possibly a sender that died mid-copy).
    pub(crate) fn reserved_unpublished(&self, pos: u64) -> bool {
        let h = self.header();
        // Relaxed: diagnostic; `skip` settles the race with a CAS.
        h.enq.load(Ordering::Relaxed) > pos && self.slot(pos).seq.load(Ordering::Relaxed) == pos
    }

    /// Owner: gives up on a reserved slot whose sender never published it, so the queue
    /// cannot wedge behind a dead sender. The late sender's publish then fails (U1).
    pub(crate) fn skip(&self, pos: u64) -> bool {
        // U3': Release, same role as U3.
        self.slot(pos)
            .seq
            .compare_exchange(
                pos,
                pos + u64::from(self.nslots),
                Ordering::Release,
                Ordering::Relaxed,
            )
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The consumer key is the low 8 bits: `ibv_inc_rkey` keeps the index and generation,
    /// and the tag (generation over consumer) round-trips through a key.
    #[test]
    fn key_layout_puts_the_consumer_key_low() {
        let k = make_key(0xABC, 0x12345);
        assert_eq!(k, 0x123 << 20 | 0xABC << 8 | 0x45);
        assert_eq!(key_parts(k), (0xABC, 0x12345));
        let next = dp_fabric::inc_rkey(k);
        assert_eq!(key_parts(next), (0xABC, 0x12346));
        assert_eq!(
            key_parts(dp_fabric::inc_rkey(make_key(7, 0x3FF))),
            (7, 0x300)
        );
        assert_eq!(make_key(0, 1), 1);
        for idx in [0, 1, MAX_KEY_SLOTS - 1] {
            for tag in [1, 0xFF, 0x100, KEY_TAG_MASK] {
                assert_eq!(key_parts(make_key(idx, tag)), (idx, tag));
                assert_ne!(make_key(idx, tag), 0);
            }
        }
    }

    /// A lookup compares the whole key: another consumer key or generation for the same
    /// slot finds nothing.
    #[test]
    fn lookup_checks_the_whole_key() {
        #[repr(C, align(64))]
        struct Line([u8; 64]);
        let slots = 4;
        let mut mem: Vec<Line> = (0..key_table_len(slots) / 64)
            .map(|_| Line([0; 64]))
            .collect();
        // SAFETY: zeroed, 64-aligned, key_table_len(slots) bytes, alive for the test.
        let kt = unsafe { KeyTable::init(mem.as_mut_ptr().cast(), slots, 1) };
        let key = make_key(2, 0x201);
        kt.publish(
            2,
            &KeySnap {
                key,
                access: 0,
                region_slot: u32::MAX,
                base: 0x1000,
                len: 0x1000,
                region_off: 0,
            },
        );
        assert_eq!(kt.lookup(key).map(|s| s.key), Some(key));
        assert!(kt.lookup(dp_fabric::inc_rkey(key)).is_none());
        assert!(kt.lookup(key.wrapping_add(1 << 20)).is_none());
        assert!(kt.lookup(make_key(1, 0x201)).is_none());
        assert!(kt.lookup(0).is_none());
        kt.revoke(2);
        assert!(kt.lookup(key).is_none());
    }
}
