//! Errors of the fabric layer.
//!
//! Posting work requests fails with the small `Copy` [`PostError`] (no allocation on the data
//! path); everything on the control path (devices, registration, connection management) fails
//! with the [`FabricError`] enum, whose messages say what was wrong and what to do.

use core::fmt;
use std::io;
use std::net::SocketAddr;

use crate::types::QpState;

/// Why a `post_send`/`post_recv` was refused. Nothing after `index` was posted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PostError {
    /// Index of the first request that was not posted (libibverbs' `bad_wr`).
    pub index: usize,
    /// What was wrong with it.
    pub kind: PostErrorKind,
}

/// The reason a request could not be posted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PostErrorKind {
    /// The work queue is full (`ENOMEM`): poll completions first.
    QueueFull,
    /// More scatter/gather entries than the queue pair was created with (`EINVAL`).
    TooManySge,
    /// An inline payload longer than `max_inline_data` (`EINVAL`).
    InlineTooLong,
    /// A SEND longer than the provider's `max_send_size` (`EINVAL`).
    MessageTooLong,
    /// The queue pair's state does not allow this (`EINVAL`), e.g. sending before it is
    /// connected.
    BadState(QpState),
    /// The operation is not valid on this queue-pair type (`EINVAL`).
    Unsupported,
    /// A memory-window bind names a window or memory region this queue pair cannot use
    /// (another protection domain's, a key that is no window or region, a region without
    /// [`Access::MW_BIND`](crate::Access::MW_BIND)), a range outside the region, or rights a
    /// window cannot grant (`EINVAL`).
    BadBind,
}

impl PostError {
    /// The errno libibverbs would return.
    pub const fn errno(&self) -> i32 {
        match self.kind {
            PostErrorKind::QueueFull => libc::ENOMEM,
            _ => libc::EINVAL,
        }
    }
}

impl fmt::Display for PostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            PostErrorKind::QueueFull => {
                "work queue full: poll the completion queue before posting more".to_string()
            }
            PostErrorKind::TooManySge => {
                "more scatter/gather entries than the queue pair's max_send_sge/max_recv_sge"
                    .to_string()
            }
            PostErrorKind::InlineTooLong => {
                "inline payload longer than the queue pair's max_inline_data".to_string()
            }
            PostErrorKind::MessageTooLong => {
                "SEND longer than the device's max_send_size".to_string()
            }
            PostErrorKind::BadState(s) => format!("queue pair is in state {s:?}"),
            PostErrorKind::Unsupported => "operation not valid on this queue pair".to_string(),
            PostErrorKind::BadBind => "memory-window bind names a window, memory region, \
                                       range or rights this queue pair cannot use"
                .to_string(),
        };
        write!(f, "work request {} not posted: {what}", self.index)
    }
}

impl std::error::Error for PostError {}

impl From<PostError> for io::Error {
    fn from(e: PostError) -> Self {
        Self::from_raw_os_error(e.errno())
    }
}

/// Errors of the fabric control path.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FabricError {
    /// No RDMA device is present, or the named one does not exist.
    #[error(
        "no RDMA device found{}: load a driver or create a Soft-RoCE device \
         (`modprobe rdma_rxe && rdma link add rxe0 type rxe netdev eth0`), \
         or use the shm provider for single-host runs",
        .name.as_deref().map(|n| format!(" named '{n}'")).unwrap_or_default()
    )]
    NoDevice {
        /// The device that was asked for, if any.
        name: Option<String>,
    },
    /// The provider was not compiled in.
    #[error("the '{provider}' provider is not built in: rebuild with `--features {feature}`")]
    ProviderNotBuilt {
        /// Provider name.
        provider: &'static str,
        /// Cargo feature that enables it.
        feature: &'static str,
    },
    /// A system call or library call failed.
    #[error("{op} failed: {source}")]
    Io {
        /// The failing operation, e.g. "mmap of peer region" or "ibv_reg_mr".
        op: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// An argument was out of range.
    #[error("invalid {what}: {why}")]
    InvalidArgument {
        /// The argument.
        what: &'static str,
        /// Why it is invalid and what is allowed.
        why: String,
    },
    /// Memory cannot be registered the way it was asked.
    #[error("cannot register {len} bytes at {addr:#x} with {access}: {why}")]
    Registration {
        /// Start address.
        addr: u64,
        /// Length.
        len: u64,
        /// Requested rights, as text.
        access: String,
        /// Why, and what to do instead.
        why: String,
    },
    /// A fixed-size resource ran out.
    #[error("out of {what} (limit {limit}): {hint}")]
    Exhausted {
        /// The resource.
        what: &'static str,
        /// Its limit.
        limit: u64,
        /// What to do.
        hint: &'static str,
    },
    /// Connection private data longer than the CM allows.
    #[error("private data of {len} bytes exceeds the {max}-byte limit for {msg}")]
    PrivateDataTooLong {
        /// Given length.
        len: usize,
        /// Limit.
        max: usize,
        /// Which CM message (REQ, REP, REJ).
        msg: &'static str,
    },
    /// Nobody listens at the address (`ECONNREFUSED`).
    #[error("connection to {addr} refused: nothing listens there")]
    ConnectionRefused {
        /// Destination.
        addr: SocketAddr,
    },
    /// The address is already being listened on (`EADDRINUSE`).
    #[error("address {addr} is already in use by another listener")]
    AddrInUse {
        /// The address.
        addr: SocketAddr,
    },
    /// The operation did not finish in time.
    #[error("{op} timed out after {ms} ms")]
    Timeout {
        /// The operation.
        op: &'static str,
        /// How long we waited.
        ms: u64,
    },
    /// The peer broke the CM protocol.
    #[error("peer protocol error: {0}")]
    Protocol(&'static str),
    /// The object is in a state that does not allow the call.
    #[error("{0}")]
    BadState(&'static str),
}

impl FabricError {
    /// Wraps the current OS error (`errno`) for operation `op`.
    pub fn last_os(op: &'static str) -> Self {
        Self::Io {
            op,
            source: io::Error::last_os_error(),
        }
    }

    /// The `std::io::ErrorKind` a socket user would expect for this error.
    pub fn io_kind(&self) -> io::ErrorKind {
        match self {
            Self::ConnectionRefused { .. } => io::ErrorKind::ConnectionRefused,
            Self::AddrInUse { .. } => io::ErrorKind::AddrInUse,
            Self::Timeout { .. } => io::ErrorKind::TimedOut,
            Self::InvalidArgument { .. } | Self::PrivateDataTooLong { .. } => {
                io::ErrorKind::InvalidInput
            }
            Self::Io { source, .. } => source.kind(),
            Self::Exhausted { .. } => io::ErrorKind::OutOfMemory,
            Self::NoDevice { .. } | Self::ProviderNotBuilt { .. } => io::ErrorKind::Unsupported,
            _ => io::ErrorKind::Other,
        }
    }
}

impl From<FabricError> for io::Error {
    fn from(e: FabricError) -> Self {
        match e {
            FabricError::Io { source, .. } => source,
            other => Self::new(other.io_kind(), other),
        }
    }
}

/// Result type of the fabric control path.
pub type Result<T, E = FabricError> = core::result::Result<T, E>;
