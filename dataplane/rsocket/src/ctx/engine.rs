//! The data-path half of a context: the sockets behind the data lock ([`Data`]), with the
//! operations the data path performs on them, and what never changes after creation
//! ([`Base`]). The control-plane half is in [`control`](super::control); the context
//! joins the two.

use std::time::Duration;

use dp_fabric::sync::{SpinGuard, SpinLock};
use lcore::time::{Clock, RealClock};

use super::sock::{Kind, Phase, Sock, SockId, Stream};
use crate::conn::Ready;
use crate::error::RsError;
use crate::opts::RsConfig;
use dp_fabric::{Completion, Provider};

/// How long a blocking connect or graceful close waits at most.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
pub(super) const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// The data lock and what never changes: the part of a context the control plane works on
/// besides its own state. See the locking section of the [`ctx`](super) docs.
pub(super) struct Base<P: Provider> {
    /// The data lock (L2), taken second and never held across a blocking call.
    pub(super) data: SpinLock<Data<P>>,
    /// Immutable after creation, read without a lock.
    pub(super) dev: P::Device,
    /// The protection domain new sockets use; immutable, read without a lock.
    pub(super) pd: P::Pd,
    pub(super) cfg: RsConfig,
    pub(super) clock: RealClock,
}

impl<P: Provider> Base<P> {
    /// Takes the data lock (L2).
    pub(super) fn data(&self) -> SpinGuard<'_, Data<P>> {
        self.data.lock()
    }
}

/// The sockets, behind the data lock. Nothing here blocks, allocates on the data path, or
/// makes a system call; resources are built and dropped outside this lock.
pub(super) struct Data<P: Provider> {
    pub(super) socks: Vec<Option<Sock<P>>>,
    pub(super) free_ids: Vec<u32>,
    pub(super) scratch: Vec<Completion>,
    pub(super) keepalive_socks: usize,
    /// Streams whose sends wait in their send ring for credits (see `conn::send`): made
    /// progress on with every other progress, so the bytes go out even if the application
    /// never calls on that socket again.
    pub(super) unposted: Vec<SockId>,
}

impl<P: Provider> Data<P> {
    pub(super) fn new() -> Self {
        Self {
            socks: Vec::new(),
            free_ids: Vec::new(),
            scratch: vec![Completion::default(); 64],
            keepalive_socks: 0,
            unposted: Vec::with_capacity(16),
        }
    }

    pub(super) fn sock(&mut self, id: SockId) -> Result<&mut Sock<P>, RsError> {
        self.socks
            .get_mut(id.0 as usize)
            .and_then(Option::as_mut)
            .ok_or(RsError::BadSocket)
    }

    pub(super) fn stream(&mut self, id: SockId) -> Result<&mut Stream<P>, RsError> {
        match &mut self.sock(id)?.kind {
            Kind::Stream(s) => Ok(s),
            Kind::Failed(e) => Err(*e),
            _ => Err(RsError::NotConnected),
        }
    }

    /// [`stream`](Self::stream) for I/O: a socket still opening reads as connecting
    /// (`EWOULDBLOCK`), like a stream whose connection is not yet established.
    fn stream_io(&mut self, id: SockId) -> Result<&mut Stream<P>, RsError> {
        match &mut self.sock(id)?.kind {
            Kind::Stream(s) => Ok(s),
            Kind::Opening => Err(RsError::WouldBlock),
            Kind::Failed(e) => Err(*e),
            _ => Err(RsError::NotConnected),
        }
    }

    pub(super) fn alloc_id(&mut self, s: Sock<P>) -> SockId {
        match self.free_ids.pop() {
            Some(i) => {
                self.socks[i as usize] = Some(s);
                SockId(i)
            }
            None => {
                self.socks.push(Some(s));
                SockId(self.socks.len() as u32 - 1)
            }
        }
    }

    /// Takes a socket out of the table (for close); the caller drops its resources after
    /// releasing the data lock.
    pub(super) fn take(&mut self, id: SockId) -> Option<Sock<P>> {
        let sock = self.socks.get_mut(id.0 as usize)?.take()?;
        self.free_ids.push(id.0);
        if sock.opts.keepalive {
            self.keepalive_socks = self.keepalive_socks.saturating_sub(1);
        }
        Some(sock)
    }

    /// Processes every socket's completions and due keepalive timers. Connection events
    /// are the CM thread's (see [`Control::cm_events`]).
    pub(super) fn progress(&mut self, clock: &RealClock) -> usize {
        let mut work = 0;
        let (socks, scratch) = (&mut self.socks, &mut self.scratch);
        for s in socks.iter_mut().flatten() {
            if let Kind::Stream(st) = &mut s.kind {
                work += st.progress(scratch);
            }
        }
        if self.keepalive_socks > 0 {
            let now = clock.now();
            for s in self.socks.iter_mut().flatten() {
                if let Kind::Stream(st) = &mut s.kind
                    && st.conn.poll_timeout().is_some_and(|t| t <= now)
                {
                    let (conn, mut io) = st.io();
                    conn.handle_timeout(now, &mut io);
                    work += 1;
                }
            }
        }
        work
    }

    /// Progress for one socket only: the cheap path of a blocking call on that socket
    /// (and for the sockets whose buffered sends wait for credits, if any).
    pub(super) fn progress_one(&mut self, id: SockId) -> usize {
        let mut work = self.progress_stream(id);
        if !self.unposted.is_empty() {
            work += self.progress_unposted();
        }
        work
    }

    fn progress_stream(&mut self, id: SockId) -> usize {
        let scratch = &mut self.scratch;
        if let Some(Some(Sock {
            kind: Kind::Stream(st),
            ..
        })) = self.socks.get_mut(id.0 as usize)
        {
            return st.progress(scratch);
        }
        0
    }

    /// Progress on the sockets with buffered sends; drops those that have none left (or
    /// are gone).
    fn progress_unposted(&mut self) -> usize {
        let mut work = 0;
        let mut i = 0;
        while i < self.unposted.len() {
            let id = self.unposted[i];
            work += self.progress_stream(id);
            let still = matches!(
                self.socks.get(id.0 as usize),
                Some(Some(Sock { kind: Kind::Stream(st), .. })) if st.conn.has_unposted()
            );
            if still {
                i += 1;
            } else {
                self.unposted.swap_remove(i);
            }
        }
        work
    }

    /// Hands out a connection accepted in the background.
    pub(super) fn accept(&mut self, lid: SockId) -> Result<SockId, RsError> {
        let sock = self.sock(lid)?;
        let Kind::Listening(l) = &mut sock.kind else {
            return Err(RsError::Invalid);
        };
        l.accepted.pop_front().ok_or(RsError::WouldBlock)
    }

    pub(super) fn send(&mut self, id: SockId, data: &[u8]) -> Result<usize, RsError> {
        let st = self.stream_io(id)?;
        match st.phase {
            Phase::Established => {}
            _ => return Err(RsError::WouldBlock),
        }
        let (c, mut io) = st.io();
        let r = c.send(data, &mut io);
        if c.has_unposted() && !self.unposted.contains(&id) {
            self.unposted.push(id);
        }
        r
    }

    /// True while `id` holds sends buffered for want of credits.
    pub(super) fn has_unposted(&mut self, id: SockId) -> bool {
        self.stream(id).is_ok_and(|st| st.conn.has_unposted())
    }

    /// One attempt of a receive on `id`: a receive, and if that would block,
    /// [`progress_one`](Self::progress_one) and a second receive if the progress did
    /// something; with the socket's non-blocking flag. The socket is looked up once for
    /// all of it (this is every spin of a reader waiting for its answer).
    ///
    /// # Errors
    /// [`RsError::BadSocket`] if `id` names no socket; the receive's own result otherwise.
    pub(super) fn recv_polled(
        &mut self,
        id: SockId,
        buf: &mut [u8],
        peek: bool,
    ) -> Result<(Result<usize, RsError>, bool), RsError> {
        let sock = self
            .socks
            .get_mut(id.0 as usize)
            .and_then(Option::as_mut)
            .ok_or(RsError::BadSocket)?;
        let nonblocking = sock.nonblocking;
        let mut blocked = false;
        let r = match &mut sock.kind {
            Kind::Stream(st) => {
                let r = stream_recv(st, buf, peek);
                blocked = matches!(r, Err(RsError::WouldBlock));
                // A poll that brought nothing leaves the answer as it was.
                if blocked && st.progress(&mut self.scratch) > 0 {
                    stream_recv(st, buf, peek)
                } else {
                    r
                }
            }
            Kind::Opening => {
                blocked = true;
                Err(RsError::WouldBlock)
            }
            Kind::Failed(e) => Err(*e),
            _ => Err(RsError::NotConnected),
        };
        if blocked && !self.unposted.is_empty() {
            // As `progress_one`: the sockets with buffered sends move too.
            self.progress_unposted();
        }
        Ok((r, nonblocking))
    }

    /// `riowrite` on an established stream.
    pub(super) fn iowrite(
        &mut self,
        id: SockId,
        data: &[u8],
        offset: u64,
    ) -> Result<usize, RsError> {
        let st = self.stream_io(id)?;
        if st.phase != Phase::Established {
            return Err(RsError::WouldBlock);
        }
        let (conn, mut io) = st.io();
        conn.iowrite(data, offset, &mut io)
    }

    pub(super) fn readiness(&mut self, id: SockId) -> Result<Ready, RsError> {
        let sock = self.sock(id)?;
        Ok(match &mut sock.kind {
            Kind::Fresh | Kind::Opening => Ready::default(),
            Kind::Listening(l) => Ready {
                readable: !l.accepted.is_empty(),
                ..Ready::default()
            },
            Kind::Failed(_) => Ready {
                readable: true,
                writable: true,
                hup: false,
                err: true,
            },
            Kind::Stream(st) => match st.phase {
                Phase::Established => {
                    let (c, io) = st.io();
                    c.readiness(&io)
                }
                _ => Ready::default(),
            },
        })
    }
}

/// A receive on an established stream (`rrecv`'s core): the bytes queued, and the credits
/// returned at once when some were consumed.
fn stream_recv<P: Provider>(
    st: &mut Stream<P>,
    buf: &mut [u8],
    peek: bool,
) -> Result<usize, RsError> {
    if st.phase != Phase::Established {
        return Err(RsError::WouldBlock);
    }
    let (c, mut io) = st.io();
    let r = c.recv(buf, peek, &io);
    if matches!(r, Ok(n) if n > 0) && !peek {
        // Return credits at once: senders stall otherwise (re-posts may wait: see
        // `StreamConn::after_data`).
        c.after_data(&mut io);
    }
    r
}
