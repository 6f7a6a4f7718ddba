//! Errors: what a peer did wrong ([`Violation`], counted per path), why one IO failed
//! ([`IoError`], delivered with its completion), and why a control operation was refused
//! ([`RtrsError`]). All three are `Copy` and allocation-free, so the data path can produce
//! them; each maps to the errno Linux RTRS reports in the same case, and so to an
//! [`std::io::Error`].

use crate::wire::Bad;

/// Something a peer sent that the protocol does not allow. It is counted
/// (`protocol_errors`, `last_violation` in the path's stats) and costs the path it came on:
/// the client reconnects it (failing its IO over), the server closes it. Never a panic, never
/// another path's data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Violation {
    /// A malformed message (connect response, info request or response, rkey response, IO
    /// header).
    Wire(Bad),
    /// An immediate whose type is not one this side can receive (raw 4-bit type).
    ImmType(u8),
    /// An IO request immediate naming a chunk beyond the queue depth or an offset beyond the
    /// chunk.
    ChunkOutOfRange,
    /// An IO request whose header (at its offset) does not fit in the chunk.
    HdrOutsideChunk,
    /// An IO request into a chunk that already carries one on this path.
    ChunkBusy,
    /// An IO response naming a chunk beyond the queue depth.
    RspOutOfRange,
    /// An IO response for a chunk with no request in flight on this path.
    RspIdle,
    /// A SEND this side did not expect here (not an `rkey_rsp`, an invalidation or the info
    /// exchange).
    UnexpectedSend,
    /// IO before the path finished its info exchange.
    IoBeforeConnected,
    /// A second `info_req`, or one before every connection of the path is up.
    InfoOutOfOrder,
    /// A reconnect's connection response with a different queue depth than the session's.
    QueueDepthChanged,
    /// A completion with a `wr_id` this side never posted.
    UnknownWrId,
}

impl Violation {
    /// A static description.
    pub const fn reason(self) -> &'static str {
        match self {
            Self::Wire(b) => b.reason(),
            Self::ImmType(_) => "immediate type not allowed in this direction",
            Self::ChunkOutOfRange => "IO request names a chunk or offset out of range",
            Self::HdrOutsideChunk => "IO request header does not fit in its chunk",
            Self::ChunkBusy => "IO request into a chunk that already carries one",
            Self::RspOutOfRange => "IO response names a chunk beyond the queue depth",
            Self::RspIdle => "IO response for a chunk with no request in flight",
            Self::UnexpectedSend => "unexpected SEND",
            Self::IoBeforeConnected => "IO before the info exchange finished",
            Self::InfoOutOfOrder => "info request out of order",
            Self::QueueDepthChanged => "queue depth changed on reconnect",
            Self::UnknownWrId => "completion for a work request never posted",
        }
    }
}

impl core::fmt::Display for Violation {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.reason())
    }
}

impl From<Bad> for Violation {
    fn from(b: Bad) -> Self {
        Self::Wire(b)
    }
}

/// Why a path left (or never reached) the connected state. Carried by path events and kept
/// as the path's last error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PathError {
    /// The server rejected a connection, with this (negative) errno; `-EBUSY` means its
    /// previous incarnation of the path still exists: retry later.
    #[error("the server rejected the connection: errno {0}")]
    Rejected(i16),
    /// The connect got no valid answer (`ECONNRESET`).
    #[error("the server did not answer the connect")]
    Unreachable,
    /// Address or route resolution failed (`EHOSTUNREACH`).
    #[error("address or route resolution failed")]
    AddrError,
    /// A connection or the info exchange took longer than 30 s (`ETIMEDOUT`).
    #[error("connection establishment timed out")]
    Timeout,
    /// A connection went down (`ECONNRESET`).
    #[error("a connection was disconnected")]
    Disconnected,
    /// The device went away.
    #[error("the RDMA device was removed")]
    DeviceRemoval,
    /// The peer broke the protocol.
    #[error("protocol violation: {0}")]
    Violation(Violation),
    /// A work request completed with this error status.
    #[error("a work request failed: {0:?}")]
    Completion(dp_fabric::WcStatus),
    /// A post was refused.
    #[error("posting failed: {0:?}")]
    Post(dp_fabric::PostErrorKind),
    /// Heartbeats went unanswered past the bound.
    #[error("heartbeats went unanswered")]
    Heartbeat,
    /// Closed on request.
    #[error("closed")]
    Closed,
}

impl PathError {
    /// The positive errno Linux reports in this case.
    pub const fn errno(self) -> i32 {
        match self {
            Self::Rejected(e) => -(e as i32),
            Self::AddrError => libc::EHOSTUNREACH,
            Self::Timeout | Self::Heartbeat => libc::ETIMEDOUT,
            Self::DeviceRemoval => libc::ENODEV,
            Self::Violation(_) => libc::EPROTO,
            Self::Closed => libc::ECONNABORTED,
            Self::Unreachable | Self::Disconnected | Self::Completion(_) | Self::Post(_) => {
                libc::ECONNRESET
            }
        }
    }
}

/// Why one IO request failed. Delivered exactly once per request, with its completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum IoError {
    /// The server's handler failed the request with this errno (positive).
    #[error("the server failed the request: errno {0}")]
    Remote(i32),
    /// No connected path could take the request, now or on failover (`ECONNABORTED`).
    #[error("no connected path could carry the request")]
    Aborted,
    /// User message plus RTRS header exceed `max_hdr_size`, or header plus data exceed the
    /// chunk (`EMSGSIZE`). Split the IO or shorten the message.
    #[error("request too large for the server's chunk or header room")]
    MsgSize,
    /// The permit already carries a request in flight (`EBUSY`): wait for its completion.
    #[error("the permit already carries a request in flight")]
    Busy,
    /// The permit is not one of this session's, or not taken (`EINVAL`).
    #[error("the permit is not a taken permit of this session")]
    BadPermit,
    /// The driver could not map the request's data for the chosen path (its errno).
    #[error("the request's data could not be mapped: errno {0}")]
    Map(i32),
    /// The session is closed.
    #[error("the session is closed")]
    Closed,
}

impl IoError {
    /// The positive errno Linux RTRS reports in this case.
    pub const fn errno(self) -> i32 {
        match self {
            Self::Remote(e) | Self::Map(e) => e,
            Self::Aborted | Self::Closed => libc::ECONNABORTED,
            Self::MsgSize => libc::EMSGSIZE,
            Self::Busy => libc::EBUSY,
            Self::BadPermit => libc::EINVAL,
        }
    }
}

impl From<IoError> for std::io::Error {
    fn from(e: IoError) -> Self {
        Self::from_raw_os_error(e.errno())
    }
}

/// Why a control operation (open, add or remove a path, reconnect, configuration) was
/// refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum RtrsError {
    /// A configuration value out of its range; the message names the field and the range.
    #[error("invalid configuration: {0}")]
    Config(&'static str),
    /// A path name with `/` or `.`, empty, or longer than 255 bytes (`EINVAL`).
    #[error("path name must be 1..=255 bytes without '/', '.' or NUL")]
    PathName,
    /// The session already has 128 paths (`EINVAL`).
    #[error("a session holds at most 128 paths")]
    TooManyPaths,
    /// No such path (it was removed, or never existed) (`ENOENT`).
    #[error("no such path")]
    NoSuchPath,
    /// The path's state does not allow the operation (`EBUSY`, as the sysfs files answer).
    #[error("the path's state does not allow this now")]
    Busy,
    /// No path is connected (`ECOMM`, `rtrs_clt_query`).
    #[error("no path is connected")]
    NotConnected,
    /// The session is closed.
    #[error("the session is closed")]
    Closed,
    /// A server operation id that is not (or no longer) waiting for its response: answered
    /// already, or its path is gone (`EINVAL`).
    #[error("no request is waiting for a response under this operation id")]
    StaleOp,
    /// `resp_rdma_from` for a request that is not a READ asking for data (`EINVAL`).
    #[error("only a READ that asks for data can be answered from a source; use resp_rdma")]
    NotARead,
    /// `resp_rdma_from` with a source the driver does not know, or without the READ's
    /// length at its offset (`EINVAL`).
    #[error("the source is not registered, or too short for the READ at that offset")]
    Source,
}

impl RtrsError {
    /// The positive errno Linux RTRS reports in this case.
    pub const fn errno(self) -> i32 {
        match self {
            Self::Config(_)
            | Self::PathName
            | Self::TooManyPaths
            | Self::StaleOp
            | Self::NotARead
            | Self::Source => libc::EINVAL,
            Self::NoSuchPath => libc::ENOENT,
            Self::Busy => libc::EBUSY,
            Self::NotConnected => libc::ECOMM,
            Self::Closed => libc::ECONNABORTED,
        }
    }
}

impl From<RtrsError> for std::io::Error {
    fn from(e: RtrsError) -> Self {
        Self::from_raw_os_error(e.errno())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_errors_map_to_linux_errnos() {
        assert_eq!(IoError::Aborted.errno(), libc::ECONNABORTED);
        assert_eq!(IoError::MsgSize.errno(), libc::EMSGSIZE);
        assert_eq!(IoError::Remote(5).errno(), 5);
        assert_eq!(RtrsError::NotConnected.errno(), libc::ECOMM);
        let e: std::io::Error = IoError::MsgSize.into();
        assert_eq!(e.raw_os_error(), Some(libc::EMSGSIZE));
        assert_eq!(Violation::Wire(Bad::SgLen).reason(), Bad::SgLen.reason());
    }
}
