//! RTRS protocol 2.0 wire formats (Linux `drivers/infiniband/ulp/rtrs/rtrs-pri.h`, described in
//! `shared/reference/rtrs.md` sections 1 and 2).
//!
//! Every structure is little-endian; the 32-bit immediate is carried big-endian on the wire
//! and handed to us in host order by the fabric (`Completion::imm`), so [`imm`] works on host
//! values.
//!
//! | format | bytes | carried by | module |
//! |---|---|---|---|
//! | [`ConnReq`] (`rtrs_msg_conn_req`) | 56 | RDMA-CM connect private data, client to server, once per connection | [`conn`] |
//! | [`ConnRsp`] (`rtrs_msg_conn_rsp`) | 56 | RDMA-CM accept or reject private data | [`conn`] |
//! | [`InfoReq`] (`rtrs_msg_info_req`) | 272 | SEND on connection 0 once all connections of a path are up | [`info`] |
//! | [`InfoRsp`] (`rtrs_msg_info_rsp`) | 8 + 16 n | SEND answering it: the server's chunk table | [`info`] |
//! | [`RkeyRsp`] (`rtrs_msg_rkey_rsp`) | 8 | SEND with immediate: a chunk's new rkey (`NEW_RKEY` mode) | [`info`] |
//! | [`RdmaWrite`] (`rtrs_msg_rdma_write`) | 4 | RDMA-written into a server chunk behind the user message | [`io`] |
//! | [`RdmaRead`] (`rtrs_msg_rdma_read`) | 8 + 16 n | the same, for reads, with the client's buffer descriptor | [`io`] |
//! | [`Imm`] | 4 | the immediate: 4-bit [`ImmType`], 28-bit payload | [`imm`] |
//!
//! Each format follows the `dp-wire` contract: a view (`new_unchecked`, `check_len`,
//! `new_checked`; no accessor panics after `check_len`) and, where the bytes have a meaning
//! to validate, a `Repr` whose `parse` never panics and whose `emit` never panics on a buffer
//! of `buffer_len()` bytes. Message types and immediate types are open enums. Parse errors are
//! the small `Copy` [`Bad`], which says what was wrong; it converts into [`dp_wire::Error`].
//!
//! The arithmetic that ties the immediate to the chunks (queue depth, chunk size, the 28-bit
//! budget, the split of an IO request's payload into chunk index and offset) is [`Geometry`].

use core::ops::Range;

pub mod conn;
pub mod geom;
pub mod imm;
pub mod info;
pub mod io;
#[cfg(test)]
mod tests;

pub use conn::{ConnReq, ConnReqRepr, ConnRsp, ConnRspRepr};
pub use geom::{Geometry, bits};
pub use imm::{Imm, ImmType, IoRsp};
pub use info::{InfoReq, InfoReqRepr, InfoRsp, PathName, RkeyRsp, RkeyRspRepr};
pub use io::{MsgType, RdmaRead, RdmaReadRepr, RdmaWrite, RdmaWriteRepr, SgDesc};

pub(crate) type Field = Range<usize>;

/// `RTRS_PROTO_VER_MAJOR`: the only major version; peers compare only this.
pub const PROTO_VER_MAJOR: u8 = 2;
/// `RTRS_PROTO_VER_MINOR`.
pub const PROTO_VER_MINOR: u8 = 0;
/// `RTRS_PROTO_VER`: `major << 8 | minor`, as sent.
pub const PROTO_VER: u16 = (PROTO_VER_MAJOR as u16) << 8 | PROTO_VER_MINOR as u16;
/// `RTRS_MAGIC`.
pub const MAGIC: u16 = 0x1BBD;
/// `MAX_SESS_QUEUE_DEPTH`: the queue depth is a `le16` in the connection response.
pub const MAX_QUEUE_DEPTH: u16 = 65535;
/// `MIN_CHUNK_SIZE`: the smallest chunk a server may offer (module parameter check).
pub const MIN_CHUNK_SIZE: u32 = 8192;
/// `SERVICE_CON_QUEUE_DEPTH`: receives posted on connection 0, and the signalling interval cap.
pub const SERVICE_CON_QUEUE_DEPTH: u32 = 512;
/// `MAX_PATHS_NUM`: paths per session.
pub const MAX_PATHS: usize = 128;
/// The server's sanity limit on `cid_num` (`rtrs_rdma_connect`): more connections per path
/// than this are rejected.
pub const MAX_CONNS_PER_PATH: u16 = 4096;
/// `NAME_MAX`: bytes of the path name in `info_req`.
pub const NAME_MAX: usize = 255;
/// `FIRST_CONN`: bit 0 of the flags byte of the connect request.
pub const FIRST_CONN: u8 = 0x01;
/// `RTRS_MSG_NEED_INVAL_F`, in the `flags` of [`RdmaRead`]: the client asks the server to
/// invalidate the client's rkey (SEND_WITH_INV) before answering.
pub const MSG_NEED_INVAL_F: u16 = 1 << 0;
/// `RTRS_MSG_NEW_RKEY_F`, in the `flags` of [`ConnRsp`]: the server re-registers each chunk
/// under a new rkey after every IO and tells it in an [`RkeyRsp`] (`always_invalidate=Y`).
pub const MSG_NEW_RKEY_F: u32 = 1 << 1;
/// `MAX_HDR_SIZE` of the Linux server: `PAGE_SIZE`.
pub const DEFAULT_MAX_HDR_SIZE: u32 = 4096;
/// `DEFAULT_MAX_CHUNK_SIZE` of the Linux server.
pub const DEFAULT_MAX_CHUNK_SIZE: u32 = 128 << 10;
/// `DEFAULT_SESS_QUEUE_DEPTH` of the Linux server.
pub const DEFAULT_QUEUE_DEPTH: u16 = 512;

/// Why bytes from a peer are not a valid RTRS message: small, `Copy`, allocation-free, and
/// specific enough to count and report (see [`Bad::reason`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Bad {
    /// Shorter than the format.
    Truncated,
    /// `magic` is not `0x1BBD`.
    Magic,
    /// The major version is not 2.
    Version,
    /// A message type other than the one expected here.
    MsgType,
    /// `cid_num` is 0 or above [`MAX_CONNS_PER_PATH`].
    ConnNum,
    /// `cid` is not below `cid_num`.
    Cid,
    /// A queue depth of 0.
    QueueDepth,
    /// A header size too small for the RTRS header, or larger than the chunk.
    HdrSize,
    /// `max_io_size + max_hdr_size` overflows or is zero.
    ChunkSize,
    /// Queue depth and chunk size need more than the 28 bits of the immediate payload.
    ImmBudget,
    /// An empty path name, or one holding `/`, `.` or a NUL.
    PathName,
    /// A chunk table whose descriptor count is 0 or does not divide the queue depth.
    SgCount,
    /// A chunk-table descriptor whose length is 0 or not a multiple of the chunk size.
    SgLen,
    /// A chunk table that does not cover exactly `queue_depth` chunks.
    SgTotal,
    /// A chunk-table region whose addresses wrap past 2^64.
    SgWraps,
    /// A read request with other than 0 or 1 descriptors.
    ReadSgCount,
    /// A read descriptor with length 0 or longer than the chunk.
    ReadLen,
    /// `usr_len` larger than the space in front of the RTRS header.
    UsrLen,
    /// A `buf_id` that does not name a chunk, or does not match the immediate.
    BufId,
}

impl Bad {
    /// A static description, for logs and errors.
    pub const fn reason(self) -> &'static str {
        match self {
            Self::Truncated => "RTRS message shorter than its format",
            Self::Magic => "RTRS magic is not 0x1BBD",
            Self::Version => "RTRS major version is not 2",
            Self::MsgType => "unexpected RTRS message type",
            Self::ConnNum => "cid_num is 0 or above 4096",
            Self::Cid => "cid is not below cid_num",
            Self::QueueDepth => "queue depth is 0",
            Self::HdrSize => "max_hdr_size cannot hold an RTRS header or exceeds the chunk",
            Self::ChunkSize => "max_io_size + max_hdr_size is 0 or overflows",
            Self::ImmBudget => "queue depth and chunk size exceed the 28-bit immediate payload",
            Self::PathName => "path name is empty or holds '/', '.' or NUL",
            Self::SgCount => {
                "chunk table has no descriptors or their count does not divide the queue depth"
            }
            Self::SgLen => "chunk table descriptor length is 0 or not a multiple of the chunk size",
            Self::SgTotal => "chunk table does not cover exactly queue_depth chunks",
            Self::SgWraps => "chunk table region wraps the address space",
            Self::ReadSgCount => "read request has other than 0 or 1 descriptors",
            Self::ReadLen => "read descriptor length is 0 or exceeds the chunk",
            Self::UsrLen => "usr_len exceeds the space before the RTRS header",
            Self::BufId => "buf_id does not name the chunk of the response",
        }
    }
}

impl core::fmt::Display for Bad {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.reason())
    }
}

impl std::error::Error for Bad {}

impl From<Bad> for dp_wire::Error {
    fn from(b: Bad) -> Self {
        match b {
            Bad::Truncated => Self::Truncated,
            Bad::Version => Self::Version,
            _ => Self::Malformed,
        }
    }
}

/// Result of RTRS wire parsing.
pub type Result<T> = core::result::Result<T, Bad>;

/// Little-endian `u16` at `f` of `b`; `b` is known (checked) to hold `f`.
#[inline]
pub(crate) fn le16(b: &[u8], f: usize) -> u16 {
    u16::from_le_bytes([b[f], b[f + 1]])
}

/// Little-endian `u32` at `f` of `b`; `b` is known (checked) to hold it.
#[inline]
pub(crate) fn le32(b: &[u8], f: usize) -> u32 {
    u32::from_le_bytes([b[f], b[f + 1], b[f + 2], b[f + 3]])
}

/// Little-endian `u64` at `f` of `b`; `b` is known (checked) to hold it.
#[inline]
pub(crate) fn le64(b: &[u8], f: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[f..f + 8]);
    u64::from_le_bytes(x)
}

/// Checks `b` holds at least `n` bytes.
#[inline]
pub(crate) fn need(b: &[u8], n: usize) -> Result<()> {
    if b.len() < n {
        Err(Bad::Truncated)
    } else {
        Ok(())
    }
}

/// The major version of a `version` field.
#[inline]
pub const fn major(version: u16) -> u8 {
    (version >> 8) as u8
}
