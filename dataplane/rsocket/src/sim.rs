//! A deterministic simulated fabric for the rsocket state machine.
//!
//! [`SimPair`] connects two [`StreamConn`]s over a simulated reliable-connected link with
//! virtual time: every posted request is delivered after `latency`, in order per direction;
//! a write with immediate that finds no receive posted waits (receiver not ready) and is
//! retried after `rnr_delay`; RDMA writes are checked against the peer's buffers and keys,
//! as hardware checks them. Faults can be injected: withheld receives (RNR), the death of
//! one side, error completions, and arbitrary (hostile) receive completions
//! ([`SimSide::inject`]). [`SimPair::drive`] runs both sides (poll completions, hand them
//! to the state machine, return credits) until nothing more happens, and `drive_bounded`
//! fails on livelock.
//!
//! # Strict memory
//!
//! Every local access the state machine makes through [`RsIo`] (reads, writes, and the
//! segments of posted requests) is checked against the buffer it names. An access outside
//! it neither panics nor wraps: it is refused, counted in [`SideState::bounds_faults`] and
//! recorded in [`SideState::last_bounds_fault`], so a test can assert that none happened.
//!
//! # A hostile peer
//!
//! For adversarial tests (the fuzz target `stream_conn`), side `b` can be played by the
//! test instead of its state machine: [`SimPair::connect_edited`] lets it lie in its
//! connection data, [`SimPair::peer_write`] and [`SimPair::inject_recv`] are what a hostile
//! peer (or its NIC) can make happen at `a`, [`SimPair::deliver_due`] and
//! [`SimPair::tick`] run the fabric and the clock without running either state machine,
//! and [`SideState::posted`] records every request a side posts.

use core::cell::Cell;
use core::ops::Range;
use std::collections::VecDeque;
use std::time::Duration;

use lcore::time::Instant;

use crate::conn::{Buf, Local, LocalKeys, OutOfBounds, RsIo, RsWr, StreamConfig, StreamConn};
use crate::error::RsError;
use crate::wire::ConnDataRepr;
use dp_fabric::{Completion, PostError, PostErrorKind, RemoteAddr, WcOpcode, WcStatus};

/// Address-space layout of a simulated side: every side gets its own 4 GiB window.
const RBUF_AT: u64 = 0x4000_0000;
const IOMEM_AT: u64 = 0xC000_0000;
/// Bytes of the simulated iomap memory area each side has (see [`SideState::iomem_sge`]).
pub const IOMEM_LEN: usize = 1 << 16;
const TARGET_AT: u64 = 0x8000_0000;

#[derive(Clone, Debug)]
struct InFlight {
    wr_id: u64,
    imm: Option<u32>,
    remote: RemoteAddr,
    data: Vec<u8>,
    due: Instant,
}

/// One simulated endpoint: the state machine and its simulated memory and queues.
#[derive(Debug)]
pub struct SimSide {
    /// The protocol state machine under test.
    pub conn: StreamConn,
    /// Memory, queues and fault knobs.
    pub st: SideState,
}

/// A simulated endpoint's memory, queues and fault knobs.
#[derive(Debug)]
pub struct SideState {
    sbuf: Vec<u8>,
    rbuf: Vec<u8>,
    target: Vec<u8>,
    /// Application memory a test may publish with `riomap` (remote-writable, key below).
    pub iomem: Vec<u8>,
    keys: LocalKeys,
    base: u64,
    sq: VecDeque<InFlight>,
    sq_cap: usize,
    recvs: VecDeque<u64>,
    cq: VecDeque<Completion>,
    now: Instant,
    latency: Duration,
    /// Until this virtual time, posted receives are parked (not visible to the peer), so
    /// the peer's writes with immediate meet receiver-not-ready.
    pub withhold_until: Option<Instant>,
    parked: VecDeque<u64>,
    /// Fail the next N send requests with this status.
    pub fail_next: Option<(u32, WcStatus)>,
    dead: bool,
    error: bool,
    /// Requests that waited for a receive at least once.
    pub rnr_waits: u64,
    /// Local accesses outside the buffer they named (refused; see the module doc). A
    /// `Cell`: reads take `&self`.
    bounds_faults: Cell<u64>,
    last_bounds_fault: Cell<Option<(Buf, u32, usize)>>,
    /// Every send request this side posted, in order, while `Some` (a test sets it to
    /// `Some(Vec::new())` to start recording and drains it).
    pub posted: Option<Vec<PostedWr>>,
}

/// A send request as a side posted it (see [`SideState::posted`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PostedWr {
    /// The state machine's work-request id.
    pub wr_id: u64,
    /// The immediate, for an RDMA WRITE with immediate.
    pub imm: Option<u32>,
    /// Destination in the peer's memory.
    pub remote: RemoteAddr,
    /// The payload, gathered at post time.
    pub data: Vec<u8>,
}

/// What became of a hostile peer's RDMA WRITE ([`SimPair::peer_write`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerWrite {
    /// The bytes landed (and the immediate, if any, completed a receive).
    Placed,
    /// Key, range or rights did not allow it: nothing landed (the peer's own request
    /// fails with a remote access error, which is the peer's problem).
    Rejected,
    /// A write with immediate found no receive posted: nothing happened (the peer's NIC
    /// would retry it later).
    NotReady,
}

impl SimSide {
    fn new(cfg: StreamConfig, base: u64, latency: Duration) -> Self {
        let keys = LocalKeys {
            rbuf_addr: base + RBUF_AT,
            rbuf_rkey: (base >> 32) as u32 * 16 + 1,
            target_addr: base + TARGET_AT,
            target_rkey: (base >> 32) as u32 * 16 + 2,
        };
        Self {
            conn: StreamConn::new(cfg, keys),
            st: SideState {
                sbuf: vec![0; cfg.buf_len(Buf::Sbuf) as usize],
                rbuf: vec![0; cfg.buf_len(Buf::Rbuf) as usize],
                target: vec![0; cfg.buf_len(Buf::Target) as usize],
                iomem: vec![0; IOMEM_LEN],
                keys,
                base,
                sq: VecDeque::new(),
                sq_cap: cfg.sq_size as usize,
                recvs: VecDeque::new(),
                cq: VecDeque::new(),
                now: Instant::from_nanos(0),
                latency,
                withhold_until: None,
                parked: VecDeque::new(),
                fail_next: None,
                dead: false,
                error: false,
                rnr_waits: 0,
                bounds_faults: Cell::new(0),
                last_bounds_fault: Cell::new(None),
                posted: None,
            },
        }
    }

    /// The application's progress pass: poll every completion, hand it to the state
    /// machine, then return credits. Returns the completions processed.
    pub fn progress(&mut self) -> usize {
        let n = self.handle_all();
        self.conn.after_completions(&mut SimIo(&mut self.st));
        n
    }

    /// [`progress`](Self::progress) as the socket layer runs it when its poll brought
    /// something: with [`StreamConn::after_data`], which lets re-posts wait.
    pub fn progress_data(&mut self) -> usize {
        let n = self.handle_all();
        self.conn.after_data(&mut SimIo(&mut self.st));
        n
    }

    /// Hands every queued completion to the state machine; returns how many.
    fn handle_all(&mut self) -> usize {
        let mut n = 0;
        while let Some(c) = self.st.cq.pop_front() {
            self.conn.handle_completion(&c, &mut SimIo(&mut self.st));
            n += 1;
        }
        n
    }

    /// Delivers a receive completion with immediate `imm` that reports `byte_len` bytes, as
    /// if the peer had sent it (a hostile peer can send any immediate): it consumes a posted
    /// receive, like a real arrival, and waits in the completion queue for the next
    /// [`progress`](Self::progress) (or [`SimPair::step`]).
    ///
    /// # Panics
    /// If no receive is posted (a real peer would meet receiver-not-ready).
    pub fn inject(&mut self, imm: u32, byte_len: u32) {
        let wr_id = self
            .st
            .recvs
            .pop_front()
            .expect("inject: no receive posted");
        self.st.cq.push_back(Completion {
            wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::RecvRdmaWithImm,
            byte_len,
            imm: Some(imm),
            qp_num: 2,
            src_qp: 0,
            invalidated: None,
        });
    }

    /// Runs `f` with the state machine and an I/O view of this side.
    pub fn with<R>(&mut self, f: impl FnOnce(&mut StreamConn, &mut SimIo<'_>) -> R) -> R {
        f(&mut self.conn, &mut SimIo(&mut self.st))
    }
}

impl SideState {
    /// The byte range `[off, off + len)` of `b`, if it lies inside `b`; otherwise the
    /// access is recorded as a bounds fault.
    fn range(&self, b: Buf, off: u32, len: usize) -> Option<Range<usize>> {
        let start = off as usize;
        match start.checked_add(len) {
            Some(end) if end <= self.buf(b).len() => Some(start..end),
            _ => {
                self.bounds_faults.set(self.bounds_faults.get() + 1);
                self.last_bounds_fault.set(Some((b, off, len)));
                None
            }
        }
    }

    /// Local accesses the state machine made outside the buffer they named (each refused).
    pub fn bounds_faults(&self) -> u64 {
        self.bounds_faults.get()
    }

    /// The last such access: buffer, offset, length.
    pub fn last_bounds_fault(&self) -> Option<(Buf, u32, usize)> {
        self.last_bounds_fault.get()
    }

    fn buf(&self, b: Buf) -> &Vec<u8> {
        match b {
            Buf::Sbuf => &self.sbuf,
            Buf::Rbuf => &self.rbuf,
            Buf::Target => &self.target,
        }
    }

    fn buf_mut(&mut self, b: Buf) -> &mut Vec<u8> {
        match b {
            Buf::Sbuf => &mut self.sbuf,
            Buf::Rbuf => &mut self.rbuf,
            Buf::Target => &mut self.target,
        }
    }

    /// The remote address and key of `[off, off + len)` of this side's iomap memory.
    pub fn iomem_sge(&self, off: usize, len: usize) -> crate::wire::RsSge {
        crate::wire::RsSge {
            addr: self.base + IOMEM_AT + off as u64,
            key: self.iomem_key(),
            length: len as u32,
        }
    }

    fn iomem_key(&self) -> u32 {
        (self.base >> 32) as u32 * 16 + 3
    }

    /// Copies a remote write of `data` to `r` into this side's memory, if the key, range and
    /// (implicitly) rights allow it.
    fn place(&mut self, r: RemoteAddr, data: &[u8]) -> bool {
        let len = data.len() as u64;
        let io_at = self.base + IOMEM_AT;
        // Ends are computed with checked arithmetic: a hostile peer may name any address.
        let Some(end) = r.addr.checked_add(len) else {
            return false;
        };
        if r.rkey == self.iomem_key() && r.addr >= io_at && end <= io_at + self.iomem.len() as u64 {
            let off = (r.addr - io_at) as usize;
            self.iomem[off..off + data.len()].copy_from_slice(data);
            return true;
        }
        for (b, at, key) in [
            (Buf::Rbuf, self.keys.rbuf_addr, self.keys.rbuf_rkey),
            (Buf::Target, self.keys.target_addr, self.keys.target_rkey),
        ] {
            let size = self.buf(b).len() as u64;
            if r.rkey == key && r.addr >= at && end <= at + size {
                let off = (r.addr - at) as usize;
                self.buf_mut(b)[off..off + data.len()].copy_from_slice(data);
                return true;
            }
        }
        false
    }

    /// Returns parked receives once the withholding period is over.
    fn release_parked(&mut self) {
        if self.withhold_until.is_some_and(|t| self.now < t) {
            return;
        }
        self.withhold_until = None;
        self.recvs.extend(self.parked.drain(..));
    }
}

/// The state machine's view of one simulated side.
#[derive(Debug)]
pub struct SimIo<'a>(&'a mut SideState);

/// What an out-of-bounds read returns in place of memory the buffer does not have.
const POISON: u8 = 0xEE;

impl RsIo for SimIo<'_> {
    fn read(&self, buf: Buf, off: u32, dst: &mut [u8]) -> Result<(), OutOfBounds> {
        match self.0.range(buf, off, dst.len()) {
            Some(r) => {
                dst.copy_from_slice(&self.0.buf(buf)[r]);
                Ok(())
            }
            None => {
                // Should a caller ignore the error, it reads poison, not other memory.
                dst.fill(POISON);
                Err(OutOfBounds)
            }
        }
    }

    fn write(&mut self, buf: Buf, off: u32, src: &[u8]) -> Result<(), OutOfBounds> {
        let r = self.0.range(buf, off, src.len()).ok_or(OutOfBounds)?;
        self.0.buf_mut(buf)[r].copy_from_slice(src);
        Ok(())
    }

    fn post_send(&mut self, wr: &RsWr<'_>) -> Result<(), PostError> {
        let s = &mut *self.0;
        if s.sq.len() >= s.sq_cap {
            return Err(PostError {
                index: 0,
                kind: PostErrorKind::QueueFull,
            });
        }
        let refused = PostError {
            index: 0,
            kind: PostErrorKind::Unsupported,
        };
        let data = match wr.local {
            Local::Empty => Vec::new(),
            Local::Inline(b) => b.to_vec(),
            Local::Segs(a, b) => {
                let ra = s.range(a.buf, a.off, a.len as usize).ok_or(refused)?;
                let mut v = s.buf(a.buf)[ra].to_vec();
                if let Some(b) = b {
                    let rb = s.range(b.buf, b.off, b.len as usize).ok_or(refused)?;
                    v.extend_from_slice(&s.buf(b.buf)[rb]);
                }
                v
            }
        };
        if let Some(log) = &mut s.posted {
            log.push(PostedWr {
                wr_id: wr.wr_id,
                imm: wr.imm,
                remote: wr.remote,
                data: data.clone(),
            });
        }
        s.sq.push_back(InFlight {
            wr_id: wr.wr_id,
            imm: wr.imm,
            remote: wr.remote,
            data,
            due: s.now.saturating_add(s.latency),
        });
        Ok(())
    }

    fn post_recv(&mut self, wr_id: u64) -> Result<(), PostError> {
        let s = &mut *self.0;
        if s.withhold_until.is_some_and(|t| s.now < t) {
            s.parked.push_back(wr_id);
        } else {
            s.recvs.push_back(wr_id);
        }
        Ok(())
    }
}

/// Two connected sides over a simulated link.
#[derive(Debug)]
pub struct SimPair {
    /// The active side.
    pub a: SimSide,
    /// The passive side.
    pub b: SimSide,
    now: Instant,
    /// Delay before a waiting request is retried.
    pub rnr_delay: Duration,
}

impl SimPair {
    /// Creates and connects two sides with the same configuration.
    pub fn connect(cfg: StreamConfig, latency: Duration) -> Self {
        Self::connect2(cfg, cfg, latency)
    }

    /// Creates and connects two sides with their own configurations (as a listener's
    /// options and a client's may differ).
    pub fn connect2(ca: StreamConfig, cb: StreamConfig, latency: Duration) -> Self {
        let mut p = Self::unestablished(ca, cb, latency);
        let (ra, rb) = p.establish_with(|_, _| {});
        ra.expect("establish a");
        rb.expect("establish b");
        p
    }

    /// Like [`connect2`](Self::connect2), but `edit` may rewrite `b`'s connection data
    /// before `a` establishes with it (a broken or hostile peer). Returns `a`'s
    /// `establish` result; `b` establishes with `a`'s true data.
    ///
    /// # Panics
    /// If `b` cannot establish (which does not depend on `edit`).
    pub fn connect_edited(
        ca: StreamConfig,
        cb: StreamConfig,
        latency: Duration,
        edit: impl FnOnce(&mut ConnDataRepr),
    ) -> (Self, Result<(), RsError>) {
        let mut p = Self::unestablished(ca, cb, latency);
        let (ra, rb) = p.establish_with(|_, db| edit(db));
        rb.expect("establish b");
        (p, ra)
    }

    /// Creates two sides with their receives posted but not established yet (as between
    /// `rdma_connect` and the established event), so a test can inject completions that
    /// arrive before the connection data is processed, or tamper with that data.
    pub fn unestablished(ca: StreamConfig, cb: StreamConfig, latency: Duration) -> Self {
        let mut p = Self {
            a: SimSide::new(ca, 1 << 32, latency),
            b: SimSide::new(cb, 2 << 32, latency),
            now: Instant::from_nanos(0),
            rnr_delay: Duration::from_micros(10),
        };
        for s in [&mut p.a, &mut p.b] {
            s.with(|c, io| c.post_initial_recvs(io))
                .expect("initial receives");
        }
        p
    }

    /// Establishes both sides, each with the other's connection data after `tamper` has
    /// edited it (`tamper(a's data as b sees it, b's data as a sees it)`). Returns what
    /// `a` and `b` made of it.
    pub fn establish_with(
        &mut self,
        tamper: impl FnOnce(&mut ConnDataRepr, &mut ConnDataRepr),
    ) -> (Result<(), RsError>, Result<(), RsError>) {
        let now = self.now;
        let mut da: ConnDataRepr = self.a.conn.conn_data();
        let mut db: ConnDataRepr = self.b.conn.conn_data();
        tamper(&mut da, &mut db);
        let ra = self.a.with(|c, io| c.establish(&db, io, now));
        let rb = self.b.with(|c, io| c.establish(&da, io, now));
        (ra, rb)
    }

    /// Virtual time.
    pub fn now(&self) -> Instant {
        self.now
    }

    fn set_now(&mut self, t: Instant) {
        self.now = t;
        self.a.st.now = t;
        self.b.st.now = t;
    }

    /// The earliest time anything is due, if anything is pending.
    fn next_due(&self) -> Option<Instant> {
        let f = |s: &SimSide| s.st.sq.front().map(|w| w.due);
        let t = [
            f(&self.a),
            f(&self.b),
            self.a.conn.poll_timeout(),
            self.b.conn.poll_timeout(),
            self.a.st.withhold_until,
            self.b.st.withhold_until,
        ];
        t.into_iter().flatten().min()
    }

    /// Executes due requests of `from` towards `to`; returns true if anything happened.
    fn deliver(
        from: &mut SideState,
        to: &mut SideState,
        now: Instant,
        rnr_delay: Duration,
    ) -> bool {
        let mut did = false;
        while let Some(w) = from.sq.front() {
            if w.due > now {
                break;
            }
            let w = from.sq.pop_front().expect("front exists");
            did = true;
            let complete = |from: &mut SideState, w: &InFlight, status: WcStatus| {
                from.cq.push_back(Completion {
                    wr_id: w.wr_id,
                    status,
                    opcode: WcOpcode::RdmaWrite,
                    byte_len: 0,
                    imm: None,
                    qp_num: 1,
                    src_qp: 0,
                    invalidated: None,
                });
            };
            if from.error {
                complete(from, &w, WcStatus::WrFlushErr);
                continue;
            }
            if to.dead {
                complete(from, &w, WcStatus::RetryExcErr);
                from.error = true;
                continue;
            }
            if let Some((n, st)) = from.fail_next {
                from.fail_next = if n > 1 { Some((n - 1, st)) } else { None };
                complete(from, &w, st);
                from.error = true;
                continue;
            }
            if w.imm.is_some() && to.recvs.is_empty() {
                // Receiver not ready: retry later, keeping the request (and every later one)
                // at the head.
                from.rnr_waits += 1;
                let mut w = w;
                w.due = now.saturating_add(rnr_delay);
                from.sq.push_front(w);
                return did;
            }
            // Zero-length writes (credit updates, control messages, keepalives) check no key,
            // as on hardware.
            if !w.data.is_empty() && !to.place(w.remote, &w.data) {
                complete(from, &w, WcStatus::RemAccessErr);
                from.error = true;
                continue;
            }
            if let Some(imm) = w.imm {
                let r = to.recvs.pop_front().expect("checked non-empty");
                to.cq.push_back(Completion {
                    wr_id: r,
                    status: WcStatus::Success,
                    opcode: WcOpcode::RecvRdmaWithImm,
                    byte_len: w.data.len() as u32,
                    imm: Some(imm),
                    qp_num: 2,
                    src_qp: 0,
                    invalidated: None,
                });
            }
            complete(from, &w, WcStatus::Success);
        }
        did
    }

    /// One step: runs both applications' progress, delivers what is due, fires timers, and
    /// if nothing happened advances virtual time to the next due event. Returns false when
    /// nothing is pending at all.
    pub fn step(&mut self) -> bool {
        let mut did = self.a.progress() > 0;
        did |= self.b.progress() > 0;
        let now = self.now;
        did |= Self::deliver(&mut self.a.st, &mut self.b.st, now, self.rnr_delay);
        did |= Self::deliver(&mut self.b.st, &mut self.a.st, now, self.rnr_delay);
        for s in [&mut self.a, &mut self.b] {
            s.st.release_parked();
            if !s.st.dead && s.conn.poll_timeout().is_some_and(|t| t <= now) {
                s.with(|c, io| c.handle_timeout(now, io));
                did = true;
            }
        }
        if did {
            return true;
        }
        match self.next_due() {
            Some(t) if t > self.now => {
                self.set_now(t);
                true
            }
            Some(_) => true,
            None => false,
        }
    }

    /// Steps until nothing is pending or `max_steps` ran; returns the steps taken.
    ///
    /// # Panics
    /// If the pair is still busy after `max_steps` (a livelock), naming the step count.
    pub fn drive_bounded(&mut self, max_steps: usize) -> usize {
        for i in 0..max_steps {
            if !self.step_quiet() {
                return i;
            }
        }
        panic!("simulation still busy after {max_steps} steps: livelock");
    }

    /// Like `step`, but time-driven timers alone (keepalives) do not count as pending.
    fn step_quiet(&mut self) -> bool {
        let busy = |p: &Self| {
            !p.a.st.sq.is_empty()
                || !p.b.st.sq.is_empty()
                || !p.a.st.cq.is_empty()
                || !p.b.st.cq.is_empty()
        };
        let pending = busy(self);
        let did = self.step();
        pending || (did && busy(self))
    }

    /// Steps until idle (bounded at 1M steps).
    pub fn drive(&mut self) -> usize {
        self.drive_bounded(1_000_000)
    }

    /// Advances virtual time by `d`, stepping through everything due meanwhile.
    pub fn advance(&mut self, d: Duration) {
        let end = self.now.saturating_add(d);
        loop {
            let _ = self.step();
            match self.next_due() {
                Some(t) if t <= end => {
                    if t > self.now {
                        self.set_now(t);
                    }
                }
                _ => break,
            }
        }
        if end > self.now {
            self.set_now(end);
        }
        let _ = self.step();
    }

    /// Kills side `a` (`true`) or `b`: its requests stop executing, and the survivor's
    /// requests towards it fail with a transport retry error.
    pub fn kill(&mut self, a: bool) {
        let s = if a { &mut self.a.st } else { &mut self.b.st };
        s.dead = true;
        s.sq.clear();
        s.cq.clear();
    }

    /// True if side `a`/`b` saw an error completion.
    pub fn errored(&self, a: bool) -> bool {
        if a { self.a.st.error } else { self.b.st.error }
    }

    /// Side `a`'s base address (for tests that craft remote addresses).
    pub fn base(&self, a: bool) -> u64 {
        if a { self.a.st.base } else { self.b.st.base }
    }
}

// ------------------------------------------------------------------------------------------
// A hostile peer: the test plays one side's application (and what its NIC can be made to do)
// ------------------------------------------------------------------------------------------

impl SimPair {
    /// Side `a`'s state then `b`'s (`a_first`), or the other way round.
    fn states(&mut self, a_first: bool) -> (&mut SideState, &mut SideState) {
        if a_first {
            (&mut self.a.st, &mut self.b.st)
        } else {
            (&mut self.b.st, &mut self.a.st)
        }
    }

    /// Executes the due requests of side `a` (`from_a`) or `b` towards the other, as
    /// [`step`](Self::step) does, without running either state machine. Returns true if
    /// anything was executed.
    pub fn deliver_due(&mut self, from_a: bool) -> bool {
        let now = self.now;
        let rnr = self.rnr_delay;
        let (from, to) = self.states(from_a);
        Self::deliver(from, to, now, rnr)
    }

    /// Advances virtual time by `d` without stepping: nothing runs, not even timers (the
    /// test calls `handle_timeout` itself when `poll_timeout` says so).
    pub fn tick(&mut self, d: Duration) {
        let t = self.now.saturating_add(d);
        self.set_now(t);
        self.a.st.release_parked();
        self.b.st.release_parked();
    }

    /// The peer of side `to_a` RDMA-writes `data` to `remote` in that side's memory, with
    /// immediate `imm` if `Some`, checked against the side's keys and ranges as hardware
    /// checks them. Out of order with the peer's queued requests: it is not the peer's state
    /// machine that writes.
    pub fn peer_write(
        &mut self,
        to_a: bool,
        remote: RemoteAddr,
        data: &[u8],
        imm: Option<u32>,
    ) -> PeerWrite {
        let (to, _) = self.states(to_a);
        if imm.is_some() && to.recvs.is_empty() {
            return PeerWrite::NotReady;
        }
        if !data.is_empty() && !to.place(remote, data) {
            return PeerWrite::Rejected;
        }
        if imm.is_some() {
            let r = to.recvs.pop_front().expect("checked non-empty");
            to.cq.push_back(Completion {
                wr_id: r,
                status: WcStatus::Success,
                opcode: WcOpcode::RecvRdmaWithImm,
                byte_len: data.len() as u32,
                imm,
                qp_num: 2,
                src_qp: 0,
                invalidated: None,
            });
        }
        PeerWrite::Placed
    }

    /// Completes the next posted receive of side `to_a` with exactly these fields, whatever
    /// was written: more than a real peer can do (it cannot choose `byte_len` or `status`),
    /// so a state machine that survives this survives any peer. False (nothing queued) if no
    /// receive is posted.
    pub fn inject_recv(
        &mut self,
        to_a: bool,
        imm: Option<u32>,
        byte_len: u32,
        status: WcStatus,
    ) -> bool {
        let (to, _) = self.states(to_a);
        let Some(r) = to.recvs.pop_front() else {
            return false;
        };
        to.cq.push_back(Completion {
            wr_id: r,
            status,
            opcode: WcOpcode::RecvRdmaWithImm,
            byte_len,
            imm,
            qp_num: 2,
            src_qp: 0,
            invalidated: None,
        });
        true
    }
}

impl SideState {
    /// The addresses and keys of this side's buffers, as its peer learns them.
    pub fn keys(&self) -> LocalKeys {
        self.keys
    }

    /// Receives posted and not yet consumed.
    pub fn posted_recvs(&self) -> usize {
        self.recvs.len()
    }

    /// Requests posted and not yet executed.
    pub fn in_flight(&self) -> usize {
        self.sq.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{RsMsg, RsOp};

    fn cfg() -> StreamConfig {
        StreamConfig {
            sq_size: 16,
            rq_size: 16,
            sbuf_size: 4096,
            rbuf_size: 4096,
            sq_inline: 64,
            target_iomap_size: 0,
        }
    }

    #[test]
    fn hostile_peer_hooks_reach_side_a_only_where_its_keys_allow() {
        let (mut p, r) = SimPair::connect_edited(cfg(), cfg(), Duration::ZERO, |d| {
            d.credits = 1;
        });
        r.unwrap();
        p.a.st.posted = Some(Vec::new());
        let k = p.a.st.keys();
        let rbuf = RemoteAddr {
            addr: k.rbuf_addr,
            rkey: k.rbuf_rkey,
        };
        let imm = Some(RsMsg::with(RsOp::Data, 3).0);
        assert_eq!(p.peer_write(true, rbuf, b"abc", imm), PeerWrite::Placed);
        let past_end = RemoteAddr {
            addr: u64::MAX - 1,
            ..rbuf
        };
        assert_eq!(
            p.peer_write(true, past_end, b"abc", None),
            PeerWrite::Rejected
        );
        assert!(p.inject_recv(true, None, 0, WcStatus::WrFlushErr));
        p.a.progress();
        let mut buf = [0u8; 8];
        assert_eq!(p.a.with(|c, io| c.recv(&mut buf, false, io)), Ok(3));
        assert_eq!(&buf[..3], b"abc");
        // One credit granted: one data message, then the sender buffers (and posts
        // nothing more).
        assert_eq!(p.a.with(|c, io| c.send(&[7; 10], io)), Ok(10));
        assert_eq!(p.a.with(|c, io| c.send(&[8; 10], io)), Ok(10));
        let posted = p.a.st.posted.take().unwrap();
        assert!(posted.iter().any(|w| w.data == [7; 10]));
        assert!(
            !posted.iter().any(|w| w.data == [8; 10]),
            "posted beyond the credit"
        );
        assert_eq!(p.a.st.in_flight(), posted.len());
        p.tick(Duration::from_micros(1));
        assert!(p.deliver_due(true));
        assert_eq!(p.a.st.in_flight(), 0);
    }
}
