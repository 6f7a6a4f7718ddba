//! One connection of the fabric transport: its queue pair, completion queues and receive
//! ring, and the data path over them (receives in, frames out, completions).
//!
//! Each connection has its own memory: a region holding `recv_depth` receive buffers of
//! [`RECV_BUF`] bytes (header + 4 KiB fragment) and the send-header slots, registered for
//! local access only. No key of this memory is ever given to a peer, so a peer can only
//! SEND into the buffers we posted on its connection; it can never touch another
//! connection's buffers or the engine's message store (the only keys a peer gets are those
//! of RDMA regions the application registered in the window: see the module `rdma`). Every received byte is copied out of the buffer
//! (a snapshot) before the engine parses it, and the engine checks every field: a
//! violation resets this connection only.

use std::collections::VecDeque;
use std::sync::Arc;

use dp_fabric::{
    Access, Completion, ConnId, Device, MemoryRegion, Payload, PostError, ProtectionDomain,
    Provider, QpCaps, QpInit, RcQueuePair, RecvWr, RemoteAddr, SendFlags, SendOp, SendWr, Sge,
    WcStatus,
};
use dp_fabric::{CompletionQueue, FabricError};
use lcore::time::Instant;
use mempool::memory::{Region, RegionConfig};

use super::config::{FabricConfig, FabricStats, HDR_SLOT, RECV_BUF};
use crate::engine::RdsEngine;
use crate::path::{FrameKind, PathId, TxFrame};
use crate::uapi::{RDS_RDMA_OTHER_ERROR, RDS_RDMA_REMOTE_ERROR};
use crate::wire::HEADER_LEN;

/// The solicited-event flag of `frame` (`rds_ib_xmit`, `rds_ib_send_ack`): the last frame
/// of a message or update and every ACK-only frame raise a *solicited event* at the peer.
/// Linux arms its receive completion queue for solicited events only
/// (`ib_req_notify_cq(i_recv_cq, IB_CQ_SOLICITED)`): without the flag it never looks at
/// what arrived, and neither answers nor acks.
pub(crate) fn solicit_flags(frame: &TxFrame) -> SendFlags {
    if frame.last || frame.kind == FrameKind::Ack {
        SendFlags::SOLICITED
    } else {
        SendFlags::NONE
    }
}

/// Requests completions on the SENDs of one post list (`sends` in posting order, then its
/// `last`), counting unsignalled SENDs in `unsignaled`: at least every `signal_every`
/// SENDs, and on the list's last SEND. Completions are reported cumulatively (a token
/// covers every frame posted before it), so one per list tells the engine of all its
/// frames, and none is left waiting for a later post: the list's last frame (a message's
/// last fragment or an ACK among them) always completes.
pub(crate) fn signal_list<'a>(
    unsignaled: &mut u32,
    sends: impl Iterator<Item = &'a mut SendFlags>,
    last: &mut SendFlags,
    signal_every: u32,
) {
    for f in sends {
        if *unsignaled + 1 >= signal_every {
            *unsignaled = 0;
            *f = *f | SendFlags::SIGNALED;
        } else {
            *unsignaled += 1;
        }
    }
    *unsignaled = 0;
    *last = *last | SendFlags::SIGNALED;
}

/// Where a connection is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LinkState {
    /// We sent a connect request; waiting for the reply.
    Connecting,
    /// We accepted a request; waiting for the peer's ready-to-use.
    Accepting,
    /// Established: frames flow.
    Up,
    /// Failed (disconnect event, error completion, failed post): nothing more is posted or
    /// reported; the engine was told and will send a disconnect command.
    Broken,
}

/// A connection's memory and completion queues, made before its queue pair.
pub(crate) struct LinkRes<P: Provider> {
    pub(crate) scq: P::Cq,
    pub(crate) rcq: P::Cq,
    /// Registration of `ring` (declared before it: dropped first).
    pub(crate) mr: P::Mr,
    pub(crate) ring: Arc<Region>,
    pub(crate) recv_depth: u32,
    pub(crate) hdr_slots: u32,
}

impl<P: Provider> LinkRes<P> {
    /// Makes the region, its registration and the completion queues of a new connection
    /// whose paths send at most `send_depth` data frames at once (plus one ACK-only frame).
    pub(crate) fn new(
        dev: &P::Device,
        pd: &P::Pd,
        cfg: &FabricConfig,
        send_depth: u32,
        name: &str,
    ) -> Result<Self, FabricError> {
        let hdr_slots = send_depth + 2;
        let len = cfg.recv_depth as usize * RECV_BUF + hdr_slots as usize * HDR_SLOT;
        let ring =
            Region::new(&RegionConfig::new(name, len).quiet()).map_err(|e| FabricError::Io {
                op: "allocating an RDS connection's receive ring",
                source: std::io::Error::other(e.to_string()),
            })?;
        let ring = Arc::new(ring);
        let mr = pd.reg_region(&ring, 0, len, Access::LOCAL_WRITE)?;
        // Each frame may be preceded by its message's RDMA operation.
        let scq = dev.create_cq(2 * hdr_slots + 1)?;
        let rcq = dev.create_cq(cfg.recv_depth)?;
        Ok(Self {
            scq,
            rcq,
            mr,
            ring,
            recv_depth: cfg.recv_depth,
            hdr_slots,
        })
    }

    /// The queue pair's sizes: every data frame plus the ACK-only frame in flight, each
    /// possibly preceded by an RDMA operation, two scatter entries (header, fragment), one
    /// receive entry.
    pub(crate) fn caps(&self, cfg: &FabricConfig) -> QpCaps {
        QpCaps {
            max_send_wr: 2 * self.hdr_slots,
            max_recv_wr: self.recv_depth,
            max_send_sge: 2,
            max_recv_sge: 1,
            max_inline_data: cfg.inline_max.min(INLINE_CAP as u32),
        }
    }

    /// The init block for creating the queue pair.
    pub(crate) fn init<'a>(&'a self, pd: &'a P::Pd, cfg: &FabricConfig) -> QpInit<'a, P> {
        QpInit {
            pd,
            send_cq: &self.scq,
            recv_cq: &self.rcq,
            caps: self.caps(cfg),
        }
    }

    fn recv_sge(&self, idx: u32) -> Sge {
        self.mr.sge(idx as usize * RECV_BUF, RECV_BUF as u32)
    }

    /// Posts every receive buffer (before the connect request or the accept leaves).
    pub(crate) fn post_all_recvs(&self, qp: &mut P::Qp) -> Result<(), FabricError> {
        for idx in 0..self.recv_depth {
            let sge = [self.recv_sge(idx)];
            qp.post_recv(&[RecvWr {
                wr_id: u64::from(idx),
                sgl: &sge,
            }])
            .map_err(|_| {
                FabricError::BadState("posting an RDS connection's receive ring failed")
            })?;
        }
        Ok(())
    }
}

/// One connection.
pub(crate) struct Link<P: Provider> {
    /// Declared first: dropped (disconnected, flushed, destroyed) before its memory.
    pub(crate) qp: P::Qp,
    pub(crate) res: LinkRes<P>,
    pub(crate) conn: ConnId,
    pub(crate) state: LinkState,
    /// Received frames not yet taken by the engine (buffer index, length), in order: the
    /// engine refused the first (store full), so the rest wait behind it.
    pending: VecDeque<(u32, u32)>,
    /// SENDs posted since the last signalled one.
    unsignaled: u32,
    /// The largest inline frame this queue pair takes (at most [`INLINE_CAP`]).
    inline_max: usize,
    /// The post list: work requests staged by [`transmit`](Self::transmit) since the last
    /// [`post_staged`](Self::post_staged) (at most [`POST_BATCH`]; made once).
    staged: Vec<Staged>,
    /// Where staged inline frames are assembled, one after the other ([`POST_BATCH`]
    /// frames of `inline_max` bytes; made once: no zeroing per frame).
    inline_area: Box<[u8]>,
    /// Bytes of `inline_area` the staged frames use.
    inline_used: usize,
    /// The peer's RDMA window base, as it announced it in the connection's private data
    /// (0: none announced, so its cookies are zero-based, as a kernel peer's are).
    pub(crate) peer_base: u64,
    /// An IPv6 connection (its RDS-IB private data is the 56-byte form).
    pub(crate) v6: bool,
}

/// The bit of a work-request id that marks an RDMA operation (the rest is the token of
/// the frame it precedes).
pub(crate) const RDMA_WR: u64 = 1 << 63;

/// Receive buffers reposted per `post_recv` call.
const REPOST_BATCH: usize = 32;

/// Work requests per post list (one `post_send` call): the frames of one
/// [`RdsNode::flush`](crate::node::RdsNode::flush) on a connection, up to this many, go to
/// the provider in one call (one lock and one doorbell on shm, one doorbell on verbs).
pub(crate) const POST_BATCH: usize = 32;

/// Where a staged work request's bytes are.
#[derive(Clone, Copy, Debug)]
enum StagedData {
    /// `len` bytes at `off` of the link's inline area.
    Inline { off: usize, len: usize },
    /// The first `n` entries.
    Sgl { sge: [Sge; 2], n: usize },
}

/// A work request of the post list.
#[derive(Clone, Copy, Debug)]
struct Staged {
    wr_id: u64,
    op: SendOp,
    flags: SendFlags,
    data: StagedData,
}

impl Staged {
    /// A frame's SEND (not the RDMA operation that may precede it).
    fn is_send(&self) -> bool {
        self.wr_id & RDMA_WR == 0
    }
}

/// The work request of `s`, whose inline bytes are in `area`.
#[inline]
fn staged_wr<'a>(area: &'a [u8], s: &'a Staged) -> SendWr<'a> {
    SendWr {
        wr_id: s.wr_id,
        op: s.op,
        payload: match &s.data {
            StagedData::Inline { off, len } => Payload::Inline(&area[*off..*off + *len]),
            StagedData::Sgl { sge, n } => Payload::Sgl(&sge[..*n]),
        },
        flags: s.flags,
    }
}

/// The largest inline frame the transport assembles.
pub(crate) const INLINE_CAP: usize = 512;

/// What one connection's data path works with: the engine its frames and completions go
/// to, the time, the path the connection carries, and the transport's completion array,
/// receive scratch and counters. Everything is borrowed (the transport owns it and lends
/// it for one call), so making one per connection and poll costs nothing but a few
/// pointers on the stack: the data path stays allocation-free.
pub(crate) struct LinkCx<'a> {
    /// The engine.
    pub(crate) engine: &'a mut RdsEngine,
    /// The time of this poll.
    pub(crate) now: Instant,
    /// The path the connection carries.
    pub(crate) path: PathId,
    /// Where completions are polled into (the transport's batch size).
    pub(crate) wcs: &'a mut [Completion],
    /// Where a received frame is copied out of its buffer before the engine parses it.
    pub(crate) scratch: &'a mut [u8; RECV_BUF],
    /// The transport's counters.
    pub(crate) stats: &'a mut FabricStats,
}

impl<P: Provider> Link<P> {
    pub(crate) fn new(qp: P::Qp, res: LinkRes<P>, conn: ConnId, state: LinkState) -> Self {
        let inline_max = (qp.caps().max_inline_data as usize).min(INLINE_CAP);
        let depth = res.recv_depth as usize;
        Self {
            qp,
            res,
            conn,
            state,
            pending: VecDeque::with_capacity(depth),
            unsignaled: 0,
            inline_max,
            staged: Vec::with_capacity(POST_BATCH),
            inline_area: vec![0; POST_BATCH * inline_max].into_boxed_slice(),
            inline_used: 0,
            peer_base: 0,
            v6: false,
        }
    }

    /// Received frames wait for the engine (it refused the first): the next
    /// [`poll_recv`](Self::poll_recv) has work even if nothing new arrived.
    pub(crate) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Fails the connection once the receives that completed before the failure are
    /// taken (a connection that is up only: frames of one not yet known to be up wait).
    pub(crate) fn fail_after_receives(&mut self, cx: &mut LinkCx<'_>) {
        if self.state == LinkState::Up {
            self.poll_recv(cx);
        }
        self.fail(cx.engine, cx.now, cx.path, cx.stats);
    }

    /// Marks the connection failed and tells the engine (once).
    pub(crate) fn fail(
        &mut self,
        engine: &mut RdsEngine,
        now: Instant,
        path: PathId,
        stats: &mut FabricStats,
    ) {
        // Nothing staged is posted on a failed connection.
        self.staged.clear();
        self.inline_used = 0;
        if self.state != LinkState::Broken {
            self.state = LinkState::Broken;
            stats.errors += 1;
            engine.handle_transport_error(now, path);
        }
    }

    /// Send completions: reported to the engine cumulatively (the largest token of the
    /// batch; requests complete in order). An error status fails the connection, after the
    /// receives that completed before it are taken: on a reliable connection a send fails
    /// once the peer is gone, and what the peer sent before it went (its last acks) is
    /// valid. Returns the completions polled.
    pub(crate) fn poll_send(&mut self, cx: &mut LinkCx<'_>) -> usize {
        let n = self.res.scq.poll(cx.wcs);
        if self.state == LinkState::Broken {
            return n;
        }
        let (now, path) = (cx.now, cx.path);
        let mut done = None;
        for i in 0..n {
            let wc = cx.wcs[i];
            let rdma = wc.wr_id & RDMA_WR != 0;
            if !wc.is_ok() {
                if let Some(token) = done {
                    cx.engine.handle_send_complete(now, path, token);
                }
                if rdma {
                    // rds_ib_send_unmap_rdma's status mapping; a flushed operation never
                    // ran and reports nothing (the reset drops its message).
                    cx.stats.rdma_errors += 1;
                    let st = match wc.status {
                        WcStatus::WrFlushErr => None,
                        WcStatus::RemAccessErr => Some(RDS_RDMA_REMOTE_ERROR),
                        _ => Some(RDS_RDMA_OTHER_ERROR),
                    };
                    if let Some(st) = st {
                        cx.engine
                            .handle_rdma_failed(now, path, wc.wr_id & !RDMA_WR, st);
                    }
                }
                self.fail_after_receives(cx);
                return n;
            }
            if !rdma {
                done = Some(done.map_or(wc.wr_id, |d: u64| d.max(wc.wr_id)));
            }
        }
        if let Some(token) = done {
            cx.engine.handle_send_complete(now, path, token);
        }
        n
    }

    /// Receive completions: each frame goes to the engine in order; a refused frame (and
    /// everything behind it) stays and is offered again on the next poll. Taken buffers
    /// are reposted at once and reported as credits.
    pub(crate) fn poll_recv(&mut self, cx: &mut LinkCx<'_>) -> usize {
        let LinkCx {
            engine,
            now,
            path,
            wcs,
            scratch,
            stats,
        } = cx;
        let (now, path) = (*now, *path);
        // Drain the queue (a batch at a time, at most a ring's worth): after a pause the
        // peer's whole window is taken in one iteration, and one credit update covers it.
        // A failed completion ends the connection, but only after the frames that
        // completed ahead of it (in the same batch too) went to the engine: they were
        // received (a peer's last acks before it closed, say).
        let mut polled = 0usize;
        let mut failed = false;
        loop {
            let n = self.res.rcq.poll(wcs);
            polled += n;
            if self.state == LinkState::Broken {
                return polled;
            }
            for wc in &wcs[..n] {
                if wc.status != WcStatus::Success {
                    failed = true;
                    break;
                }
                // The provider fills only what we posted; anything else is a broken
                // provider or a hostile one: reset this connection.
                if wc.wr_id >= u64::from(self.res.recv_depth)
                    || wc.byte_len as usize > RECV_BUF
                    || self.pending.len() >= self.res.recv_depth as usize
                {
                    stats.rx_bad += 1;
                    failed = true;
                    break;
                }
                self.pending.push_back((wc.wr_id as u32, wc.byte_len));
            }
            if failed || n < wcs.len() || polled >= self.res.recv_depth as usize {
                break;
            }
        }
        let mut batch = [0u32; REPOST_BATCH];
        let (mut k, mut taken) = (0usize, 0u32);
        while let Some(&(idx, len)) = self.pending.front() {
            let len = len as usize;
            let buf = &mut scratch[..len];
            self.res.ring.copy_out(idx as usize * RECV_BUF, buf);
            let (header, payload) = buf.split_at(len.min(HEADER_LEN));
            if engine.handle_frame(now, path, header, payload).is_err() {
                stats.rx_refused += 1;
                break;
            }
            self.pending.pop_front();
            stats.rx_frames += 1;
            if failed {
                // Nothing is reposted on a connection that is going away.
                continue;
            }
            batch[k] = idx;
            k += 1;
            if k == REPOST_BATCH {
                if !self.repost(&batch) {
                    self.fail(engine, now, path, stats);
                    return polled;
                }
                taken += k as u32;
                k = 0;
            }
        }
        if failed {
            self.fail(engine, now, path, stats);
            return polled;
        }
        if k > 0 {
            if !self.repost(&batch[..k]) {
                self.fail(engine, now, path, stats);
                return polled;
            }
            taken += k as u32;
        }
        if taken > 0 {
            engine.handle_recv_posted(now, path, taken);
        }
        polled + taken as usize
    }

    /// Posts the receive buffers `idxs` again, in one call.
    fn repost(&mut self, idxs: &[u32]) -> bool {
        let mut sges = [[Sge::default(); 1]; REPOST_BATCH];
        for (s, &i) in sges.iter_mut().zip(idxs) {
            s[0] = self.res.recv_sge(i);
        }
        let mut wrs = [RecvWr { wr_id: 0, sgl: &[] }; REPOST_BATCH];
        for (k, &i) in idxs.iter().enumerate() {
            wrs[k] = RecvWr {
                wr_id: u64::from(i),
                sgl: &sges[k],
            };
        }
        self.qp.post_recv(&wrs[..idxs.len()]).is_ok()
    }

    /// Stages one frame in the post list: inline when it fits, else the header (copied to
    /// its slot) and the payload's fragment as two scatter entries of the registrations.
    /// A full list is posted first; the list is posted with the turn's `last` frame (no
    /// more from the engine now), or else by [`post_staged`](Self::post_staged).
    ///
    /// A frame with an RDMA operation stages it first, in the same list (one doorbell):
    /// WRITE or READ between `window` (ours, registered for local access) and the peer's
    /// window at the offset its cookie gave, under its key. On a reliable connection the
    /// operation completes before the SEND that follows, so the peer sees the data before
    /// the header; a key, range or right the peer's memory refuses completes in error
    /// (reported in [`poll_send`](Self::poll_send)) and ends this connection only.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn transmit(
        &mut self,
        engine: &RdsEngine,
        frag_mr: &P::Mr,
        window: Option<&P::Mr>,
        frame: &TxFrame,
        last: bool,
        signal_every: u32,
        stats: &mut FabricStats,
    ) -> Result<(), PostError> {
        let mut flags = solicit_flags(frame);
        let mut rdma = None;
        if let Some(op) = frame.rdma {
            let bad = PostError {
                index: 0,
                kind: dp_fabric::PostErrorKind::MessageTooLong,
            };
            // The engine checked the range against the window; checked again here so a
            // wrong range can never reach the provider.
            let w = window.ok_or(bad)?;
            let end = op.local.checked_add(u64::from(op.len)).ok_or(bad)?;
            if end > w.len() as u64 {
                return Err(bad);
            }
            let sge = Sge {
                addr: w.addr() + op.local,
                length: op.len,
                lkey: w.lkey(),
            };
            let remote = RemoteAddr {
                addr: self.peer_base.wrapping_add(op.remote),
                rkey: op.rkey,
            };
            rdma = Some(Staged {
                wr_id: RDMA_WR | frame.token,
                op: if op.write {
                    SendOp::Write(remote)
                } else {
                    SendOp::Read(remote)
                },
                flags: SendFlags::NONE,
                data: StagedData::Sgl {
                    sge: [sge, Sge::default()],
                    n: 1,
                },
            });
            if op.fence {
                flags = flags | SendFlags::FENCE;
            }
            stats.rdma_ops += 1;
            stats.rdma_bytes += u64::from(op.len);
        }
        let len = frame.wire_len();
        let inline = len <= self.inline_max;
        let wrs = 1 + usize::from(rdma.is_some());
        if self.staged.len() + wrs > POST_BATCH
            || (inline && self.inline_used + len > self.inline_area.len())
        {
            self.post_staged(signal_every)?;
        }
        let frags = engine.frags();
        let data = if inline {
            let off = self.inline_used;
            let buf = &mut self.inline_area[off..off + len];
            buf[..HEADER_LEN].copy_from_slice(&frame.header);
            let mut at = HEADER_LEN;
            for (foff, n) in frame.payload.segments(frags) {
                frags.region().copy_out(foff, &mut buf[at..at + n]);
                at += n;
            }
            self.inline_used += len;
            stats.tx_inline += 1;
            StagedData::Inline { off, len }
        } else {
            let slot = (frame.token % u64::from(self.res.hdr_slots)) as usize;
            let hoff = self.res.recv_depth as usize * RECV_BUF + slot * HDR_SLOT;
            self.res.ring.copy_in(hoff, &frame.header);
            let mut sge = [Sge::default(); 2];
            sge[0] = self.res.mr.sge(hoff, HEADER_LEN as u32);
            let mut n = 1;
            for (off, k) in frame.payload.segments(frags) {
                if n == sge.len() {
                    // A message-flavour frame carries one fragment; more is a caller bug.
                    return Err(PostError {
                        index: 0,
                        kind: dp_fabric::PostErrorKind::TooManySge,
                    });
                }
                sge[n] = frag_mr.sge(off, k as u32);
                n += 1;
            }
            StagedData::Sgl { sge, n }
        };
        stats.tx_frames += 1;
        let mut send = Staged {
            wr_id: frame.token,
            op: SendOp::Send,
            flags,
            data,
        };
        if last && rdma.is_none() && self.staged.is_empty() {
            // A list of one (a ping, a pong): posted from here, signalled.
            self.unsignaled = 0;
            send.flags = send.flags | SendFlags::SIGNALED;
            let r = self.qp.post_send(&[staged_wr(&self.inline_area, &send)]);
            self.inline_used = 0;
            return r;
        }
        if let Some(r) = rdma {
            self.staged.push(r);
        }
        self.staged.push(send);
        if last {
            return self.post_staged(signal_every);
        }
        Ok(())
    }

    /// True if [`transmit`](Self::transmit) staged work requests that are not posted yet.
    pub(crate) fn has_staged(&self) -> bool {
        !self.staged.is_empty()
    }

    /// Posts the post list in one call, with completions requested as [`signal_list`]
    /// says. The list is empty afterwards, whatever the outcome (a refused request fails
    /// the connection: the caller resets it).
    pub(crate) fn post_staged(&mut self, signal_every: u32) -> Result<(), PostError> {
        // The last work request is a SEND (an RDMA operation is staged before its frame).
        let Some((last, rest)) = self.staged.split_last_mut() else {
            return Ok(());
        };
        signal_list(
            &mut self.unsignaled,
            rest.iter_mut()
                .filter(|s| s.is_send())
                .map(|s| &mut s.flags),
            &mut last.flags,
            signal_every,
        );
        let mut wrs = [SendWr {
            wr_id: 0,
            op: SendOp::Send,
            payload: Payload::Inline(&[]),
            flags: SendFlags::NONE,
        }; POST_BATCH];
        for (w, s) in wrs.iter_mut().zip(&self.staged) {
            *w = staged_wr(&self.inline_area, s);
        }
        let r = self.qp.post_send(&wrs[..self.staged.len()]);
        self.staged.clear();
        self.inline_used = 0;
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::path::TxPayload;

    fn frame(kind: FrameKind, last: bool) -> TxFrame {
        TxFrame {
            token: 0,
            header: [0; HEADER_LEN],
            payload: TxPayload::None,
            kind,
            last,
            rdma: None,
        }
    }

    #[test]
    fn test_solicit_last_fragment_and_ack() {
        // Linux arms its receive CQ for solicited events only: the last fragment of every
        // message or update and every ACK-only frame must carry IBV_SEND_SOLICITED.
        assert_eq!(
            solicit_flags(&frame(FrameKind::Data, true)),
            SendFlags::SOLICITED
        );
        assert_eq!(
            solicit_flags(&frame(FrameKind::CongMap, true)),
            SendFlags::SOLICITED
        );
        assert_eq!(
            solicit_flags(&frame(FrameKind::Ack, false)),
            SendFlags::SOLICITED
        );
        assert_eq!(
            solicit_flags(&frame(FrameKind::Data, false)),
            SendFlags::NONE
        );
    }

    /// The signalled SENDs of lists of `sizes`, as indices over all of them.
    fn signalled(sizes: &[usize], every: u32) -> Vec<usize> {
        let mut n = 0;
        let mut out = Vec::new();
        let mut at = 0;
        for &k in sizes {
            let mut flags = vec![SendFlags::SOLICITED; k];
            let (last, rest) = flags.split_last_mut().expect("a list of one or more");
            signal_list(&mut n, rest.iter_mut(), last, every);
            for (i, f) in flags.iter().enumerate() {
                assert!(f.contains(SendFlags::SOLICITED), "solicit kept");
                if f.contains(SendFlags::SIGNALED) {
                    out.push(at + i);
                }
            }
            at += k;
        }
        out
    }

    #[test]
    fn test_signal_list_signals_the_last_send_of_each_list() {
        // One completion per list: cumulative, it covers every frame of the list.
        assert_eq!(signalled(&[1, 1, 1], 16), [0, 1, 2]);
        assert_eq!(signalled(&[5, 3], 16), [4, 7]);
    }

    #[test]
    fn test_signal_list_signals_at_least_every_n() {
        // Within a long list, and across lists.
        assert_eq!(signalled(&[10], 4), [3, 7, 9]);
        assert_eq!(signalled(&[3, 6], 4), [2, 6, 8]);
    }
}
