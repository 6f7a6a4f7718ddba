//! The queue-pair segment (one per RC queue pair; the owner and its one peer write disjoint
//! fields): the owner's state, its count of posted receives and their lengths (the peer's
//! credits), the inbound message slots the peer fills, and the bounce buffer that carries
//! SEND payloads.
//!
//! # Inbound slots
//!
//! Each message that consumes a receive is published in one 128-byte slot (two cache
//! lines): its kind, immediate and length, and the payload itself when it fits
//! ([`SLOT_INLINE`] bytes) and is a SEND, or a WRITE with immediate that the sender marked
//! [`PLACE_ON_POLL`](dp_fabric::SendFlags::PLACE_ON_POLL) (with its destination: remote key
//! and address). A small SEND then never touches the bounce buffer: neither its payload
//! lines nor the owner's release counter, which the sender would otherwise fetch back from
//! the owner's core for every message. The owner copies such a payload out when it polls
//! the message, as NICs scatter small payloads into the completion entry and the driver
//! copies them out at poll time:
//! a small message then moves the slot's two lines between the cores, fetched together,
//! instead of the destination's lines first and the slot's after them. Everything in a
//! slot is the peer's word: the owner checks the length against [`SLOT_INLINE`] and the
//! destination against its own key table before it writes a byte.
//!
//! A slot also carries the sender's count of posted receives (`credit`): the owner's
//! credits for what it sends back. In a request/response exchange each side reposts a
//! receive just before it sends, so the peer, reading the count from `rq_posted`, would
//! fetch that line right after it was written, once per message, on top of the slot.

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use crossbeam_utils::CachePadded;

use crate::layout::{SegHeader, SegKind};
use dp_fabric::QpState;

/// Kinds of inbound message.
pub(crate) mod inbound_kind {
    /// SEND; payload in the bounce buffer.
    pub(crate) const SEND: u32 = 1;
    /// SEND with immediate.
    pub(crate) const SEND_IMM: u32 = 2;
    /// RDMA WRITE with immediate; data already placed.
    pub(crate) const WRITE_IMM: u32 = 3;
    /// The peer found our receive too short for its SEND: fail that receive.
    pub(crate) const LEN_ERR: u32 = 4;
    /// RDMA WRITE with immediate whose payload is in the slot: the owner places it at its
    /// destination (`key`, `addr`) when it polls the message.
    pub(crate) const WRITE_IMM_INLINE: u32 = 5;
    /// SEND with invalidate: a SEND whose `key` the owner invalidates (it must be the
    /// current key of one of its windows) before it reports the receive.
    pub(crate) const SEND_INV: u32 = 6;
    /// SEND whose payload (at most [`SLOT_INLINE`](super::SLOT_INLINE) bytes) is in the
    /// slot, not the bounce buffer.
    pub(crate) const SEND_INLINE: u32 = 7;
    /// SEND with immediate, payload in the slot.
    pub(crate) const SEND_IMM_INLINE: u32 = 8;
    /// SEND with invalidate, payload in the slot.
    pub(crate) const SEND_INV_INLINE: u32 = 9;

    /// The SEND kinds whose payload rides in the slot.
    #[inline]
    pub(crate) const fn is_inline_send(kind: u32) -> bool {
        matches!(kind, SEND_INLINE | SEND_IMM_INLINE | SEND_INV_INLINE)
    }

    /// The kind of SEND `kind` (`SEND`, `SEND_IMM` or `SEND_INV`) when its payload rides in
    /// the slot; any other kind as it is.
    #[inline]
    pub(crate) const fn in_slot(kind: u32) -> u32 {
        match kind {
            SEND => SEND_INLINE,
            SEND_IMM => SEND_IMM_INLINE,
            SEND_INV => SEND_INV_INLINE,
            k => k,
        }
    }
}

/// Most payload bytes an inbound slot carries (a WRITE with immediate up to this size, if
/// its sender allows placement at poll time).
pub(crate) const SLOT_INLINE: usize = 80;

/// One inbound message slot: two cache lines, the second holding the tail of the inline
/// payload. The peer fills it and publishes it by storing `seq`.
#[repr(C, align(128))]
pub(crate) struct InboundSlot {
    /// Message number + 1 once published (0: never used).
    seq: AtomicU64,
    kind: AtomicU32,
    imm: AtomicU32,
    /// Payload length.
    len: AtomicU32,
    /// 1 if `imm` is valid.
    has_imm: AtomicU32,
    /// Bounce-buffer position just past the payload (SEND only).
    bounce_end: AtomicU64,
    /// Remote key of the destination (WRITE_IMM_INLINE only).
    key: AtomicU32,
    /// The sender's own posted receives (its `rq_posted`), low 32 bits, when it wrote the
    /// slot: the owner's credits for sending back, carried in a line the owner reads anyway
    /// (a hint: see [`QpSegView::posted`]).
    credit: AtomicU32,
    /// Destination address, in the owner's address space (WRITE_IMM_INLINE only).
    addr: AtomicU64,
    /// The payload (WRITE_IMM_INLINE only): plain bytes, written before the Release store
    /// of `seq` and read after its Acquire load (Q3/Q4).
    data: UnsafeCell<[u8; SLOT_INLINE]>,
}
const _: () = assert!(size_of::<InboundSlot>() == 128);
const _: () = assert!(core::mem::offset_of!(InboundSlot, data) == 48);

/// A published inbound message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Inbound {
    pub kind: u32,
    pub imm: Option<u32>,
    pub len: u32,
    pub bounce_end: u64,
    /// Destination key and address of an inline payload.
    pub key: u32,
    pub addr: u64,
    /// The sender's posted receives, low 32 bits (a credit hint; the peer's word).
    pub credit: u32,
}

/// Fixed part of a queue-pair segment.
///
/// The first line holds what both sides only read on the data path: the sizes, written
/// once, and the two words that change only when the queue pair fails (the owner's state
/// and the peer's fault flag). A poller's look at an idle queue pair (`ShmCq::may_have_work`)
/// reads both words, so they share that line instead of taking one line each. The two
/// counters the sides write per message have a line each.
#[repr(C)]
pub(crate) struct QpSegHeader {
    pub hdr: SegHeader,
    /// Queue pair number.
    pub qpn: u32,
    /// Capacity of the posted-receive length ring and of the inbound slot ring (a power of
    /// two, at least `max_recv_wr`).
    pub rq_cap: u32,
    /// Bounce buffer bytes.
    pub bounce_len: u32,
    /// The owner's [`QpState`](dp_fabric::QpState) as raw value. Owner writes.
    pub state: AtomicU32,
    /// Set by the peer when it detected a remote access or length violation that moves
    /// this queue pair to the error state (nonzero = status raw value).
    pub fault: AtomicU32,
    _pad: [u8; 76],
    /// Receives posted, ever. Owner writes; the peer's credit.
    pub rq_posted: CachePadded<AtomicU64>,
    /// Bounce bytes consumed, ever. Owner writes.
    pub bounce_tail: CachePadded<AtomicU64>,
}
const _: () = assert!(size_of::<QpSegHeader>() == 128 + 2 * 128);
const _: () = assert!(core::mem::offset_of!(QpSegHeader, fault) < 64);

/// Offsets inside a queue-pair segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QpSegLayout {
    pub rq_cap: u32,
    pub bounce_len: u32,
    pub rq_len_off: usize,
    pub slots_off: usize,
    pub bounce_off: usize,
    pub total: usize,
}

impl QpSegLayout {
    /// Largest receive ring a peer segment may have.
    pub(crate) const MAX_RQ_CAP: u32 = 1 << 20;
    /// Largest bounce buffer a peer segment may have.
    pub(crate) const MAX_BOUNCE: u32 = 1 << 30;
    /// Largest segment (the two maxima above).
    pub(crate) const MAX_TOTAL: usize = Self::new(Self::MAX_RQ_CAP, Self::MAX_BOUNCE).total;

    /// Layout for `rq_cap` (power of two) receives and `bounce_len` bounce bytes.
    pub(crate) const fn new(rq_cap: u32, bounce_len: u32) -> Self {
        let rq_len_off = size_of::<QpSegHeader>();
        let slots_off = (rq_len_off + 4 * rq_cap as usize).next_multiple_of(128);
        let bounce_off =
            (slots_off + size_of::<InboundSlot>() * rq_cap as usize).next_multiple_of(4096);
        let total = (bounce_off + bounce_len as usize).next_multiple_of(4096);
        Self {
            rq_cap,
            bounce_len,
            rq_len_off,
            slots_off,
            bounce_off,
            total,
        }
    }
}

/// True if `s` holds message `n` (published by the peer's Release store of `seq`), for a
/// look that must not miss a message published before it (`ShmCq::may_have_work`, which a
/// sleeper's last look after its arm goes through, as `pop` does).
#[inline]
fn slot_published(s: &InboundSlot, n: u64) -> bool {
    // As in `pop`: the second line is asked for with the first, or a message found here
    // would wait for it once more when `pop` reads it.
    prefetch(s.data.get().cast::<u8>().wrapping_add(64 - 48));
    // Q4': Acquire, pairs with Q3 in `push`, as Q4 in `pop` does: a load ordered after the
    // poller's SeqCst arm on every architecture (see `Doorbell::ring`, N1).
    s.seq.load(Ordering::Acquire) == n + 1
}

/// A completion queue's look at one queue pair it receives for, kept in the queue's own
/// scan list: the segment and the slot ring's geometry, 16 bytes. Looking at an idle queue
/// pair through it reads two lines of the segment (its first header line, with the state
/// and fault words, and the next inbound slot) and none of the queue pair's own state,
/// which a loop serving many idle connections would otherwise fetch for each.
///
/// It points into the segment of a queue pair whose core the completion queue holds (its
/// slot table entry) for as long as the watch is in its scan list.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RecvWatch {
    base: core::ptr::NonNull<u8>,
    slots_off: u32,
    mask: u32,
}

// SAFETY: as for `QpSegView`: the segment is reached through atomics only, and it stays
// mapped while the completion queue that keeps the watch holds the queue pair's core.
unsafe impl Send for RecvWatch {}
// SAFETY: as above.
unsafe impl Sync for RecvWatch {}

impl RecvWatch {
    /// True if the owner's poll has something to do for receive number `n`: a published
    /// inbound message, a fault the peer flagged, or the error state (receives to flush).
    #[inline]
    pub(crate) fn pending(&self, n: u64) -> bool {
        // SAFETY: base points at the validated, mapped header of a live segment (the type
        // doc), made by `QpSegView::watch`.
        let h = unsafe { &*self.base.as_ptr().cast::<QpSegHeader>() };
        let i = (n & u64::from(self.mask)) as usize;
        // SAFETY: i <= mask = rq_cap - 1 and slots_off is the slot array's offset, so the
        // slot lies inside the segment (as in `QpSegView::slot`).
        let s = unsafe {
            &*self
                .base
                .as_ptr()
                .add(self.slots_off as usize)
                .cast::<InboundSlot>()
                .add(i)
        };
        // Acquire: pairs with the Release store of the fault by the peer (as in
        // `QpCore::drain_recv`). Relaxed state: a hint, as in `QpCore::state`.
        h.fault.load(Ordering::Acquire) != 0
            || slot_published(s, n)
            || QpState::from_raw(h.state.load(Ordering::Relaxed)) == QpState::Error
    }
}

/// What [`QpSegView::bounce_reserve`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reserve {
    /// Room from this position.
    At(u64),
    /// Not enough room released yet: wait.
    Full,
    /// The owner's numbers are impossible.
    Bad,
}

/// Typed access to a mapped queue-pair segment.
///
/// Holds raw pointers into a mapping kept alive by whoever owns the view.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QpSegView {
    base: *mut u8,
    pub layout: QpSegLayout,
}

// SAFETY: the view only reaches shared memory through atomics or through byte copies whose
// ordering the protocol establishes (bounce and inline payloads are written before the
// Release store of the slot that names them and read after the matching Acquire load).
unsafe impl Send for QpSegView {}
// SAFETY: as above.
unsafe impl Sync for QpSegView {}

impl QpSegView {
    /// Formats zeroed memory of at least `layout.total` bytes.
    ///
    /// # Safety
    /// `base` must point to `layout.total` writable, zero-filled bytes, 4096-aligned, that
    /// stay mapped for the life of every view made from them.
    pub(crate) unsafe fn init(base: *mut u8, layout: QpSegLayout, qpn: u32, ctx_id: u32) -> Self {
        let h = base.cast::<QpSegHeader>();
        // SAFETY: the caller guarantees base is valid, aligned and large enough; the
        // memory is not yet shared, so plain writes are fine.
        unsafe {
            (&raw mut (*h).hdr).write(SegHeader::new(SegKind::Qp, layout.total, ctx_id));
            (&raw mut (*h).qpn).write(qpn);
            (&raw mut (*h).rq_cap).write(layout.rq_cap);
            (&raw mut (*h).bounce_len).write(layout.bounce_len);
        }
        Self { base, layout }
    }

    /// Validates and views a peer's segment.
    ///
    /// # Safety
    /// `base` must point to `mapped` readable and writable bytes, 4096-aligned, that stay
    /// mapped for the life of the view.
    pub(crate) unsafe fn attach(base: *mut u8, mapped: usize) -> Result<Self, &'static str> {
        if mapped < size_of::<QpSegHeader>() {
            return Err("peer queue-pair segment too small");
        }
        // SAFETY: at least a header's worth of bytes is mapped (checked above).
        let h = unsafe { &*base.cast::<QpSegHeader>() };
        h.hdr.check(SegKind::Qp, mapped)?;
        let rq_cap = h.rq_cap;
        let bounce_len = h.bounce_len;
        if !rq_cap.is_power_of_two()
            || rq_cap > QpSegLayout::MAX_RQ_CAP
            || bounce_len > QpSegLayout::MAX_BOUNCE
        {
            return Err("peer queue-pair segment has impossible sizes");
        }
        let layout = QpSegLayout::new(rq_cap, bounce_len);
        if layout.total > mapped || layout.total as u64 != h.hdr.len {
            return Err("peer queue-pair segment length does not match its sizes");
        }
        Ok(Self { base, layout })
    }

    #[inline]
    pub(crate) fn header(&self) -> &QpSegHeader {
        // SAFETY: base points at a validated, mapped header (init/attach).
        unsafe { &*self.base.cast::<QpSegHeader>() }
    }

    #[inline]
    fn rq_len(&self, i: u64) -> &AtomicU32 {
        let i = (i & u64::from(self.layout.rq_cap - 1)) as usize;
        // SAFETY: i < rq_cap, so the element lies inside the rq_len array of the segment.
        unsafe {
            &*self
                .base
                .add(self.layout.rq_len_off)
                .cast::<AtomicU32>()
                .add(i)
        }
    }

    #[inline]
    fn slot(&self, n: u64) -> &InboundSlot {
        let i = (n & u64::from(self.layout.rq_cap - 1)) as usize;
        // SAFETY: i < rq_cap, so the slot lies inside the slot array of the segment.
        unsafe {
            &*self
                .base
                .add(self.layout.slots_off)
                .cast::<InboundSlot>()
                .add(i)
        }
    }

    /// Owner: records receive number `n`'s total length, then makes `n + 1` receives
    /// visible to the peer.
    #[inline]
    pub(crate) fn publish_recv(&self, n: u64, len: u32) {
        // Relaxed: published by Q1 below.
        self.rq_len(n).store(len, Ordering::Relaxed);
        // Q1: Release, pairs with Q2 in `peer_credit`: the length and the local receive
        // entry are written before the peer can use the credit.
        self.header().rq_posted.store(n + 1, Ordering::Release);
    }

    /// Owner: the receives it posted so far, to carry in the slots of the messages it sends
    /// (their `credit`), so that the peer learns of its credits from the line it polls
    /// instead of fetching `rq_posted` from this segment after the owner just wrote it.
    #[inline]
    pub(crate) fn posted(&self) -> u64 {
        // Q2': Acquire, pairs with Q1 (the poster may be another thread than the sender):
        // the lengths and receive entries of these receives are written before the Release
        // store of the slot that carries the count (Q3).
        self.header().rq_posted.load(Ordering::Acquire)
    }

    /// Peer: receives posted so far.
    #[inline]
    pub(crate) fn peer_credit(&self) -> u64 {
        // Q2: Acquire, pairs with Q1.
        self.header().rq_posted.load(Ordering::Acquire)
    }

    /// Peer: total length of receive number `n` (valid once `n < peer_credit()`).
    #[inline]
    pub(crate) fn recv_len(&self, n: u64) -> u32 {
        // Relaxed: ordered by Q2.
        self.rq_len(n).load(Ordering::Relaxed)
    }

    /// Peer: publishes inbound message number `n` (which must be below the credit).
    #[inline]
    pub(crate) fn push(&self, n: u64, m: &Inbound) {
        let s = self.slot(n);
        // Relaxed field writes, published by Q3.
        s.kind.store(m.kind, Ordering::Relaxed);
        s.imm.store(m.imm.unwrap_or(0), Ordering::Relaxed);
        s.has_imm
            .store(u32::from(m.imm.is_some()), Ordering::Relaxed);
        s.len.store(m.len, Ordering::Relaxed);
        s.bounce_end.store(m.bounce_end, Ordering::Relaxed);
        s.key.store(m.key, Ordering::Relaxed);
        s.addr.store(m.addr, Ordering::Relaxed);
        s.credit.store(m.credit, Ordering::Relaxed);
        // Q3: Release, pairs with Q4 in `pop`: the fields, the bounce payload and any RDMA
        // WRITE data placed before this call are visible to the owner.
        s.seq.store(n + 1, Ordering::Release);
    }

    /// Owner: inbound message number `n`, if published.
    #[inline]
    pub(crate) fn pop(&self, n: u64) -> Option<Inbound> {
        let s = self.slot(n);
        // The slot's second line (the tail of an inline payload) is requested together with
        // the first, so a message that just arrived costs one transfer's wait, not two.
        prefetch(s.data.get().cast::<u8>().wrapping_add(64 - 48));
        // Q4: Acquire, pairs with Q3.
        if s.seq.load(Ordering::Acquire) != n + 1 {
            return None;
        }
        // Relaxed: ordered by Q4.
        let has_imm = s.has_imm.load(Ordering::Relaxed) != 0;
        let imm = s.imm.load(Ordering::Relaxed);
        Some(Inbound {
            kind: s.kind.load(Ordering::Relaxed),
            imm: has_imm.then_some(imm),
            len: s.len.load(Ordering::Relaxed),
            bounce_end: s.bounce_end.load(Ordering::Relaxed),
            key: s.key.load(Ordering::Relaxed),
            addr: s.addr.load(Ordering::Relaxed),
            credit: s.credit.load(Ordering::Relaxed),
        })
    }

    /// Where a `len`-byte inline payload of message `n` lies: flush with the end of the
    /// slot, so that one of up to 64 bytes fills only the second line and the sender's
    /// stores go to one line, then the other (payload, then header and `seq`), instead of
    /// alternating between them while the owner polls the first. `None` beyond
    /// [`SLOT_INLINE`].
    #[inline]
    fn inline_at(&self, n: u64, len: u32) -> Option<*mut u8> {
        let len = len as usize;
        (len <= SLOT_INLINE).then(|| {
            self.slot(n)
                .data
                .get()
                .cast::<u8>()
                .wrapping_add(SLOT_INLINE - len)
        })
    }

    /// Peer: where the `len` bytes (at most [`SLOT_INLINE`]) of message `n`'s inline
    /// payload go, written before [`push`](Self::push) publishes the message.
    #[inline]
    pub(crate) fn inline_dst(&self, n: u64, len: u32) -> Option<*mut u8> {
        self.inline_at(n, len)
    }

    /// Owner: the inline payload of published message `n`, which the peer says is `len`
    /// bytes: `None` if that is more than a slot holds.
    #[inline]
    pub(crate) fn inline_src(&self, n: u64, len: u32) -> Option<*const u8> {
        self.inline_at(n, len).map(<*mut u8>::cast_const)
    }

    /// Owner: what a poller keeps to look at this queue pair's next inbound message and
    /// its failure words without going through the queue pair ([`RecvWatch`]).
    pub(crate) fn watch(&self) -> Option<RecvWatch> {
        Some(RecvWatch {
            base: core::ptr::NonNull::new(self.base)?,
            slots_off: u32::try_from(self.layout.slots_off).ok()?,
            mask: self.layout.rq_cap - 1,
        })
    }

    /// Owner: true if message `n` is published (cheap poll, used by scan mode).
    #[inline]
    pub(crate) fn has(&self, n: u64) -> bool {
        // Relaxed: a hint only; `pop` re-reads with Acquire.
        self.slot(n).seq.load(Ordering::Relaxed) == n + 1
    }

    /// Pointer to bounce byte `pos % bounce_len`.
    #[inline]
    pub(crate) fn bounce_ptr(&self, pos: u64) -> *mut u8 {
        let off = (pos % u64::from(self.layout.bounce_len.max(1))) as usize;
        // SAFETY: off < bounce_len, inside the bounce area of the segment.
        unsafe { self.base.add(self.layout.bounce_off + off) }
    }

    /// Peer: reserves `len` contiguous bounce bytes after `head`: the start position,
    /// [`Reserve::Full`] if the owner has not freed enough yet, or [`Reserve::Bad`] if the
    /// owner's release counter is impossible (ahead of what we sent, or a request larger than
    /// the whole buffer).
    ///
    /// `tail` is the caller's copy of the owner's release counter: the counter only grows,
    /// so room the copy shows is there, and the owner's line (which it writes as it lands
    /// SENDs) is fetched only when the copy shows too little. A lying owner is found then,
    /// when its word would matter.
    #[inline]
    pub(crate) fn bounce_reserve(&self, head: u64, len: u32, tail: &mut u64) -> Reserve {
        let cap = u64::from(self.layout.bounce_len);
        let len = u64::from(len);
        if len > cap || cap == 0 {
            return Reserve::Bad;
        }
        let off = head % cap;
        let start = if off + len > cap {
            head + (cap - off)
        } else {
            head
        };
        if (start + len).saturating_sub(*tail) <= cap {
            return Reserve::At(start);
        }
        // Q5: Acquire, pairs with Q6 in `bounce_release`: the owner finished reading the
        // bytes we are about to overwrite.
        *tail = self.header().bounce_tail.load(Ordering::Acquire);
        // The owner writes `tail`: it may lag, but never run past what we sent.
        match (start + len).checked_sub(*tail) {
            None => Reserve::Bad,
            Some(used) if used <= cap => Reserve::At(start),
            Some(_) => Reserve::Full,
        }
    }

    /// Owner: the payload of a SEND that the peer says ends at bounce position `end` and is
    /// `len` bytes long, given that everything before `tail` was released already. `None`
    /// if the peer's numbers are impossible: the payload must start at or after `tail`,
    /// end within one lap of it, and lie contiguously inside the bounce area (the sender
    /// never wraps a payload).
    #[inline]
    pub(crate) fn bounce_payload(&self, tail: u64, end: u64, len: u32) -> Option<*const u8> {
        let cap = u64::from(self.layout.bounce_len);
        let start = end.checked_sub(u64::from(len))?;
        if start < tail || end - tail > cap || cap == 0 {
            return None;
        }
        let off = start % cap;
        if off + u64::from(len) > cap {
            return None;
        }
        // SAFETY: off + len <= bounce_len: the payload lies inside the bounce area.
        Some(unsafe { self.base.add(self.layout.bounce_off + off as usize) })
    }

    /// Owner: frees bounce bytes up to `end`.
    #[inline]
    pub(crate) fn bounce_release(&self, end: u64) {
        // Q6: Release, pairs with Q5.
        self.header().bounce_tail.store(end, Ordering::Release);
    }
}

/// Asks for the cache line at `p` without waiting for it (a hint: no effect on memory).
#[inline(always)]
fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults nor changes memory, whatever the address.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
