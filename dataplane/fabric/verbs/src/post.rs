//! Building and posting chains of work requests.
//!
//! Each queue pair owns one [`SendScratch`] and one [`RecvScratch`], allocated when it is
//! created: arrays of `ibv_send_wr`/`ibv_recv_wr` and `ibv_sge` that a `post_*` call fills
//! and links into one chain per [`CHUNK`] requests. Posting therefore never allocates, and
//! the chain's pointers point into the queue pair's own heap block, which does not move.

use std::ptr;

use rdma_sys as ffi;

use crate::track::Track;
use dp_fabric::error::{PostError, PostErrorKind};
use dp_fabric::types::{QpCaps, QpState, RecvWr, Sge};

/// Requests per `ibv_post_send`/`ibv_post_recv` call.
pub(crate) const CHUNK: usize = 16;
/// Scatter/gather entries per chain (at least `CHUNK` times one, and any one request's
/// [`MAX_SGE`](super::MAX_SGE)).
pub(crate) const CHUNK_SGE: usize = 64;

const _: () = assert!(CHUNK_SGE >= super::MAX_SGE as usize && CHUNK_SGE >= CHUNK);

/// Converts a scatter/gather entry.
#[inline]
pub(crate) fn hw_sge(s: &Sge) -> ffi::ibv_sge {
    ffi::ibv_sge {
        addr: s.addr,
        length: s.length,
        lkey: s.lkey,
    }
}

/// Maps the errno of a failed post to the model's reason.
pub(crate) fn post_error(errno: i32, state: QpState) -> PostErrorKind {
    match errno {
        libc::ENOMEM => PostErrorKind::QueueFull,
        libc::EINVAL if state != QpState::Rts => PostErrorKind::BadState(state),
        _ => PostErrorKind::Unsupported,
    }
}

/// A chain of send requests under construction.
pub(crate) struct SendScratch {
    wr: [ffi::ibv_send_wr; CHUNK],
    sge: [ffi::ibv_sge; CHUNK_SGE],
    n: usize,
    nsge: usize,
}

// SAFETY: the only pointers inside point into the same heap block (the chain links and
// scatter lists), written and used by the owning queue pair during one post call.
unsafe impl Send for SendScratch {}

impl SendScratch {
    pub(crate) fn new() -> Box<Self> {
        // SAFETY: every field is integers, raw pointers and unions of those, for which the
        // all-zero bit pattern is valid (null pointers, zero counts).
        Box::new(unsafe { core::mem::zeroed() })
    }

    /// Requests in the chain.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.n
    }

    /// True if a request with `nsge` entries does not fit any more.
    #[inline]
    pub(crate) fn full(&self, nsge: usize) -> bool {
        self.n == CHUNK || self.nsge + nsge > CHUNK_SGE
    }

    /// Appends a request and returns it, zeroed but for `wr_id`, opcode, flags, immediate
    /// and scatter list, for the caller to fill the operation's remote part.
    #[inline]
    pub(crate) fn push(
        &mut self,
        wr_id: u64,
        opcode: ffi::ibv_wr_opcode::Type,
        send_flags: u32,
        imm_be: Option<u32>,
        sges: impl Iterator<Item = ffi::ibv_sge>,
    ) -> &mut ffi::ibv_send_wr {
        let first = self.nsge;
        for s in sges {
            self.sge[self.nsge] = s;
            self.nsge += 1;
        }
        let n = self.nsge - first;
        let sg_list = if n == 0 {
            ptr::null_mut()
        } else {
            &raw mut self.sge[first]
        };
        let w = &mut self.wr[self.n];
        // SAFETY: as in `new`: the all-zero request is valid; it clears the previous use's
        // union fields.
        *w = unsafe { core::mem::zeroed() };
        w.wr_id = wr_id;
        w.opcode = opcode;
        w.send_flags = send_flags;
        w.sg_list = sg_list;
        w.num_sge = n as i32;
        if let Some(imm) = imm_be {
            w.imm_data_invalidated_rkey_union.imm_data = imm;
        }
        self.n += 1;
        w
    }

    /// Posts the chain and empties it. On failure returns the index (within the chain) of
    /// the first request not posted, and the errno.
    ///
    /// # Safety
    /// `qp` must be a live queue pair, and every scatter entry and inline buffer of the
    /// chain must be valid for the duration of the call (inline data is copied by it).
    pub(crate) unsafe fn post(&mut self, qp: *mut ffi::ibv_qp) -> Result<(), (usize, i32)> {
        let n = self.n;
        self.n = 0;
        self.nsge = 0;
        if n == 0 {
            return Ok(());
        }
        let base = self.wr.as_mut_ptr();
        for k in 0..n {
            // SAFETY: k and k + 1 are within the array (k + 1 only when k + 1 < n <= CHUNK).
            unsafe {
                (*base.add(k)).next = if k + 1 < n {
                    base.add(k + 1)
                } else {
                    ptr::null_mut()
                }
            };
        }
        let mut bad = ptr::null_mut();
        // SAFETY: qp is live (caller); the chain is n linked, fully initialised requests
        // whose scatter lists point into self.sge (caller vouches for the memory they name).
        let rc = unsafe { ffi::ibv_post_send(qp, base, &raw mut bad) };
        if rc == 0 {
            return Ok(());
        }
        let idx = if bad.is_null() {
            0
        } else {
            // SAFETY: a non-null bad_wr points into the chain we passed.
            unsafe { bad.offset_from(base) }.max(0) as usize
        };
        Err((idx.min(n), rc))
    }
}

/// A chain of receive requests under construction.
struct RecvScratch {
    wr: [ffi::ibv_recv_wr; CHUNK],
    sge: [ffi::ibv_sge; CHUNK_SGE],
    n: usize,
    nsge: usize,
}

// SAFETY: as for SendScratch.
unsafe impl Send for RecvScratch {}

impl RecvScratch {
    fn new() -> Box<Self> {
        // SAFETY: as in SendScratch::new.
        Box::new(unsafe { core::mem::zeroed() })
    }

    /// Requests in the chain.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.n
    }

    /// True if a request with `nsge` entries does not fit any more.
    #[inline]
    pub(crate) fn full(&self, nsge: usize) -> bool {
        self.n == CHUNK || self.nsge + nsge > CHUNK_SGE
    }

    /// Appends a receive.
    #[inline]
    pub(crate) fn push(&mut self, wr_id: u64, sgl: &[Sge]) {
        let first = self.nsge;
        for s in sgl {
            self.sge[self.nsge] = hw_sge(s);
            self.nsge += 1;
        }
        let w = &mut self.wr[self.n];
        w.wr_id = wr_id;
        w.next = ptr::null_mut();
        w.sg_list = if sgl.is_empty() {
            ptr::null_mut()
        } else {
            &raw mut self.sge[first]
        };
        w.num_sge = sgl.len() as i32;
        self.n += 1;
    }

    /// Posts the chain and empties it (as [`SendScratch::post`]).
    ///
    /// # Safety
    /// `qp` must be a live queue pair.
    pub(crate) unsafe fn post(&mut self, qp: *mut ffi::ibv_qp) -> Result<(), (usize, i32)> {
        let n = self.n;
        self.n = 0;
        self.nsge = 0;
        if n == 0 {
            return Ok(());
        }
        let base = self.wr.as_mut_ptr();
        for k in 0..n {
            // SAFETY: as in SendScratch::post.
            unsafe {
                (*base.add(k)).next = if k + 1 < n {
                    base.add(k + 1)
                } else {
                    ptr::null_mut()
                }
            };
        }
        let mut bad = ptr::null_mut();
        // SAFETY: qp is live; the chain is n linked, initialised receives. The memory they
        // name is registered (the hardware checks keys, ranges and rights).
        let rc = unsafe { ffi::ibv_post_recv(qp, base, &raw mut bad) };
        if rc == 0 {
            return Ok(());
        }
        let idx = if bad.is_null() {
            0
        } else {
            // SAFETY: a non-null bad_wr points into the chain we passed.
            unsafe { bad.offset_from(base) }.max(0) as usize
        };
        Err((idx.min(n), rc))
    }
}

/// The receive side of a queue pair as software posts it, the same for RC and UD: the chain
/// under construction and how many receives the hardware has accepted.
pub(crate) struct RecvQueue {
    scratch: Box<RecvScratch>,
    posted: u64,
}

impl RecvQueue {
    pub(crate) fn new() -> Self {
        Self {
            scratch: RecvScratch::new(),
            posted: 0,
        }
    }

    /// `post_recv` on `qp`, whose receive queue has capabilities `caps` and completions
    /// tracked by `track`: refuses a request with too many entries or beyond the queue's
    /// depth (after posting the ones before it), chains the rest [`CHUNK`] at a time.
    ///
    /// # Safety
    /// `qp` must be a live queue pair.
    pub(crate) unsafe fn post(
        &mut self,
        qp: *mut ffi::ibv_qp,
        track: &Track,
        caps: &QpCaps,
        wrs: &[RecvWr<'_>],
    ) -> Result<(), PostError> {
        let mut consumed = track.rq_consumed();
        let mut base = 0;
        for (i, wr) in wrs.iter().enumerate() {
            let refuse = if wr.sgl.len() > caps.max_recv_sge as usize {
                Some(PostErrorKind::TooManySge)
            } else {
                let mut outstanding = self.posted + self.scratch.len() as u64 - consumed;
                if outstanding >= u64::from(caps.max_recv_wr) {
                    consumed = track.rq_consumed();
                    outstanding = self.posted + self.scratch.len() as u64 - consumed;
                }
                (outstanding >= u64::from(caps.max_recv_wr)).then_some(PostErrorKind::QueueFull)
            };
            if let Some(kind) = refuse {
                // SAFETY: qp is live (caller).
                unsafe { self.flush(qp, track, base) }?;
                return Err(PostError { index: i, kind });
            }
            if self.scratch.full(wr.sgl.len()) {
                // SAFETY: as above.
                unsafe { self.flush(qp, track, base) }?;
                base = i;
            }
            let seq = self.posted + self.scratch.len() as u64;
            let hw_id = track.stage_recv(seq, wr.wr_id);
            self.scratch.push(hw_id, wr.sgl);
        }
        // SAFETY: as above.
        unsafe { self.flush(qp, track, base) }
    }

    /// Posts the chain; `base` is the index in the caller's slice of its first request.
    ///
    /// # Safety
    /// `qp` must be a live queue pair.
    unsafe fn flush(
        &mut self,
        qp: *mut ffi::ibv_qp,
        track: &Track,
        base: usize,
    ) -> Result<(), PostError> {
        let n = self.scratch.len();
        // SAFETY: qp is live (caller); receives name registered memory (checked by the
        // hardware).
        match unsafe { self.scratch.post(qp) } {
            Ok(()) => {
                self.posted += n as u64;
                Ok(())
            }
            Err((j, errno)) => {
                self.posted += j as u64;
                Err(PostError {
                    index: base + j,
                    kind: post_error(errno, track.state()),
                })
            }
        }
    }
}
