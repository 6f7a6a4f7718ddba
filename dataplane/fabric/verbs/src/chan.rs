//! The shared part of a CM event channel ([`ChanInner`]): the non-blocking
//! `rdma_event_channel` itself and its connection table, which maps a [`ConnId`] to the
//! connection's id, queue-pair tracking state, addresses and [`Phase`].
//!
//! The channel's owner ([`VerbsCm`](crate::VerbsCm), in `cm`) fills the table and handles
//! its events; each connected queue pair (`qp`) keeps an `Arc` of it, so the channel outlives
//! every id on it, and takes its entry out of the table (under the table's lock) before it
//! destroys its id. Both depend on this file; it depends only on the device state below it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};

use rdma_sys as ffi;

use crate::dev::{DevInner, lock};
use crate::sys::IdPtr;
use crate::track::Track;
use dp_fabric::error::{FabricError, Result};
use dp_fabric::traits::ConnId;

/// Where a connection is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// REQ sent (active) or REP sent (passive).
    Connecting,
    /// Up.
    Established,
    /// Over; reported.
    Ended,
}

/// One connection in the channel's table.
pub(crate) struct ConnEntry {
    /// The connection's id: live while the entry is in the table.
    pub id: IdPtr,
    /// The queue pair's tracking state.
    pub track: Arc<Track>,
    /// This side sent the request.
    pub active: bool,
    pub local: SocketAddr,
    pub peer: SocketAddr,
    pub phase: Phase,
    /// Disconnected locally (and reported) already.
    pub local_disconnect: bool,
}

impl ConnEntry {
    /// True if dropping the queue pair should send a disconnect.
    pub(crate) fn may_disconnect(&self) -> bool {
        self.phase != Phase::Ended
    }
}

/// A CM event channel and its connection table.
pub(crate) struct ChanInner {
    pub dev: Arc<DevInner>,
    pub ch: *mut ffi::rdma_event_channel,
    pub conns: Mutex<HashMap<ConnId, ConnEntry>>,
}

// SAFETY: the channel is used through librdmacm calls that are thread safe; the table is
// behind a mutex; the channel is destroyed only in Drop, when nothing refers to it.
unsafe impl Send for ChanInner {}
// SAFETY: as above.
unsafe impl Sync for ChanInner {}

impl Drop for ChanInner {
    fn drop(&mut self) {
        // Queue pairs and connection requests hold an Arc of the channel, and the listeners
        // were destroyed by VerbsCm's Drop, so no id lives on it any more.
        // SAFETY: ch came from rdma_create_event_channel and is destroyed once.
        unsafe { ffi::rdma_destroy_event_channel(self.ch) };
    }
}

impl ChanInner {
    /// Creates a non-blocking event channel on `dev` with an empty connection table.
    pub(crate) fn new(dev: &Arc<DevInner>) -> Result<Arc<Self>> {
        // SAFETY: no arguments; NULL with errno on failure.
        let ch = unsafe { ffi::rdma_create_event_channel() };
        if ch.is_null() {
            return Err(FabricError::last_os("rdma_create_event_channel"));
        }
        let inner = Arc::new(Self {
            dev: dev.clone(),
            ch,
            conns: Mutex::new(HashMap::new()),
        });
        let chfd = inner.fd();
        // SAFETY: F_GETFL/F_SETFL on the channel's descriptor.
        let ok = unsafe {
            let fl = libc::fcntl(chfd, libc::F_GETFL);
            fl >= 0 && libc::fcntl(chfd, libc::F_SETFL, fl | libc::O_NONBLOCK) == 0
        };
        if !ok {
            return Err(FabricError::last_os(
                "making the CM event channel non-blocking",
            ));
        }
        Ok(inner)
    }

    /// The channel's descriptor (readable while an event is pending).
    pub(crate) fn fd(&self) -> RawFd {
        // SAFETY: ch is live.
        unsafe { (*self.ch).fd }
    }

    /// Removes a connection (its queue pair is going away).
    pub(crate) fn remove(&self, conn: ConnId) -> Option<ConnEntry> {
        lock(&self.conns).remove(&conn)
    }

    /// Adds a connection (its queue pair exists and owns the id).
    pub(crate) fn insert(&self, conn: ConnId, e: ConnEntry) {
        lock(&self.conns).insert(conn, e);
    }
}
