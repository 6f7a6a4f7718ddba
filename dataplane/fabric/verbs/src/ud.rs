//! Unreliable-datagram queue pairs and their destinations (address handles).
//!
//! A UD queue pair is created directly with libibverbs and brought to RTS at once: the port
//! and P_Key index come from binding a throw-away RDMA CM id to the local address, the
//! Q_Key is the caller's. A destination is resolved like a connection (address and route,
//! synchronously) and turned into an address handle: on RoCE always with a GRH whose source
//! GID index is looked up in the port's GID table (RoCE v2 preferred), on InfiniBand with
//! the path's LID and, when the path leaves the subnet, a GRH.
//!
//! Each posted datagram keeps an `Arc` of its address handle in a per-queue-pair slot until
//! the slot is reused (which the send-queue accounting allows only after the request
//! retired), so dropping a [`VerbsUdDest`] while a send to it is in flight is safe.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use rdma_sys as ffi;

use crate::Verbs;
use crate::conv::send_flags;
use crate::cq::CqInner;
use crate::dev::DevInner;
use crate::pd::{PdInner, VerbsPd};
use crate::post::{RecvQueue, SendScratch, hw_sge, post_error};
use crate::qp::{check_objects, granted, qp_cap};
use crate::resolve::TempId;
use crate::sys::{self, LINK_LAYER_ETHERNET};
use crate::track::Track;
use dp_fabric::error::{FabricError, PostError, PostErrorKind, Result};
use dp_fabric::traits::{QpInit, UdQueuePair, UdSendWr};
use dp_fabric::types::{Payload, QpCaps, QpState, RecvWr, WcOpcode};

/// An address handle.
pub(crate) struct AhInner {
    ah: *mut ffi::ibv_ah,
    pd: Arc<PdInner>,
}

// SAFETY: address handles are immutable after creation and may be used from any thread.
unsafe impl Send for AhInner {}
// SAFETY: as above.
unsafe impl Sync for AhInner {}

impl Drop for AhInner {
    fn drop(&mut self) {
        // SAFETY: ah came from ibv_create_ah and is destroyed once; no posted request uses it
        // (each keeps an Arc until it retired).
        unsafe { ffi::ibv_destroy_ah(self.ah) };
    }
}

/// A resolved datagram destination: address handle, remote QPN and Q_Key.
pub struct VerbsUdDest {
    ah: Arc<AhInner>,
    remote_qpn: u32,
    qkey: u32,
    remote: IpAddr,
}

impl core::fmt::Debug for VerbsUdDest {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("VerbsUdDest")
            .field("remote", &self.remote)
            .field("qpn", &self.remote_qpn)
            .field("qkey", &format_args!("{:#x}", self.qkey))
            .finish()
    }
}

impl VerbsUdDest {
    /// The peer's queue pair number.
    pub fn remote_qpn(&self) -> u32 {
        self.remote_qpn
    }

    /// The Q_Key datagrams to it carry.
    pub fn qkey(&self) -> u32 {
        self.qkey
    }

    pub(crate) fn resolve(
        dev: &Arc<DevInner>,
        pd: &VerbsPd,
        local: IpAddr,
        remote: IpAddr,
        remote_qpn: u32,
        qkey: u32,
    ) -> Result<Self> {
        let t = TempId::resolve(
            dev,
            ffi::rdma_port_space::RDMA_PS_UDP,
            Some(local),
            SocketAddr::new(remote, 0),
            0,
        )?;
        if t.verbs() != pd.inner.dev.ctx {
            return Err(FabricError::InvalidArgument {
                what: "protection domain",
                why: format!(
                    "{remote} is reached through another RDMA device than {}'s",
                    pd.inner.dev.name()
                ),
            });
        }
        let port = t.port();
        // SAFETY: the id is resolved, so its route holds num_paths path records.
        let (num_paths, path) = unsafe { ((*t.id()).route.num_paths, (*t.id()).route.path_rec) };
        if num_paths < 1 || path.is_null() {
            return Err(FabricError::Io {
                op: "RDMA route resolution (no path record for the destination)",
                source: sys::os_err(libc::EHOSTUNREACH),
            });
        }
        // SAFETY: path points at the first of num_paths >= 1 records, live while the id is.
        let p = unsafe { &*path };
        // SAFETY: plain data; every field the provider reads is set below.
        let mut attr: ffi::ibv_ah_attr = unsafe { core::mem::zeroed() };
        attr.port_num = port;
        attr.sl = p.sl;
        let roce = dev.link_layer == LINK_LAYER_ETHERNET;
        if !roce {
            attr.dlid = u16::from_be(p.dlid);
        }
        if roce || p.hop_limit > 1 {
            // SAFETY: every bit pattern of the GID union is a valid byte array.
            let sgid = unsafe { p.sgid.raw };
            attr.is_global = 1;
            attr.grh.dgid = p.dgid;
            attr.grh.sgid_index = dev.gid_index(port, &sgid)?;
            attr.grh.hop_limit = if p.hop_limit == 0 { 64 } else { p.hop_limit };
            attr.grh.traffic_class = p.traffic_class;
            attr.grh.flow_label = u32::from_be(p.flow_label);
        }
        // SAFETY: pd is live; attr is a complete address vector for port `port`.
        let ah = unsafe { ffi::ibv_create_ah(pd.inner.pd, &raw mut attr) };
        if ah.is_null() {
            return Err(FabricError::last_os("ibv_create_ah"));
        }
        Ok(Self {
            ah: Arc::new(AhInner {
                ah,
                pd: pd.inner.clone(),
            }),
            remote_qpn,
            qkey,
            remote,
        })
    }
}

/// An unreliable-datagram queue pair of the verbs provider.
pub struct VerbsUdQp {
    qp: *mut ffi::ibv_qp,
    track: Arc<Track>,
    qkey: u32,
    caps: QpCaps,
    mtu: u32,
    sq_posted: u64,
    sscratch: Box<SendScratch>,
    rq: RecvQueue,
    /// Address handle of each send slot's request (see the module docs).
    ah_keep: Box<[Option<Arc<AhInner>>]>,
    send_cq: Arc<CqInner>,
    recv_cq: Arc<CqInner>,
    pd: Arc<PdInner>,
}

// SAFETY: posted to only through &mut self; libibverbs allows polling its completion queues
// from other threads.
unsafe impl Send for VerbsUdQp {}

impl core::fmt::Debug for VerbsUdQp {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("VerbsUdQp")
            .field("qpn", &self.track.qpn)
            .field("qkey", &format_args!("{:#x}", self.qkey))
            .field("state", &self.track.state())
            .finish()
    }
}

impl Drop for VerbsUdQp {
    fn drop(&mut self) {
        self.send_cq.detach(&self.track);
        self.recv_cq.detach(&self.track);
        // SAFETY: qp came from ibv_create_qp and is destroyed once; the CQs no longer map it.
        unsafe { ffi::ibv_destroy_qp(self.qp) };
    }
}

/// Modifies `qp` with `attr` under `mask`.
///
/// # Safety
/// `qp` must be live.
unsafe fn modify(
    qp: *mut ffi::ibv_qp,
    attr: &mut ffi::ibv_qp_attr,
    mask: ffi::ibv_qp_attr_mask,
    what: &'static str,
) -> Result<()> {
    // SAFETY: caller's guarantee; attr is valid for the call.
    let rc = unsafe { ffi::ibv_modify_qp(qp, attr, mask.0 as i32) };
    if rc != 0 {
        return Err(FabricError::Io {
            op: what,
            source: sys::os_err(rc),
        });
    }
    Ok(())
}

impl VerbsUdQp {
    pub(crate) fn new(
        dev: &Arc<DevInner>,
        init: &QpInit<'_, Verbs>,
        local: IpAddr,
        qkey: u32,
    ) -> Result<Self> {
        check_objects(dev.ctx, init)?;
        let bound = TempId::bind(ffi::rdma_port_space::RDMA_PS_UDP, local)?;
        if bound.verbs() != dev.ctx {
            return Err(FabricError::InvalidArgument {
                what: "local address",
                why: format!("{local} is not an address of RDMA device {}", dev.name()),
            });
        }
        let port = bound.port();
        // SAFETY: the id is bound; its route's IB address holds the P_Key (0xffff on RoCE).
        let pkey = unsafe { (*bound.id()).route.addr.addr.ibaddr.pkey };
        // SAFETY: ctx is live; port is one of its ports.
        let pkey_index = unsafe { ffi::ibv_get_pkey_index(dev.ctx, port, pkey) }.max(0);
        drop(bound);

        // SAFETY: plain data; the fields ibv_create_qp reads are set below.
        let mut ia: ffi::ibv_qp_init_attr = unsafe { core::mem::zeroed() };
        ia.send_cq = init.send_cq.inner.cq;
        ia.recv_cq = init.recv_cq.inner.cq;
        ia.qp_type = ffi::ibv_qp_type::IBV_QPT_UD;
        ia.cap = qp_cap(dev, init.caps);
        // SAFETY: pd and the CQs are live objects of dev (checked above).
        let qp = unsafe { ffi::ibv_create_qp(init.pd.inner.pd, &raw mut ia) };
        if qp.is_null() {
            return Err(FabricError::last_os("ibv_create_qp (UD)"));
        }
        let destroy = |e| {
            // SAFETY: qp was created above and is destroyed once, on this error path.
            unsafe { ffi::ibv_destroy_qp(qp) };
            e
        };
        use ffi::ibv_qp_attr_mask as m;
        // SAFETY: plain data; each transition sets the fields its mask names.
        let mut a: ffi::ibv_qp_attr = unsafe { core::mem::zeroed() };
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = u16::try_from(pkey_index).unwrap_or(0);
        a.port_num = port;
        a.qkey = qkey;
        // SAFETY: qp is live.
        unsafe {
            modify(
                qp,
                &mut a,
                m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_QKEY,
                "ibv_modify_qp (UD to INIT)",
            )
        }
        .map_err(destroy)?;
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTR;
        // SAFETY: as above.
        unsafe { modify(qp, &mut a, m::IBV_QP_STATE, "ibv_modify_qp (UD to RTR)") }
            .map_err(destroy)?;
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = 0;
        // SAFETY: as above.
        unsafe {
            modify(
                qp,
                &mut a,
                m::IBV_QP_STATE | m::IBV_QP_SQ_PSN,
                "ibv_modify_qp (UD to RTS)",
            )
        }
        .map_err(destroy)?;

        // SAFETY: qp is live; qp_num is plain data.
        let qpn = unsafe { (*qp).qp_num };
        let caps = granted(&ia.cap);
        let track = Arc::new(Track::new(qpn, caps.max_send_wr, caps.max_recv_wr, true));
        track.set_state(QpState::Rts);
        init.send_cq.inner.attach(&track);
        init.recv_cq.inner.attach(&track);
        let slots = (caps.max_send_wr.max(1) as usize).next_power_of_two();
        Ok(Self {
            qp,
            track,
            qkey,
            caps,
            mtu: dev.attr.mtu,
            sq_posted: 0,
            sscratch: SendScratch::new(),
            rq: RecvQueue::new(),
            ah_keep: (0..slots).map(|_| None).collect(),
            send_cq: init.send_cq.inner.clone(),
            recv_cq: init.recv_cq.inner.clone(),
            pd: init.pd.inner.clone(),
        })
    }

    /// Capabilities granted by the device.
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    fn check_send(
        &self,
        wr: &UdSendWr<'_, Verbs>,
        outstanding: u64,
    ) -> core::result::Result<usize, PostErrorKind> {
        let nsge = match wr.payload {
            Payload::Sgl(s) => {
                if s.len() > self.caps.max_send_sge as usize {
                    return Err(PostErrorKind::TooManySge);
                }
                s.len()
            }
            Payload::Inline(b) => {
                if b.len() > self.caps.max_inline_data as usize {
                    return Err(PostErrorKind::InlineTooLong);
                }
                usize::from(!b.is_empty())
            }
        };
        if wr.payload.len() > u64::from(self.mtu) {
            return Err(PostErrorKind::MessageTooLong);
        }
        if !Arc::ptr_eq(&wr.dest.ah.pd, &self.pd) {
            // An address handle of another protection domain cannot be used here.
            return Err(PostErrorKind::Unsupported);
        }
        if outstanding >= u64::from(self.caps.max_send_wr) {
            return Err(PostErrorKind::QueueFull);
        }
        Ok(nsge)
    }

    fn flush_send(&mut self, base: usize) -> core::result::Result<(), PostError> {
        let n = self.sscratch.len();
        // SAFETY: qp is live; scatter lists name registered memory or inline bytes borrowed
        // from the caller's requests; every address handle is kept alive by ah_keep.
        match unsafe { self.sscratch.post(self.qp) } {
            Ok(()) => {
                self.sq_posted += n as u64;
                Ok(())
            }
            Err((j, errno)) => {
                self.sq_posted += j as u64;
                Err(PostError {
                    index: base + j,
                    kind: post_error(errno, self.track.state()),
                })
            }
        }
    }
}

impl UdQueuePair for VerbsUdQp {
    type P = Verbs;

    fn qp_num(&self) -> u32 {
        self.track.qpn
    }

    fn qkey(&self) -> u32 {
        self.qkey
    }

    fn post_send(&mut self, wrs: &[UdSendWr<'_, Verbs>]) -> core::result::Result<(), PostError> {
        let mut retired = self.track.sq_retired();
        let mut base = 0;
        for (i, wr) in wrs.iter().enumerate() {
            let mut outstanding = self.sq_posted + self.sscratch.len() as u64 - retired;
            if outstanding >= u64::from(self.caps.max_send_wr) {
                retired = self.track.sq_retired();
                outstanding = self.sq_posted + self.sscratch.len() as u64 - retired;
            }
            let nsge = match self.check_send(wr, outstanding) {
                Ok(n) => n,
                Err(kind) => {
                    self.flush_send(base)?;
                    return Err(PostError { index: i, kind });
                }
            };
            if self.sscratch.full(nsge) {
                self.flush_send(base)?;
                base = i;
            }
            let seq = self.sq_posted + self.sscratch.len() as u64;
            let hw_id = self.track.stage_send(seq, wr.wr_id, WcOpcode::Send);
            // The slot's previous request retired (accounting above), so its handle may go.
            let slot = (seq as usize) & (self.ah_keep.len() - 1);
            self.ah_keep[slot] = Some(wr.dest.ah.clone());
            let (opcode, imm) = match wr.imm {
                Some(v) => (ffi::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM, Some(v.to_be())),
                None => (ffi::ibv_wr_opcode::IBV_WR_SEND, None),
            };
            let w = match wr.payload {
                Payload::Sgl(s) => self.sscratch.push(
                    hw_id,
                    opcode,
                    send_flags(wr.flags, false),
                    imm,
                    s.iter().map(hw_sge),
                ),
                Payload::Inline(b) => {
                    let sge = ffi::ibv_sge {
                        addr: b.as_ptr() as u64,
                        length: b.len() as u32,
                        lkey: 0,
                    };
                    self.sscratch.push(
                        hw_id,
                        opcode,
                        send_flags(wr.flags, true),
                        imm,
                        (!b.is_empty()).then_some(sge).into_iter(),
                    )
                }
            };
            w.wr.ud = ffi::ud_t {
                ah: wr.dest.ah.ah,
                remote_qpn: wr.dest.remote_qpn,
                remote_qkey: wr.dest.qkey,
            };
        }
        self.flush_send(base)
    }

    fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> core::result::Result<(), PostError> {
        // SAFETY: qp is live as long as self.
        unsafe { self.rq.post(self.qp, &self.track, &self.caps, wrs) }
    }
}
