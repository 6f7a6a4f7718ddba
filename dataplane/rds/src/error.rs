//! [`RdsError`]: why a socket call failed, one variant per `errno` Linux returns, each
//! saying what was wrong.

use std::io;

/// What a blocking call waits for (see [`RdsError::Blocked`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Block {
    /// The destination port is congested: wait for a congestion update that clears it
    /// (`rds_cong_wait`; this wait ignores the send timeout, as in Linux).
    Congestion {
        /// The destination port.
        port: u16,
    },
    /// The send buffer is full: wait until acks free room, up to the send timeout.
    SendSpace,
    /// The engine's message store is full: wait until messages are freed.
    Memory,
    /// Nothing to receive yet: wait for a message or a notification.
    Receive,
}

/// Why an RDS call failed. [`RdsError::errno`] gives the value Linux returns.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RdsError {
    /// `EINVAL`: an argument or the socket's state does not allow the call.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// `EADDRINUSE`: another socket is bound to this address and port.
    #[error("address and port already bound by another RDS socket; pick another port or 0")]
    AddrInUse,
    /// `EADDRNOTAVAIL`: no transport of this engine serves the address.
    #[error("no transport serves this address: add it with RdsEngine::add_local_addr")]
    AddrNotAvailable,
    /// `ENOTCONN`: the socket is unbound, or has no destination.
    #[error("not connected: {0}")]
    NotConnected(&'static str),
    /// `EOPNOTSUPP`: the operation is not supported (here: {0}).
    #[error("operation not supported: {0}")]
    NotSupported(&'static str),
    /// `EMSGSIZE`: the message is longer than allowed.
    #[error("message of {len} bytes exceeds the limit of {limit} bytes ({what})")]
    MessageTooLong {
        /// The message's length.
        len: usize,
        /// The limit it exceeds.
        limit: usize,
        /// Which limit: the 1 MiB protocol limit or the send buffer.
        what: &'static str,
    },
    /// `ENOBUFS`: the destination port is congested (non-blocking send).
    #[error(
        "destination port {port} is congested; retry after a congestion update (RDS_CONG_MONITOR)"
    )]
    Congested {
        /// The destination port.
        port: u16,
    },
    /// `EAGAIN`: the send buffer is full, or nothing is queued to receive (non-blocking).
    #[error("operation would block")]
    WouldBlock,
    /// A blocking call must wait (what for is given): the sans-IO engine never waits
    /// itself. The caller waits for the socket's readiness (or a congestion update) and
    /// calls again; to a C caller it is `EAGAIN` only if it gives up.
    #[error("the call must wait: {0:?}")]
    Blocked(Block),
    /// `ENOMEM`: the engine's fixed tables or message store are full.
    #[error("out of memory: {0}")]
    NoMemory(&'static str),
    /// `ENOPROTOOPT`: unknown option, or a transport that cannot serve the socket.
    #[error("protocol option not available: {0}")]
    NoProtoOpt(&'static str),
    /// `EPROTOTYPE`: the transport is not allowed here.
    #[error("transport not allowed: {0}")]
    ProtoType(&'static str),
    /// `EDESTADDRREQ`: `connect` to the wildcard address.
    #[error("a destination address is required (INADDR_ANY given)")]
    DestAddrRequired,
    /// `ETIMEDOUT`: a blocking call's timeout passed.
    #[error("timed out")]
    TimedOut,
    /// `EBADF`: not a live socket of this engine.
    #[error("not a socket of this engine (closed or never opened)")]
    BadSocket,
    /// `EFAULT`: a malformed option value.
    #[error("bad option value: {0}")]
    Fault(&'static str),
    /// `ESOCKTNOSUPPORT`: RDS sockets are `SOCK_SEQPACKET` with protocol 0.
    #[error("RDS sockets are SOCK_SEQPACKET, protocol 0")]
    SocketType,
}

impl RdsError {
    /// The `errno` value Linux returns for this error.
    pub const fn errno(self) -> i32 {
        match self {
            Self::InvalidArgument(_) => libc_errno::EINVAL,
            Self::AddrInUse => libc_errno::EADDRINUSE,
            Self::AddrNotAvailable => libc_errno::EADDRNOTAVAIL,
            Self::NotConnected(_) => libc_errno::ENOTCONN,
            Self::NotSupported(_) => libc_errno::EOPNOTSUPP,
            Self::MessageTooLong { .. } => libc_errno::EMSGSIZE,
            Self::Congested { .. } => libc_errno::ENOBUFS,
            Self::WouldBlock | Self::Blocked(_) => libc_errno::EAGAIN,
            Self::NoMemory(_) => libc_errno::ENOMEM,
            Self::NoProtoOpt(_) => libc_errno::ENOPROTOOPT,
            Self::ProtoType(_) => libc_errno::EPROTOTYPE,
            Self::DestAddrRequired => libc_errno::EDESTADDRREQ,
            Self::TimedOut => libc_errno::ETIMEDOUT,
            Self::BadSocket => libc_errno::EBADF,
            Self::Fault(_) => libc_errno::EFAULT,
            Self::SocketType => libc_errno::ESOCKTNOSUPPORT,
        }
    }
}

impl From<RdsError> for io::Error {
    fn from(e: RdsError) -> Self {
        let kind = Self::from_raw_os_error(e.errno()).kind();
        Self::new(kind, e)
    }
}

/// Linux x86_64 errno values (the crate needs no libc for these).
mod libc_errno {
    pub const EFAULT: i32 = 14;
    pub const EINVAL: i32 = 22;
    pub const EAGAIN: i32 = 11;
    pub const ENOMEM: i32 = 12;
    pub const EBADF: i32 = 9;
    pub const EMSGSIZE: i32 = 90;
    pub const EPROTOTYPE: i32 = 91;
    pub const ENOPROTOOPT: i32 = 92;
    pub const ESOCKTNOSUPPORT: i32 = 94;
    pub const EOPNOTSUPP: i32 = 95;
    pub const EADDRINUSE: i32 = 98;
    pub const EADDRNOTAVAIL: i32 = 99;
    pub const ENOBUFS: i32 = 105;
    pub const ENOTCONN: i32 = 107;
    pub const ETIMEDOUT: i32 = 110;
    pub const EDESTADDRREQ: i32 = 89;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_errno_values_and_io_kinds() {
        assert_eq!(RdsError::Congested { port: 1 }.errno(), 105);
        assert_eq!(RdsError::WouldBlock.errno(), 11);
        assert_eq!(
            io::Error::from(RdsError::WouldBlock).kind(),
            io::ErrorKind::WouldBlock
        );
        assert_eq!(
            io::Error::from(RdsError::AddrInUse).kind(),
            io::ErrorKind::AddrInUse
        );
        let e = RdsError::MessageTooLong {
            len: 2 << 20,
            limit: 1 << 20,
            what: "RDS_MAX_MSG_SIZE",
        };
        assert_eq!(e.errno(), 90);
        assert!(e.to_string().contains("2097152"));
    }
}
