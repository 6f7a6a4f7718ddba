//! rsocket errors, as socket users expect them.

use std::io;

use dp_fabric::FabricError;

/// Why an rsocket call failed. Each variant is one `errno` value librdmacm's rsockets
/// return, so C callers and `std::io::Error` users see what they would with sockets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RsError {
    /// The operation would block (`EWOULDBLOCK`): retry after the socket is ready.
    #[error("operation would block")]
    WouldBlock,
    /// A non-blocking connect is under way (`EINPROGRESS`).
    #[error("connection in progress")]
    InProgress,
    /// Nothing listens at the address, or the peer refused (`ECONNREFUSED`).
    #[error("connection refused")]
    ConnRefused,
    /// The connection was reset: the peer closed, died, or the transport failed
    /// (`ECONNRESET`). Sends after a close report this; rsockets never raise `EPIPE`.
    #[error("connection reset by peer")]
    ConnReset,
    /// The socket is not connected (`ENOTCONN`).
    #[error("socket is not connected")]
    NotConnected,
    /// The socket is already connected (`EISCONN`).
    #[error("socket is already connected")]
    IsConnected,
    /// An argument or the socket's state does not allow the call (`EINVAL`).
    #[error("invalid argument or socket state")]
    Invalid,
    /// A datagram larger than the largest the socket can send (`EMSGSIZE`).
    #[error("message too long for the socket's datagram slots")]
    MsgSize,
    /// Out of a fixed resource: buffers, iomap slots, descriptors (`ENOMEM`).
    #[error("out of resources")]
    NoMemory,
    /// The operation is not supported (`EOPNOTSUPP`), e.g. a protocol version mismatch.
    #[error("operation not supported")]
    NotSupported,
    /// The address is in use (`EADDRINUSE`).
    #[error("address already in use")]
    AddrInUse,
    /// The operation timed out (`ETIMEDOUT`).
    #[error("operation timed out")]
    TimedOut,
    /// A transport error (`EIO`), readable once through `SO_ERROR`.
    #[error("transport error")]
    Io,
    /// Not an rsocket, or already closed (`EBADF`).
    #[error("bad socket")]
    BadSocket,
}

impl RsError {
    /// The `errno` value.
    pub const fn errno(self) -> i32 {
        match self {
            Self::WouldBlock => libc::EWOULDBLOCK,
            Self::InProgress => libc::EINPROGRESS,
            Self::ConnRefused => libc::ECONNREFUSED,
            Self::ConnReset => libc::ECONNRESET,
            Self::NotConnected => libc::ENOTCONN,
            Self::IsConnected => libc::EISCONN,
            Self::Invalid => libc::EINVAL,
            Self::MsgSize => libc::EMSGSIZE,
            Self::NoMemory => libc::ENOMEM,
            Self::NotSupported => libc::EOPNOTSUPP,
            Self::AddrInUse => libc::EADDRINUSE,
            Self::TimedOut => libc::ETIMEDOUT,
            Self::Io => libc::EIO,
            Self::BadSocket => libc::EBADF,
        }
    }

    /// From an `errno` value (unknown values map to [`RsError::Io`]).
    pub const fn from_errno(e: i32) -> Self {
        match e {
            libc::EWOULDBLOCK => Self::WouldBlock,
            libc::EINPROGRESS => Self::InProgress,
            libc::ECONNREFUSED => Self::ConnRefused,
            libc::ECONNRESET => Self::ConnReset,
            libc::ENOTCONN => Self::NotConnected,
            libc::EISCONN => Self::IsConnected,
            libc::EINVAL => Self::Invalid,
            libc::EMSGSIZE => Self::MsgSize,
            libc::ENOMEM => Self::NoMemory,
            libc::EOPNOTSUPP => Self::NotSupported,
            libc::EADDRINUSE => Self::AddrInUse,
            libc::ETIMEDOUT => Self::TimedOut,
            libc::EBADF => Self::BadSocket,
            _ => Self::Io,
        }
    }
}

/// The socket error a fabric control-path failure means.
pub(crate) fn fabric_err(e: &FabricError) -> RsError {
    match e {
        FabricError::ConnectionRefused { .. } => RsError::ConnRefused,
        FabricError::AddrInUse { .. } => RsError::AddrInUse,
        FabricError::Timeout { .. } => RsError::TimedOut,
        FabricError::InvalidArgument { .. } | FabricError::PrivateDataTooLong { .. } => {
            RsError::Invalid
        }
        FabricError::Exhausted { .. } => RsError::NoMemory,
        FabricError::NoDevice { .. } | FabricError::ProviderNotBuilt { .. } => {
            RsError::NotSupported
        }
        FabricError::Io { source, .. } => io_err(source),
        _ => RsError::Io,
    }
}

/// The socket error an OS error means.
pub(crate) fn io_err(e: &io::Error) -> RsError {
    match e.kind() {
        io::ErrorKind::WouldBlock => RsError::WouldBlock,
        _ => e.raw_os_error().map_or(RsError::Io, RsError::from_errno),
    }
}

impl From<RsError> for io::Error {
    fn from(e: RsError) -> Self {
        // The raw OS error keeps errno exact; std derives the ErrorKind from it
        // (WouldBlock, ConnectionRefused, ConnectionReset, NotConnected, InvalidInput, ...).
        Self::from_raw_os_error(e.errno())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_to_io_error_kinds() {
        let k = |e: RsError| io::Error::from(e).kind();
        assert_eq!(k(RsError::WouldBlock), io::ErrorKind::WouldBlock);
        assert_eq!(k(RsError::ConnRefused), io::ErrorKind::ConnectionRefused);
        assert_eq!(k(RsError::ConnReset), io::ErrorKind::ConnectionReset);
        assert_eq!(k(RsError::NotConnected), io::ErrorKind::NotConnected);
        assert_eq!(k(RsError::Invalid), io::ErrorKind::InvalidInput);
        assert_eq!(k(RsError::AddrInUse), io::ErrorKind::AddrInUse);
        assert_eq!(k(RsError::TimedOut), io::ErrorKind::TimedOut);
        for e in [
            RsError::MsgSize,
            RsError::Io,
            RsError::NoMemory,
            RsError::InProgress,
        ] {
            assert_eq!(RsError::from_errno(e.errno()), e);
        }
    }
}
