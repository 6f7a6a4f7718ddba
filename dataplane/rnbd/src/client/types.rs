//! The public types of the client: transport trait, handles, geometry, errors, events.

use thiserror::Error;

use crate::server::Dir;
use crate::wire::SECTOR;

/// Which of the session's RTRS connections a message travels on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Con {
    /// The admin connection (session info, open, close).
    Admin,
    /// An IO connection.
    Io,
}

/// Memory of the user's, registered with the driver, in the driver's own numbering.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Buf {
    /// The driver's registration.
    pub region: u32,
    /// Offset of the first byte in it.
    pub offset: u64,
    /// Bytes.
    pub len: u32,
}

/// What a request carries besides its message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Payload {
    /// Nothing (close, flush, discard, write-zeroes).
    None,
    /// A response of up to this many bytes the server RDMA-writes into a buffer of the
    /// driver's; the driver passes its bytes back to [`ClientSession::complete`](super::ClientSession::complete).
    Answer(u32),
    /// The user's data: the source of a write, the destination of a read.
    Data(Buf),
}

/// Why the transport did not take a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum SubmitError {
    /// No permit free: try again after a completion.
    #[error("no free permit")]
    Busy,
    /// The session has no connected path, or is closed.
    #[error("no connected path")]
    NoPath,
    /// The message or data is larger than the server takes.
    #[error("request larger than the server accepts")]
    TooLarge,
}

/// The transport a client session sends its messages through (an RTRS client session).
pub trait ClientTransport {
    /// Sends `usr` as an RTRS request `dir` on `con` with `payload`. The request's
    /// completion must be reported once with [`ClientSession::complete`](super::ClientSession::complete) and `tag`.
    ///
    /// # Errors
    /// [`SubmitError`]: nothing was sent and no completion will come.
    fn submit(
        &mut self,
        tag: u64,
        con: Con,
        dir: Dir,
        usr: &[u8],
        payload: Payload,
    ) -> Result<(), SubmitError>;
}

/// A mapped (or mapping) device of a session. Stale handles are refused, never confused
/// with a device mapped later in the same slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DevId {
    pub(super) slot: u32,
    pub(super) generation: u32,
}

impl DevId {
    /// The slot number (for display; stable while the device is mapped).
    pub fn index(self) -> u32 {
        self.slot
    }
}

/// The state of a device (Linux `enum rnbd_clt_dev_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DevState {
    /// OPEN sent, no answer yet.
    Init,
    /// Open; IO is accepted.
    Mapped,
    /// The session lost every path; the device is reopened when one comes back.
    MappedDisconnected,
    /// CLOSE sent; the device goes away once it and every IO of it completed.
    Unmapped,
}

impl DevState {
    /// The word Linux shows in `/sys/block/rnbdN/rnbd/state`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Init => "init",
            Self::Mapped => "open",
            Self::MappedDisconnected => "closed",
            Self::Unmapped => "unmapped",
        }
    }
}

/// A device's geometry and limits as the client uses them (from `OPEN_RSP`, checked).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevGeometry {
    /// Size in 512-byte sectors.
    pub nsectors: u64,
    /// Logical block size: IO offsets and lengths are multiples of it.
    pub logical_block: u32,
    /// Physical block size.
    pub physical_block: u32,
    /// Largest read or write in bytes: the server's `max_hw_sectors` capped by the
    /// transport's largest request.
    pub max_io: u32,
    /// Largest discard in sectors (0: not supported).
    pub max_discard_sectors: u32,
    /// Largest write-zeroes in sectors (0: not supported; Linux 6.1 servers send 0).
    pub max_write_zeroes_sectors: u32,
    /// The device has a volatile write cache (flush matters).
    pub write_cache: bool,
    /// The device honours FUA.
    pub fua: bool,
}

impl DevGeometry {
    /// Size in bytes.
    pub fn bytes(&self) -> u64 {
        self.nsectors * SECTOR
    }
}

/// Flags of a write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteFlags {
    /// Durable on completion (`REQ_FUA`).
    pub fua: bool,
    /// Make every earlier completed write durable first (`REQ_PREFLUSH`): sent as a
    /// FLUSH, then the write.
    pub preflush: bool,
    /// A synchronous write (`REQ_SYNC`, a scheduling hint).
    pub sync: bool,
}

/// Why a block IO (or a map, or an unmap) was refused at the call. Nothing was sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum BlkError {
    /// The handle names no device of this session (unmapped, or from another session).
    #[error("no such device in this session: the handle is stale or from another session")]
    NoDevice,
    /// The device is not mapped (still opening, disconnected, or unmapping).
    #[error("the device is not mapped (state {0:?}); wait for Mapped")]
    NotMapped(DevState),
    /// The session has not finished its session-info exchange.
    #[error("the session is not ready; wait for SessionReady")]
    NotReady,
    /// Offset or length is not a multiple of the logical block size, or the buffer's
    /// length does not match.
    #[error("offset and length must be multiples of the device's logical block size")]
    Unaligned,
    /// The IO reaches past the end of the device.
    #[error("the IO reaches past the end of the device")]
    OutOfRange,
    /// The IO is larger than the device or transport takes in one request.
    #[error("the IO is larger than the largest request (max_io); split it")]
    TooLarge,
    /// The device does not support the operation (discard, write-zeroes).
    #[error("the device does not support this operation")]
    Unsupported,
    /// The device is mapped read-only.
    #[error("the device is mapped read-only")]
    ReadOnly,
    /// No permit free: retry after a completion.
    #[error("no free permit; retry after a completion")]
    Busy,
    /// The session has no connected path.
    #[error("the session has no connected path")]
    NoPath,
    /// The name is empty, longer than 255 bytes, or holds a NUL.
    #[error("device names are 1 to 255 bytes without NUL")]
    BadName,
    /// The session has as many devices as it can track.
    #[error("too many devices in this session")]
    TooManyDevices,
}

impl BlkError {
    /// The errno a block layer would complete the IO with.
    pub const fn errno(self) -> i32 {
        match self {
            Self::NoDevice => libc::ENODEV,
            Self::NotMapped(_) | Self::NoPath => libc::ENOTCONN,
            Self::NotReady => libc::EAGAIN,
            Self::Unaligned | Self::BadName => libc::EINVAL,
            Self::OutOfRange => libc::ERANGE,
            Self::TooLarge => libc::E2BIG,
            Self::Unsupported => libc::EOPNOTSUPP,
            Self::ReadOnly => libc::EROFS,
            Self::Busy => libc::EBUSY,
            Self::TooManyDevices => libc::EMFILE,
        }
    }
}

impl From<SubmitError> for BlkError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::Busy => Self::Busy,
            SubmitError::NoPath => Self::NoPath,
            SubmitError::TooLarge => Self::TooLarge,
        }
    }
}

/// Something the user of a session should know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientEvent {
    /// The session-info exchange finished: IO and maps may go.
    SessionReady {
        /// The protocol major both speak.
        ver: u8,
    },
    /// The session-info exchange failed (`errno`); the session cannot be used.
    SessionFailed {
        /// Why (`EPROTO`: the server's answer was malformed).
        errno: i32,
    },
    /// A device is mapped (first time, or again after a reconnect: `remapped`).
    Mapped {
        /// The device.
        dev: DevId,
        /// Its geometry.
        geometry: DevGeometry,
        /// True when this is the remap after a reconnect.
        remapped: bool,
    },
    /// Mapping failed; the handle is gone.
    MapFailed {
        /// The device.
        dev: DevId,
        /// Why: the server's errno (`EPERM`, `ENOENT`, ...) or `EPROTO`.
        errno: i32,
    },
    /// The session lost its last path; the device waits for a reconnect.
    Disconnected {
        /// The device.
        dev: DevId,
    },
    /// The remap after a reconnect failed; the device stays disconnected (remap it with
    /// [`ClientSession::remap`](super::ClientSession::remap)).
    RemapFailed {
        /// The device.
        dev: DevId,
        /// Why.
        errno: i32,
    },
    /// The device is unmapped and every IO of it completed; the handle is gone.
    Unmapped {
        /// The device.
        dev: DevId,
    },
    /// An IO completed.
    IoDone {
        /// The device.
        dev: DevId,
        /// The caller's cookie.
        ctx: u64,
        /// `Ok`, or the errno the server or transport reported.
        result: Result<(), i32>,
    },
}

/// Counters of a client session.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// IOs completed successfully.
    pub ios_ok: u64,
    /// IOs completed with an error.
    pub ios_failed: u64,
    /// Responses that failed a check (wrong type, short, impossible geometry).
    pub bad_responses: u64,
    /// Completions for tags no request has (a driver bug, counted and ignored).
    pub unknown_tags: u64,
    /// Remaps after a reconnect.
    pub remaps: u64,
}

/// The errno a refused follow-up request completes with.
pub(crate) fn errno_of(e: BlkError) -> i32 {
    match e {
        BlkError::NoDevice | BlkError::NotMapped(_) => libc::ENODEV,
        BlkError::Busy => libc::EAGAIN,
        BlkError::NoPath | BlkError::NotReady => libc::ENOTCONN,
        BlkError::ReadOnly => libc::EROFS,
        BlkError::Unsupported => libc::EOPNOTSUPP,
        BlkError::TooLarge => libc::EFBIG,
        BlkError::Unaligned
        | BlkError::OutOfRange
        | BlkError::BadName
        | BlkError::TooManyDevices => libc::EINVAL,
    }
}
