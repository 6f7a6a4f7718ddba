//! One UD queue pair per local source address (librdmacm's `ds_qp`).
//!
//! Each [`DsQp`] owns its completion queue, its queue pair (Q_Key
//! [`RDMA_UDP_QKEY`](super::RDMA_UDP_QKEY)) and one registered region laid out as
//!
//! ```text
//! [ send slot 0 .. send slot sq-1 | recv slot 0 .. recv slot rq-1 | GRH scratch (40 B) ]
//!   2048 B each                     2048 B each
//! ```
//!
//! Every receive has two scatter entries, as in librdmacm: the shared 40-byte GRH scratch
//! area (nobody reads it) and one 2048-byte slot, so a slot holds exactly what a peer's
//! 2048-byte send slot can carry. Every send is signalled; a send slot is free again when its
//! completion is polled. Slots are indices into the region, so the steady state allocates
//! nothing.

use std::net::IpAddr;
use std::sync::Arc;

use mempool::memory::{Region, RegionConfig};

use crate::error::RsError;
use crate::error::fabric_err;
use crate::wire::DsHeader;
use dp_fabric::{
    Access, Completion, CompletionQueue, Device, GRH_LEN, MemoryRegion, Payload, PostErrorKind,
    ProtectionDomain, Provider, QpCaps, QpInit, RecvWr, SendFlags, UdQueuePair, UdSendWr, WcStatus,
};

/// Bytes per send and receive slot: librdmacm's `RS_SNDLOWAT`.
pub(crate) const SLOT: usize = 2048;
/// Tag of receive work-request ids (send ids are the bare slot index).
pub(crate) const RECV_TAG: u64 = 1 << 32;
/// Largest datagram (header included) posted inline from a stack buffer.
pub(crate) const INLINE_MAX: usize = 256;

/// Queue sizes of every queue pair of one socket, fixed when its endpoint is set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// Send slots (= send queue entries).
    pub sq: u32,
    /// Receive slots (= receive queue entries).
    pub rq: u32,
    /// Datagrams up to this many bytes (header included) are posted inline.
    pub inline: u32,
    /// The device's path MTU: the largest UD payload.
    pub mtu: u32,
}

/// A UD queue pair bound to one local source address, with its slots.
pub(crate) struct DsQp<P: Provider> {
    /// The source address datagrams from this queue pair carry in their headers.
    pub ip: IpAddr,
    // Field order is drop order: the queue pair goes before its completion queue, and the
    // registration before the memory it covers.
    qp: P::UdQp,
    cq: P::Cq,
    mr: P::Mr,
    mem: Arc<Region>,
    geom: Geometry,
    /// Free send slots (a stack: the most recently freed slot is warm in cache).
    free_send: Vec<u16>,
    recv_base: usize,
    grh_off: usize,
}

impl<P: Provider> DsQp<P> {
    /// Creates the queue pair, its completion queue and slots, and posts every receive.
    pub(crate) fn new(
        dev: &P::Device,
        pd: &P::Pd,
        ip: IpAddr,
        geom: Geometry,
        qkey: u32,
    ) -> Result<Self, RsError> {
        let (sq, rq) = (geom.sq as usize, geom.rq as usize);
        let recv_base = sq * SLOT;
        let grh_off = recv_base + rq * SLOT;
        let len = grh_off + GRH_LEN as usize;
        let mem = Region::new(&RegionConfig::new("rsocket-dgram", len).no_huge().quiet())
            .map(Arc::new)
            .map_err(|_| RsError::NoMemory)?;
        let mr = pd
            .reg_region(&mem, 0, mem.len(), Access::LOCAL_WRITE)
            .map_err(|e| fabric_err(&e))?;
        let cq = dev
            .create_cq(geom.sq + geom.rq)
            .map_err(|e| fabric_err(&e))?;
        let init = QpInit {
            pd,
            send_cq: &cq,
            recv_cq: &cq,
            caps: QpCaps {
                max_send_wr: geom.sq,
                max_recv_wr: geom.rq,
                max_send_sge: 1,
                max_recv_sge: 2,
                max_inline_data: geom.inline,
            },
        };
        let qp = dev
            .create_ud_qp(&init, ip, qkey)
            .map_err(|e| fabric_err(&e))?;
        let mut q = Self {
            ip,
            qp,
            cq,
            mr,
            mem,
            geom,
            free_send: (0..geom.sq as u16).rev().collect(),
            recv_base,
            grh_off,
        };
        for slot in 0..geom.rq as u16 {
            if !q.post_recv(slot) {
                return Err(RsError::NoMemory);
            }
        }
        Ok(q)
    }

    /// The queue pair number peers address.
    pub(crate) fn qpn(&self) -> u32 {
        self.qp.qp_num()
    }

    /// Posts receive slot `slot` again. False if the queue pair refused it (it is broken).
    pub(crate) fn post_recv(&mut self, slot: u16) -> bool {
        let sgl = [
            self.mr.sge(self.grh_off, GRH_LEN),
            self.mr
                .sge(self.recv_base + usize::from(slot) * SLOT, SLOT as u32),
        ];
        self.qp
            .post_recv(&[RecvWr {
                wr_id: RECV_TAG | u64::from(slot),
                sgl: &sgl,
            }])
            .is_ok()
    }

    /// True if a send slot is free.
    pub(crate) fn can_send(&self) -> bool {
        !self.free_send.is_empty()
    }

    /// Sends `hdr` + `payload` to `dest` from a free slot (inline when small enough).
    ///
    /// # Errors
    /// [`RsError::WouldBlock`] without a free slot; [`RsError::MsgSize`] if the provider
    /// finds the datagram longer than its MTU (callers check the size first).
    pub(crate) fn send(
        &mut self,
        dest: &P::UdDest,
        hdr: &DsHeader,
        payload: &[u8],
    ) -> Result<(), RsError> {
        let Some(slot) = self.free_send.pop() else {
            return Err(RsError::WouldBlock);
        };
        let hlen = hdr.buffer_len();
        let total = hlen + payload.len();
        debug_assert!(total <= SLOT, "callers check datagram sizes");
        let mut stack = [0u8; INLINE_MAX];
        let sge;
        let data = if total <= self.geom.inline as usize {
            hdr.emit(&mut stack[..hlen]);
            stack[hlen..total].copy_from_slice(payload);
            Payload::Inline(&stack[..total])
        } else {
            let off = usize::from(slot) * SLOT;
            hdr.emit(&mut stack[..hlen]);
            self.mem.copy_in(off, &stack[..hlen]);
            self.mem.copy_in(off + hlen, payload);
            sge = [self.mr.sge(off, total as u32)];
            Payload::Sgl(&sge)
        };
        let r = self.qp.post_send(&[UdSendWr {
            wr_id: u64::from(slot),
            dest,
            payload: data,
            flags: SendFlags::SIGNALED,
            imm: None,
        }]);
        match r {
            Ok(()) => Ok(()),
            Err(e) => {
                self.free_send.push(slot);
                Err(match e.kind {
                    PostErrorKind::QueueFull => RsError::WouldBlock,
                    PostErrorKind::MessageTooLong => RsError::MsgSize,
                    _ => RsError::Io,
                })
            }
        }
    }

    /// Polls up to `out.len()` completions.
    pub(crate) fn poll(&mut self, out: &mut [Completion]) -> usize {
        self.cq.poll(out)
    }

    /// Frees the slot of a send completion; false if the send failed.
    pub(crate) fn complete_send(&mut self, c: &Completion) -> bool {
        let slot = (c.wr_id & 0xFFFF) as u16;
        if u32::from(slot) < self.geom.sq && self.free_send.len() < self.geom.sq as usize {
            self.free_send.push(slot);
        }
        c.is_ok()
    }

    /// Sends posted whose completion has not been polled yet.
    pub(crate) fn outstanding(&self) -> usize {
        self.geom.sq as usize - self.free_send.len()
    }

    /// Copies bytes of receive slot `slot`, from `off`, into `dst`.
    pub(crate) fn read(&self, slot: u16, off: usize, dst: &mut [u8]) {
        debug_assert!(off + dst.len() <= SLOT);
        self.mem
            .copy_out(self.recv_base + usize::from(slot) * SLOT + off, dst);
    }

    /// True if the receive completion `c` names one of this queue pair's receive slots.
    pub(crate) fn recv_slot(&self, c: &Completion) -> Option<u16> {
        let slot = c.wr_id & !RECV_TAG;
        (c.wr_id & RECV_TAG != 0 && slot < u64::from(self.geom.rq)).then_some(slot as u16)
    }

    /// True if the completion reports a flushed (dead) queue pair: its receive must not be
    /// posted again.
    pub(crate) fn is_flush(c: &Completion) -> bool {
        c.status == WcStatus::WrFlushErr
    }
}
