//! Reliable-connected queue pairs: creation through the RDMA CM, and posting.

use std::sync::Arc;

use rdma_sys as ffi;

use crate::chan::ChanInner;
use crate::conv::{self, send_flags, send_opcode};
use crate::cq::CqInner;
use crate::dev::DevInner;
use crate::pd::PdInner;
use crate::post::{RecvQueue, SendScratch, hw_sge, post_error};
use crate::sys::{self, IdPtr};
use crate::track::Track;
use crate::{MAX_SGE, Verbs};
use dp_fabric::error::{FabricError, PostError, PostErrorKind, Result};
use dp_fabric::traits::{ConnId, QpInit, RcQueuePair};
use dp_fabric::types::{Access, Payload, QpCaps, QpState, RecvWr, SendOp, SendWr};

/// Checks that the protection domain and completion queues of `init` live on device
/// context `ctx` (the one an id resolved to), which `rdma_create_qp` requires.
pub(crate) fn check_objects(ctx: *mut ffi::ibv_context, init: &QpInit<'_, Verbs>) -> Result<()> {
    let pd_dev = &init.pd.inner.dev;
    for (what, dev) in [
        ("protection domain", pd_dev),
        ("send completion queue", &init.send_cq.inner.dev),
        ("receive completion queue", &init.recv_cq.inner.dev),
    ] {
        if dev.ctx != ctx {
            // SAFETY: ctx is a live context of librdmacm (from a resolved or bound id).
            let want = unsafe { sys::c_string(ffi::ibv_get_device_name((*ctx).device)) };
            return Err(FabricError::InvalidArgument {
                what,
                why: format!(
                    "it belongs to RDMA device {}, but the address is reached through {want}: \
                     create it on a {want} device handle",
                    dev.name()
                ),
            });
        }
    }
    Ok(())
}

/// The capabilities to ask the device for, clamped to its limits.
pub(crate) fn qp_cap(dev: &DevInner, c: QpCaps) -> ffi::ibv_qp_cap {
    let a = &dev.attr;
    let max_sge = a.max_sge.clamp(1, MAX_SGE);
    ffi::ibv_qp_cap {
        max_send_wr: c.max_send_wr.clamp(1, a.max_qp_wr.max(1)),
        max_recv_wr: c.max_recv_wr.clamp(1, a.max_qp_wr.max(1)),
        max_send_sge: c.max_send_sge.clamp(1, max_sge),
        max_recv_sge: c.max_recv_sge.clamp(1, max_sge),
        max_inline_data: c.max_inline_data.min(a.max_inline_data),
    }
}

/// The granted capabilities as the model reports them (scatter counts capped at what this
/// provider posts).
pub(crate) fn granted(cap: &ffi::ibv_qp_cap) -> QpCaps {
    QpCaps {
        max_send_wr: cap.max_send_wr,
        max_recv_wr: cap.max_recv_wr,
        max_send_sge: cap.max_send_sge.min(MAX_SGE),
        max_recv_sge: cap.max_recv_sge.min(MAX_SGE),
        max_inline_data: cap.max_inline_data,
    }
}

/// A reliable-connected queue pair of the verbs provider: an `rdma_cm_id` with its QP.
///
/// Dropping it disconnects (the peer sees [`CmEvent::Disconnected`]), destroys the queue
/// pair and the id, and only then releases the channel, completion queues and protection
/// domain it holds.
///
/// [`CmEvent::Disconnected`]: dp_fabric::CmEvent::Disconnected
pub struct VerbsQp {
    id: IdPtr,
    qp: *mut ffi::ibv_qp,
    conn: ConnId,
    pub(crate) track: Arc<Track>,
    caps: QpCaps,
    max_send_size: u64,
    sq_posted: u64,
    sscratch: Box<SendScratch>,
    rq: RecvQueue,
    chan: Arc<ChanInner>,
    send_cq: Arc<CqInner>,
    recv_cq: Arc<CqInner>,
    pd: Arc<PdInner>,
}

// SAFETY: the queue pair is posted to only through &mut self; libibverbs allows posting and
// polling its completion queues from other threads. The id is touched by other threads only
// under the channel's connection-table lock, which Drop also takes before destroying it.
unsafe impl Send for VerbsQp {}

impl core::fmt::Debug for VerbsQp {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("VerbsQp")
            .field("qpn", &self.track.qpn)
            .field("conn", &self.conn)
            .field("state", &self.track.state())
            .field("caps", &self.caps)
            .finish()
    }
}

impl VerbsQp {
    /// Creates the queue pair of `id` (`rdma_create_qp`) and attaches it to its completion
    /// queues. On success the queue pair owns the id; on failure the caller still does.
    pub(crate) fn create(
        chan: &Arc<ChanInner>,
        id: IdPtr,
        init: &QpInit<'_, Verbs>,
        conn: ConnId,
    ) -> Result<Self> {
        let dev = &chan.dev;
        // SAFETY: plain data; the fields rdma_create_qp reads are set below.
        let mut ia: ffi::ibv_qp_init_attr = unsafe { core::mem::zeroed() };
        ia.send_cq = init.send_cq.inner.cq;
        ia.recv_cq = init.recv_cq.inner.cq;
        ia.qp_type = ffi::ibv_qp_type::IBV_QPT_RC;
        ia.cap = qp_cap(dev, init.caps);
        ia.sq_sig_all = 0;
        // SAFETY: id is live and resolved to the device of pd and the CQs (checked by the
        // caller); ia is a valid init attribute that receives the granted caps.
        if unsafe { ffi::rdma_create_qp(id.0, init.pd.inner.pd, &raw mut ia) } != 0 {
            return Err(FabricError::last_os("rdma_create_qp"));
        }
        // SAFETY: rdma_create_qp succeeded, so id->qp is the new, live queue pair.
        let qp = unsafe { (*id.0).qp };
        // SAFETY: as above; qp_num is plain data.
        let qpn = unsafe { (*qp).qp_num };
        let caps = granted(&ia.cap);
        let track = Arc::new(Track::new(qpn, caps.max_send_wr, caps.max_recv_wr, false));
        init.send_cq.inner.attach(&track);
        init.recv_cq.inner.attach(&track);
        Ok(Self {
            id,
            qp,
            conn,
            track,
            caps,
            max_send_size: dev.attr.max_send_size,
            sq_posted: 0,
            sscratch: SendScratch::new(),
            rq: RecvQueue::new(),
            chan: chan.clone(),
            send_cq: init.send_cq.inner.clone(),
            recv_cq: init.recv_cq.inner.clone(),
            pd: init.pd.inner.clone(),
        })
    }

    /// The state the hardware reports (`ibv_query_qp`, a system call), as opposed to
    /// [`RcQueuePair::state`], which is what this queue pair's events and completions have
    /// shown so far.
    ///
    /// # Errors
    /// If the query fails.
    pub fn hw_state(&self) -> Result<QpState> {
        // SAFETY: plain data filled by the query.
        let mut attr: ffi::ibv_qp_attr = unsafe { core::mem::zeroed() };
        // SAFETY: as above.
        let mut init: ffi::ibv_qp_init_attr = unsafe { core::mem::zeroed() };
        // SAFETY: qp is live while self is; the out-structs are writable.
        let rc = unsafe {
            ffi::ibv_query_qp(
                self.qp,
                &raw mut attr,
                ffi::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
                &raw mut init,
            )
        };
        if rc != 0 {
            return Err(FabricError::Io {
                op: "ibv_query_qp",
                source: sys::os_err(rc),
            });
        }
        Ok(conv::qp_state(attr.qp_state))
    }

    /// Validates one send request; `outstanding` counts requests not yet retired,
    /// including those already in the chain.
    fn check_send(
        &self,
        wr: &SendWr<'_>,
        state: QpState,
        outstanding: u64,
    ) -> core::result::Result<usize, PostErrorKind> {
        if !matches!(state, QpState::Rts | QpState::Error) {
            return Err(PostErrorKind::BadState(state));
        }
        // Binds and local invalidations carry no data (the bind's other rules are checked
        // against the domain's key table by `post_bind`).
        match wr.op {
            SendOp::BindMw { .. } if !wr.is_empty() => return Err(PostErrorKind::BadBind),
            SendOp::LocalInv(_) if !wr.is_empty() => return Err(PostErrorKind::Unsupported),
            _ => {}
        }
        let nsge = match wr.payload {
            Payload::Sgl(s) => {
                if s.len() > self.caps.max_send_sge as usize {
                    return Err(PostErrorKind::TooManySge);
                }
                s.len()
            }
            Payload::Inline(b) => {
                if matches!(wr.op, SendOp::Read(_)) {
                    return Err(PostErrorKind::Unsupported);
                }
                if b.len() > self.caps.max_inline_data as usize {
                    return Err(PostErrorKind::InlineTooLong);
                }
                usize::from(!b.is_empty())
            }
        };
        if wr.len() > self.max_send_size {
            return Err(PostErrorKind::MessageTooLong);
        }
        if outstanding >= u64::from(self.caps.max_send_wr) {
            return Err(PostErrorKind::QueueFull);
        }
        Ok(nsge)
    }

    /// Posts window bind `wr` (request `index` of the caller's slice) as a chain of its own,
    /// with the domain's key table locked: the window and the region must be in it (see
    /// [`Keys::check_bind`](crate::pd::Keys::check_bind)), and once the device took the
    /// request the window's `ibv_mw.rkey` is its new key.
    fn post_bind(
        &mut self,
        index: usize,
        wr: &SendWr<'_>,
        state: QpState,
        (rkey, lkey, access, addr, len): (u32, u32, Access, u64, u64),
    ) -> core::result::Result<(), PostError> {
        let pd = self.pd.clone();
        let keys = pd.keys();
        let Some((mw, mr)) = keys.check_bind(rkey, lkey, access, addr, len) else {
            return Err(PostError {
                index,
                kind: PostErrorKind::BadBind,
            });
        };
        let seq = self.sq_posted;
        let hw_id = self.track.stage_send(seq, wr.wr_id, wr.op.wc_opcode());
        let w = self.sscratch.push(
            hw_id,
            ffi::ibv_wr_opcode::IBV_WR_BIND_MW,
            send_flags(wr.flags, false),
            None,
            core::iter::empty(),
        );
        w.bind_mw_tso_union.bind_mw = ffi::bind_mw_t {
            mw,
            rkey,
            bind_info: ffi::ibv_mw_bind_info {
                mr: mr.mr,
                addr,
                length: len,
                mw_access_flags: conv::access_flags(access),
            },
        };
        self.flush_send(index, state)?;
        // SAFETY: mw is live while it is in the locked table; the device copied the
        // request, so the window's key is now the one it is bound under.
        unsafe { (*mw).rkey = rkey };
        Ok(())
    }

    /// Posts the chain built so far; `base` is the index of its first request in the
    /// caller's slice.
    fn flush_send(&mut self, base: usize, state: QpState) -> core::result::Result<(), PostError> {
        let n = self.sscratch.len();
        // SAFETY: qp is live; the chain's scatter lists name registered memory or inline
        // bytes borrowed from the caller's requests, which outlive this call.
        match unsafe { self.sscratch.post(self.qp) } {
            Ok(()) => {
                self.sq_posted += n as u64;
                Ok(())
            }
            Err((j, errno)) => {
                self.sq_posted += j as u64;
                Err(PostError {
                    index: base + j,
                    kind: post_error(errno, state),
                })
            }
        }
    }
}

impl Drop for VerbsQp {
    fn drop(&mut self) {
        // Out of the channel's table first (under its lock), so event handling and
        // `disconnect` never see the id again.
        let entry = self.chan.remove(self.conn);
        self.send_cq.detach(&self.track);
        self.recv_cq.detach(&self.track);
        if entry.is_some_and(|e| e.may_disconnect()) {
            // SAFETY: the id is live and ours alone now; a failure means there is no
            // connection to tear down.
            unsafe { ffi::rdma_disconnect(self.id.0) };
        }
        // SAFETY: the id and its QP are live and destroyed once, QP first. Nothing else
        // references them: the channel table entry is gone and the CQs no longer map the QPN.
        unsafe {
            ffi::rdma_destroy_qp(self.id.0);
            ffi::rdma_destroy_id(self.id.0);
        }
    }
}

impl RcQueuePair for VerbsQp {
    fn qp_num(&self) -> u32 {
        self.track.qpn
    }

    fn state(&self) -> QpState {
        self.track.state()
    }

    fn caps(&self) -> QpCaps {
        self.caps
    }

    fn conn_id(&self) -> ConnId {
        self.conn
    }

    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> core::result::Result<(), PostError> {
        let state = self.track.state();
        let mut retired = self.track.sq_retired();
        let mut base = 0;
        for (i, wr) in wrs.iter().enumerate() {
            let mut outstanding = self.sq_posted + self.sscratch.len() as u64 - retired;
            if outstanding >= u64::from(self.caps.max_send_wr) {
                retired = self.track.sq_retired();
                outstanding = self.sq_posted + self.sscratch.len() as u64 - retired;
            }
            let nsge = match self.check_send(wr, state, outstanding) {
                Ok(n) => n,
                Err(kind) => {
                    self.flush_send(base, state)?;
                    return Err(PostError { index: i, kind });
                }
            };
            if let SendOp::BindMw {
                rkey,
                lkey,
                access,
                addr,
                len,
            } = wr.op
            {
                // Alone in its chain: the device reads the window's current key from the
                // ibv_mw when the chain is posted (see pd::Keys).
                self.flush_send(base, state)?;
                self.post_bind(i, wr, state, (rkey, lkey, access, addr, len))?;
                base = i + 1;
                continue;
            }
            if self.sscratch.full(nsge) {
                self.flush_send(base, state)?;
                base = i;
            }
            let seq = self.sq_posted + self.sscratch.len() as u64;
            let hw_id = self.track.stage_send(seq, wr.wr_id, wr.op.wc_opcode());
            let (opcode, imm) = send_opcode(wr.op);
            let w = match wr.payload {
                // No scatter list, even of empty entries (devices refuse one).
                _ if matches!(wr.op, SendOp::LocalInv(_)) => self.sscratch.push(
                    hw_id,
                    opcode,
                    send_flags(wr.flags, false),
                    imm,
                    core::iter::empty(),
                ),
                Payload::Sgl(s) => {
                    let f = send_flags(wr.flags, false);
                    self.sscratch
                        .push(hw_id, opcode, f, imm, s.iter().map(hw_sge))
                }
                Payload::Inline(b) => {
                    let f = send_flags(wr.flags, true);
                    let sge = ffi::ibv_sge {
                        addr: b.as_ptr() as u64,
                        length: b.len() as u32,
                        lkey: 0,
                    };
                    self.sscratch.push(
                        hw_id,
                        opcode,
                        f,
                        imm,
                        (!b.is_empty()).then_some(sge).into_iter(),
                    )
                }
            };
            if let SendOp::Write(r) | SendOp::WriteImm(r, _) | SendOp::Read(r) = wr.op {
                w.wr.rdma = ffi::rdma_t {
                    remote_addr: r.addr,
                    rkey: r.rkey,
                };
            }
        }
        self.flush_send(base, state)
    }

    fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> core::result::Result<(), PostError> {
        // SAFETY: qp is live as long as self.
        unsafe { self.rq.post(self.qp, &self.track, &self.caps, wrs) }
    }

    fn move_to_error(&mut self) {
        self.track.set_state(QpState::Error);
        // SAFETY: plain data; only qp_state is read for this mask.
        let mut attr: ffi::ibv_qp_attr = unsafe { core::mem::zeroed() };
        attr.qp_state = ffi::ibv_qp_state::IBV_QPS_ERR;
        // SAFETY: qp is live as long as self; moving to ERR is valid from every state.
        // A failure (the device is gone) leaves nothing to flush.
        let _ = unsafe {
            ffi::ibv_modify_qp(
                self.qp,
                &raw mut attr,
                ffi::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
            )
        };
    }
}
