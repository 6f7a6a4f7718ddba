//! What a client session reports to its user ([`ClientEvent`], drained with
//! `ClientSession::poll_event`).

use crate::error::{IoError, PathError};
use crate::work::PathId;

/// `enum rtrs_clt_link_ev`: the session as a whole lost or regained every path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinkEv {
    /// `RTRS_CLT_LINK_EV_RECONNECTED`: a path is connected again after none was.
    Reconnected,
    /// `RTRS_CLT_LINK_EV_DISCONNECTED`: the last connected path went down.
    Disconnected,
}

/// An event of a client session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientEvent {
    /// A request finished (`conf_fn`): exactly once per accepted request. `id` is its
    /// permit's chunk; the permit may be returned now. A READ's data is in its buffer.
    Completed {
        /// The permit (chunk) id.
        id: u16,
        /// The caller's cookie.
        ctx: u64,
        /// Success, or why not.
        result: Result<(), IoError>,
    },
    /// Every initial path is connected (`rtrs_clt_open` returned): permits exist now.
    Opened {
        /// Chunks of the session, and so permits.
        queue_depth: u16,
        /// The smallest `max_io_size` of the paths.
        max_io_size: u32,
    },
    /// An initial path failed to connect, so the open failed (`rtrs_clt_open` returned an
    /// error); every path is closed.
    OpenFailed {
        /// The path.
        path: PathId,
        /// Why.
        error: PathError,
    },
    /// A path reached CONNECTED (first time or after a reconnect).
    PathUp {
        /// The path.
        path: PathId,
    },
    /// A path left CONNECTED; its requests were failed over; a reconnect is scheduled.
    PathDown {
        /// The path.
        path: PathId,
        /// Why.
        error: PathError,
    },
    /// A reconnect attempt failed; another is scheduled unless the attempts are exhausted.
    ReconnectFailed {
        /// The path.
        path: PathId,
        /// Why.
        error: PathError,
    },
    /// A path added at run time failed to connect and was removed (sysfs `add_path`
    /// failing).
    PathAddFailed {
        /// The path.
        path: PathId,
        /// Why.
        error: PathError,
    },
    /// A path is CLOSED (on request, or after `max_reconnect_attempts`).
    PathClosed {
        /// The path.
        path: PathId,
    },
    /// A path was removed (DEAD).
    PathRemoved {
        /// The path.
        path: PathId,
    },
    /// The session lost its last path, or regained one.
    Link(LinkEv),
    /// The session is closed: every path is closed and every request completed.
    Closed,
}
