//! The sockets of a context: what a socket is (fresh, listening, a stream, failed), a
//! stream's queue pair, completion queue and buffers, and the [`RsIo`] through which its
//! state machine reaches them.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::arena::SockBufs;
use crate::conn::{Buf, Local, OutOfBounds, RsIo, RsWr, Seg, StreamConn};
use crate::error::RsError;
use crate::opts::SockOpts;
use dp_fabric::{
    Completion, CompletionQueue, ConnId, CqNotify, FabricError, ListenId, Payload, PostError,
    PostErrorKind, Provider, RcQueuePair, RecvWr, SendFlags, SendOp, SendWr, Sge,
};

/// Names a socket of a context.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SockId(pub u32);

/// Flags of `send`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendFlagsRs {
    /// `MSG_DONTWAIT`: do not block even on a blocking socket.
    pub dontwait: bool,
}

/// Flags of `recv`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvFlags {
    /// `MSG_DONTWAIT`.
    pub dontwait: bool,
    /// `MSG_PEEK`: copy without consuming.
    pub peek: bool,
    /// `MSG_WAITALL`: block until the buffer is full (or end of stream / error).
    pub waitall: bool,
}

pub(super) struct Listening {
    pub(super) id: ListenId,
    pub(super) addr: SocketAddr,
    pub(super) backlog: usize,
    /// Connections accepted in the background, waiting for `accept` to hand them out.
    pub(super) accepted: VecDeque<SockId>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    Connecting,
    Established,
}

pub(super) struct Stream<P: Provider> {
    pub(super) conn: StreamConn,
    /// The protection domain of the socket's queue pair and memory (today a clone of the
    /// context's; it belongs to the socket so that it can become the socket's own).
    pub(super) pd: P::Pd,
    pub(super) qp: P::Qp,
    pub(super) cq: P::Cq,
    /// `cq`'s notifier: blocking calls sleep on it once their polling time is over.
    pub(super) notify: Option<Arc<dyn CqNotify>>,
    pub(super) conn_id: ConnId,
    pub(super) bufs: SockBufs<P>,
    pub(super) phase: Phase,
    pub(super) local: SocketAddr,
    pub(super) peer: SocketAddr,
    pub(super) maps: Vec<IoMapping<P>>,
}

pub(super) struct IoMapping<P: Provider> {
    pub(super) addr: u64,
    pub(super) len: usize,
    pub(super) index: Option<u32>,
    pub(super) _mr: P::Mr,
}

pub(super) enum Kind<P: Provider> {
    Fresh,
    /// A connect is building this socket's resources without the data lock (see the
    /// locking section of the [`ctx`](super) docs); it reads as connecting. Only the
    /// connecting thread, holding the control lock throughout, moves it on.
    Opening,
    Listening(Listening),
    Stream(Box<Stream<P>>),
    Failed(RsError),
}

pub(super) struct Sock<P: Provider> {
    pub(super) opts: SockOpts,
    pub(super) nonblocking: bool,
    pub(super) bound: Option<SocketAddr>,
    pub(super) kind: Kind<P>,
    pub(super) so_error: Option<RsError>,
}

impl<P: Provider> Sock<P> {
    pub(super) fn new(opts: SockOpts, nonblocking: bool) -> Self {
        Self {
            opts,
            nonblocking,
            bound: None,
            kind: Kind::Fresh,
            so_error: None,
        }
    }
}

/// The state machine's I/O through a real queue pair and arena buffers.
///
/// The arena region holds many sockets' buffers and the local key covers all of it, so the
/// region's own bounds check protects nothing between sockets: every access (read, write,
/// and each segment of a posted request) is bounded here by the buffer it names. The state
/// machine never asks for anything outside (a `debug_assert!` says so); if it ever did, the
/// access is refused and the state machine fails the connection, rather than read or send
/// another socket's bytes.
pub(super) struct Io<'a, P: Provider> {
    pub(super) qp: &'a mut P::Qp,
    pub(super) bufs: &'a SockBufs<P>,
}

impl<P: Provider> Io<'_, P> {
    /// The region offset of `[off, off + n)` of `buf`, if inside it.
    #[inline]
    fn span(&self, buf: Buf, off: u32, n: usize) -> Result<usize, OutOfBounds> {
        let at = self.bufs.span(buf, off, n);
        debug_assert!(
            at.is_some(),
            "rsocket state machine access outside its {buf:?} buffer: {off}+{n}"
        );
        at.ok_or(OutOfBounds)
    }
}

impl<P: Provider> RsIo for Io<'_, P> {
    fn read(&self, buf: Buf, off: u32, dst: &mut [u8]) -> Result<(), OutOfBounds> {
        let at = self.span(buf, off, dst.len())?;
        self.bufs.mem.copy_out(at, dst);
        Ok(())
    }

    fn write(&mut self, buf: Buf, off: u32, src: &[u8]) -> Result<(), OutOfBounds> {
        let at = self.span(buf, off, src.len())?;
        self.bufs.mem.copy_in(at, src);
        Ok(())
    }

    fn post_send(&mut self, wr: &RsWr<'_>) -> Result<(), PostError> {
        let op = match wr.imm {
            Some(i) => SendOp::WriteImm(wr.remote, i),
            None => SendOp::Write(wr.remote),
        };
        let sge = |s: Seg| -> Result<Sge, PostError> {
            // A segment outside its buffer would send another socket's bytes: refused (the
            // state machine fails the connection on any refusal).
            self.span(s.buf, s.off, s.len as usize)
                .map_err(|OutOfBounds| PostError {
                    index: 0,
                    kind: PostErrorKind::Unsupported,
                })?;
            Ok(Sge {
                addr: self.bufs.addr(s.buf, s.off),
                length: s.len,
                lkey: self.bufs.lkey,
            })
        };
        let mut list = [Sge::default(); 2];
        let payload = match wr.local {
            Local::Empty => Payload::Sgl(&[]),
            Local::Inline(b) => Payload::Inline(b),
            Local::Segs(a, b) => {
                list[0] = sge(a)?;
                match b {
                    Some(b) => {
                        list[1] = sge(b)?;
                        Payload::Sgl(&list[..2])
                    }
                    None => Payload::Sgl(&list[..1]),
                }
            }
        };
        // A Data message's bytes may travel in the peer's completion (one cache line pair
        // between the processes for a small message, on the shm provider).
        let flags = if wr.read_after_completion() {
            SendFlags::SIGNALED | SendFlags::PLACE_ON_POLL
        } else {
            SendFlags::SIGNALED
        };
        self.qp.post_send(&[SendWr {
            wr_id: wr.wr_id,
            op,
            payload,
            flags,
        }])
    }

    fn post_recv(&mut self, wr_id: u64) -> Result<(), PostError> {
        self.qp.post_recv(&[RecvWr { wr_id, sgl: &[] }])
    }
}

impl<P: Provider> Stream<P> {
    pub(super) fn io(&mut self) -> (&mut StreamConn, Io<'_, P>) {
        (
            &mut self.conn,
            Io {
                qp: &mut self.qp,
                bufs: &self.bufs,
            },
        )
    }

    /// Polls this socket's completions into its state machine; returns the work done.
    pub(super) fn progress(&mut self, scratch: &mut [Completion]) -> usize {
        // Nothing of ours is due and the queue says nothing came: spare the poll and the
        // bookkeeping (the spin of a reader waiting for its answer).
        if self.phase == Phase::Established && self.conn.is_settled() && !self.cq.may_have_work() {
            return 0;
        }
        let mut work = 0;
        loop {
            let n = self.cq.poll(scratch);
            for c in &scratch[..n] {
                let (conn, mut io) = self.io();
                conn.handle_completion(c, &mut io);
            }
            work += n;
            if n < scratch.len() {
                break;
            }
        }
        if self.phase == Phase::Established {
            let (conn, mut io) = self.io();
            // A poll that brought something is often the one a waiting reader is about to
            // return with: only urgent work then; what can wait (re-posting receives) is
            // done by the next poll that finds nothing.
            if work == 0 {
                conn.after_completions(&mut io);
            } else {
                conn.after_data(&mut io);
            }
        }
        work
    }
}

/// Posts a new connection's initial receives on its queue pair (the `prepare` hook of
/// connect and accept).
pub(super) fn post_initial_recvs<P: Provider>(
    conn: &mut StreamConn,
    qp: &mut P::Qp,
    bufs: &SockBufs<P>,
) -> Result<(), FabricError> {
    let rq = conn.config().rq_size;
    conn.post_initial_recvs(&mut Io { qp, bufs })
        .map_err(|_| FabricError::Exhausted {
            what: "receives on a new queue pair",
            limit: u64::from(rq),
            hint: "lower the receive queue size (RDMA_RQSIZE) or raise the provider's limit",
        })
}
