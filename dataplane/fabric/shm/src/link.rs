//! The control link of one connection: its Unix socket to the peer, where the CM exchange
//! stands, and the acknowledgements of region announcements.
//!
//! Protection domains announce newly exported regions over the links of every connection
//! of theirs and wait for the acknowledgement ([`Link::wait_mr_ack`]), so a key handed out
//! afterwards works at once on the peer's side. The link knows nothing of queue pairs or
//! CM channels: those live above it, in the connection that owns it.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::msg::Msg;
use crate::unix;
use crate::util::lock;

/// Where a connection is in the CM exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConnState {
    /// Active side: REQ sent, waiting for REP or REJ.
    Connecting,
    /// Passive side: REP sent, waiting for RTU.
    Accepted,
    /// Both sides mapped and ready.
    Established,
    /// Over.
    Closed,
}

/// One connection's control socket and state.
pub(crate) struct Link {
    pub sock: OwnedFd,
    wlock: Mutex<()>,
    pub state: Mutex<ConnState>,
    acked: Mutex<u64>,
    ack_cv: Condvar,
}

impl Link {
    pub(crate) fn new(sock: OwnedFd, state: ConnState) -> Self {
        Self {
            sock,
            wlock: Mutex::new(()),
            state: Mutex::new(state),
            acked: Mutex::new(0),
            ack_cv: Condvar::new(),
        }
    }

    /// The current state.
    pub(crate) fn state(&self) -> ConnState {
        *lock(&self.state)
    }

    /// Moves to `s`.
    pub(crate) fn set_state(&self, s: ConnState) {
        *lock(&self.state) = s;
    }

    /// Sends one control message with descriptors.
    pub(crate) fn send(&self, msg: &Msg, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        let mut buf = Vec::with_capacity(256);
        msg.encode(&mut buf);
        let _g = lock(&self.wlock);
        unix::send(self.sock.as_raw_fd(), &buf, fds)
    }

    /// Sends a region announcement (if the connection is not over).
    pub(crate) fn announce(&self, msg: &Msg, fd: BorrowedFd<'_>) -> io::Result<()> {
        if self.state() == ConnState::Closed {
            return Err(io::ErrorKind::NotConnected.into());
        }
        self.send(msg, &[fd])
    }

    /// Waits until the peer acknowledged announcement `seq`.
    pub(crate) fn wait_mr_ack(&self, seq: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut a = lock(&self.acked);
        while *a < seq {
            if self.state() == ConnState::Closed {
                return false;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            a = self
                .ack_cv
                .wait_timeout(a, (deadline - now).min(Duration::from_millis(50)))
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        true
    }

    /// The peer acknowledged announcement `seq`.
    pub(crate) fn got_ack(&self, seq: u64) {
        let mut a = lock(&self.acked);
        *a = (*a).max(seq);
        self.ack_cv.notify_all();
    }

    /// The connection is over: wakes every waiter.
    pub(crate) fn close(&self) {
        self.set_state(ConnState::Closed);
        self.ack_cv.notify_all();
    }
}
