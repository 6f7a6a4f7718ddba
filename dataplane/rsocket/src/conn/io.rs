//! What the stream state machine exchanges with the layer that drives it: its constants,
//! the buffers it names, the work requests it emits, the [`RsIo`] it performs them
//! through, and its configuration, readiness and counters.

use crate::wire::{RS_SGL_SIZE, RsIomap, RsMsg, RsOp, RsSge};
use dp_fabric::{PostError, RemoteAddr};

/// First chunk of a send; chunks double up to [`RS_MAX_TRANSFER`].
pub const RS_OLAP_START_SIZE: u32 = 2048;
/// Largest chunk.
pub const RS_MAX_TRANSFER: u32 = 65536;
/// Send-buffer space needed before a send may start (also the datagram slot size).
pub const RS_SNDLOWAT: u32 = 2048;
/// Smallest queue size.
pub const RS_QP_MIN_SIZE: u32 = 16;
/// Largest queue size and inline size.
pub const RS_QP_MAX_SIZE: u32 = 0xFFFE;
/// Send slots reserved for control messages.
pub const RS_QP_CTRL_SIZE: u32 = 4;
/// Bytes of one control bounce slot.
pub const RS_MAX_CTRL_MSG: u32 = 16;
/// Bytes after the send buffer used as control bounce slots (when inline < 16).
pub const CTRL_AREA: u32 = RS_QP_CTRL_SIZE * RS_MAX_CTRL_MSG;
/// Consumed receives [`StreamConn::after_data`](super::StreamConn::after_data) lets wait
/// before re-posting them.
pub const REPOST_BATCH: u32 = 16;
/// Bit of a work-request id that marks a receive.
pub const WR_RECV: u64 = 1 << 63;

/// The buffers of one stream socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buf {
    /// Send bounce ring (`sbuf_size` bytes, then [`CTRL_AREA`] bytes of control slots).
    Sbuf,
    /// Receive ring, remote-writable (`rbuf_size` bytes).
    Rbuf,
    /// Target list, remote-writable: 2 target SGEs then the iomap table.
    Target,
}

/// A segment of a local buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seg {
    /// Which buffer.
    pub buf: Buf,
    /// Offset.
    pub off: u32,
    /// Length.
    pub len: u32,
}

/// Where a request's payload comes from.
#[derive(Clone, Copy, Debug)]
pub enum Local<'a> {
    /// No payload.
    Empty,
    /// Inline bytes.
    Inline(&'a [u8]),
    /// One or two buffer segments (two when the send ring wraps).
    Segs(Seg, Option<Seg>),
}

/// What the state machine asks to post.
#[derive(Clone, Copy, Debug)]
pub struct RsWr<'a> {
    /// Internal id: `op << 32 | data`.
    pub wr_id: u64,
    /// RDMA WRITE with this immediate (`Some`), or plain RDMA WRITE.
    pub imm: Option<u32>,
    /// Destination in the peer's memory.
    pub remote: RemoteAddr,
    /// Source.
    pub local: Local<'a>,
}

impl RsWr<'_> {
    /// True for a `Data` message: its receiver reads the bytes only after polling the
    /// message's completion (it queues the message from the completion and reads the
    /// receive buffer from there), so a provider may place them at poll time
    /// ([`SendFlags::PLACE_ON_POLL`](dp_fabric::SendFlags::PLACE_ON_POLL)). Credit updates
    /// write the target list, which the peer reads on its own schedule: not these.
    pub fn read_after_completion(&self) -> bool {
        self.imm.is_some_and(|i| RsMsg(i).op() == RsOp::Data)
    }
}

/// A local access outside the buffer it names: refused by the [`RsIo`] instead of touching
/// memory beyond the buffer (another socket's, in an arena). The state machine never asks
/// for one; if it does, it fails the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfBounds;

/// Memory and work-request access the state machine needs.
///
/// Every access is bounded by the buffer it names (its length is
/// [`StreamConfig::buf_len`]): an implementation refuses anything that does not lie inside
/// it with [`OutOfBounds`] (reads and writes) or an error (segments of a posted request),
/// and touches nothing.
pub trait RsIo {
    /// Reads `dst.len()` bytes of `buf` at `off`.
    ///
    /// # Errors
    /// [`OutOfBounds`] if the range is not inside `buf`.
    fn read(&self, buf: Buf, off: u32, dst: &mut [u8]) -> Result<(), OutOfBounds>;
    /// Writes `src` into `buf` at `off`.
    ///
    /// # Errors
    /// [`OutOfBounds`] if the range is not inside `buf`.
    fn write(&mut self, buf: Buf, off: u32, src: &[u8]) -> Result<(), OutOfBounds>;
    /// Posts a send work request (signalled).
    ///
    /// # Errors
    /// The provider's refusal, or a refusal of a local segment outside its buffer.
    fn post_send(&mut self, wr: &RsWr<'_>) -> Result<(), PostError>;
    /// Posts one receive without buffers (rsocket receives only catch immediates).
    ///
    /// # Errors
    /// The provider's refusal.
    fn post_recv(&mut self, wr_id: u64) -> Result<(), PostError>;
}

/// Sizes of one stream connection (effective values, after clamping).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamConfig {
    /// Send queue size (`RDMA_SQSIZE`).
    pub sq_size: u32,
    /// Receive queue size (`RDMA_RQSIZE`); also the credits granted to the peer.
    pub rq_size: u32,
    /// Send buffer bytes.
    pub sbuf_size: u32,
    /// Receive buffer bytes (even).
    pub rbuf_size: u32,
    /// Largest inline payload (`RDMA_INLINE`).
    pub sq_inline: u32,
    /// Entries of our iomap table the peer may publish into (`RDMA_IOMAPSIZE`).
    pub target_iomap_size: u32,
}

impl StreamConfig {
    /// Bytes of the target list for this configuration.
    pub const fn target_len(&self) -> u32 {
        RS_SGL_SIZE * RsSge::LEN as u32 + self.target_iomap_size * RsIomap::LEN as u32
    }

    /// Bytes of `buf`: what every access to it must stay within.
    pub const fn buf_len(&self, buf: Buf) -> u32 {
        match buf {
            Buf::Sbuf => self.sbuf_size + CTRL_AREA,
            Buf::Rbuf => self.rbuf_size,
            Buf::Target => self.target_len(),
        }
    }
}

/// Our buffers as peers address them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LocalKeys {
    /// Address of the receive buffer.
    pub rbuf_addr: u64,
    /// Its remote key.
    pub rbuf_rkey: u32,
    /// Address of the target list.
    pub target_addr: u64,
    /// Its remote key.
    pub target_rkey: u32,
}

/// How to shut down (`SHUT_RD`, `SHUT_WR`, `SHUT_RDWR`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shutdown {
    /// Stop receiving.
    Read,
    /// Stop sending (half close).
    Write,
    /// Both.
    Both,
}

/// Readiness, as `poll` reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ready {
    /// `POLLIN`: data queued, or end of stream / error to report.
    pub readable: bool,
    /// `POLLOUT`: a send would make progress.
    pub writable: bool,
    /// `POLLHUP`: the connection is closed.
    pub hup: bool,
    /// `POLLERR`: a transport error happened.
    pub err: bool,
}

/// Counters a test or an operator can read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnStats {
    /// Data messages sent.
    pub data_msgs_sent: u64,
    /// Credit updates sent (with or without a buffer).
    pub credit_msgs_sent: u64,
    /// Data messages received.
    pub data_msgs_received: u64,
    /// Messages from the peer that broke the protocol (counted, then the connection fails).
    pub protocol_errors: u64,
    /// Local accesses the I/O layer refused as outside the socket's buffers (each fails
    /// the connection; never expected).
    pub bounds_faults: u64,
    /// The last rule broken (protocol error or refused local access).
    pub last_violation: Option<super::grant::Violation>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wr(imm: Option<u32>) -> RsWr<'static> {
        RsWr {
            wr_id: 0,
            imm,
            remote: RemoteAddr::default(),
            local: Local::Empty,
        }
    }

    /// Only data messages may be placed when the peer polls them: credit updates write the
    /// target list (read by the peer's sender whenever it sends), iomap entries its table,
    /// and plain writes (keepalive, `riowrite`) have no completion at the peer at all.
    #[test]
    fn only_data_messages_are_read_after_their_completion() {
        assert!(wr(Some(RsMsg::with(RsOp::Data, 64).0)).read_after_completion());
        for op in [RsOp::Sgl, RsOp::IomapSgl, RsOp::Ctrl] {
            assert!(
                !wr(Some(RsMsg::with(op, 1).0)).read_after_completion(),
                "{op:?}"
            );
        }
        assert!(!wr(None).read_after_completion());
    }
}
