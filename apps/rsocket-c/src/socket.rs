//! Socket lifecycle: `rsocket`, `rbind`, `rlisten`, `raccept`, `rconnect`, `rshutdown`,
//! `rclose`, and the address queries.

use std::net::SocketAddr;
use std::sync::Arc;

use dataplane::fabric::Provider;
use dataplane::rsocket::{RsDatagram, RsError, Shutdown, SockId};
use libc::c_int;

use crate::addr;
use crate::engine::Engine;
use crate::errno::Errno;
use crate::handles::{Handle, Kind, new_name};

/// Checks `rsocket`'s arguments before anything starts: only `AF_INET`/`AF_INET6` stream
/// (TCP) or datagram (UDP) sockets are rsockets.
///
/// `rsocket` calls this before it starts the engine, and that order matters under
/// librdmacm's `librspreload.so`: the preload turns every `socket()` of the process into an
/// `rsocket()` first, including the `AF_UNIX` sockets this library opens for itself while
/// the engine starts (the shm provider's rendezvous) and later on its own threads. Those
/// must fail here at once, so that the preload falls back to the kernel's `socket()`,
/// instead of waiting for the engine that is starting (a self-deadlock).
///
/// # Errors
/// `EOPNOTSUPP` for anything else, as librdmacm.
pub(crate) fn check_socket_args(domain: c_int, ty: c_int, protocol: c_int) -> Result<(), Errno> {
    let base = ty & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC);
    let supported = (domain == libc::AF_INET || domain == libc::AF_INET6)
        && match base {
            libc::SOCK_STREAM => protocol == 0 || protocol == libc::IPPROTO_TCP,
            libc::SOCK_DGRAM => protocol == 0 || protocol == libc::IPPROTO_UDP,
            _ => false,
        };
    if supported {
        Ok(())
    } else {
        Err(Errno(libc::EOPNOTSUPP))
    }
}

impl<P: Provider> Engine<P> {
    /// The rsocket named `fd`.
    ///
    /// # Errors
    /// `EBADF` if `fd` is not an rsocket.
    pub(crate) fn handle(&self, fd: c_int) -> Result<Arc<Handle<P>>, Errno> {
        self.handles.get(fd).ok_or(Errno(libc::EBADF))
    }

    /// The stream socket named `fd`.
    ///
    /// # Errors
    /// `EBADF` if `fd` is not an rsocket; `err` if it is a datagram socket.
    pub(crate) fn stream(&self, fd: c_int, err: c_int) -> Result<SockId, Errno> {
        match self.handle(fd)?.kind {
            Kind::Stream(id) => Ok(id),
            Kind::Dgram(_) => Err(Errno(err)),
        }
    }

    /// `rsocket(domain, type, protocol)`.
    ///
    /// # Errors
    /// `EOPNOTSUPP` for anything but `AF_INET`/`AF_INET6` stream (TCP) or datagram (UDP)
    /// sockets, as librdmacm; descriptor exhaustion.
    pub(crate) fn socket(&self, domain: c_int, ty: c_int, protocol: c_int) -> Result<c_int, Errno> {
        check_socket_args(domain, ty, protocol)?;
        let flags = ty & (libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC);
        let base = ty & !flags;
        let nonblocking = flags & libc::SOCK_NONBLOCK != 0;
        let name = new_name(flags & libc::SOCK_CLOEXEC != 0)?;
        let kind = if base == libc::SOCK_STREAM {
            Kind::Stream(self.ctx.socket(nonblocking))
        } else {
            let mut d = RsDatagram::unbound(&self.ctx);
            d.set_nonblocking(nonblocking);
            Kind::Dgram(Box::new(std::sync::Mutex::new(d)))
        };
        Ok(self.handles.insert(name, domain, kind))
    }

    fn check_family(h: &Handle<P>, a: &SocketAddr) -> Result<(), Errno> {
        // An AF_INET socket takes IPv4 only; AF_INET6 takes both (IPv4 as mapped addresses).
        if h.family == libc::AF_INET && a.is_ipv6() {
            return Err(Errno(libc::EAFNOSUPPORT));
        }
        Ok(())
    }

    /// `rbind`.
    ///
    /// # Errors
    /// `EBADF`, `EAFNOSUPPORT`, `EINVAL` (already bound or in use), `EADDRINUSE`.
    pub(crate) fn bind(&self, fd: c_int, a: SocketAddr) -> Result<(), Errno> {
        let h = self.handle(fd)?;
        Self::check_family(&h, &a)?;
        match &h.kind {
            Kind::Stream(id) => self.ctx.bind(*id, a)?,
            Kind::Dgram(d) => Handle::dgram(d).bind_addr(a)?,
        }
        Ok(())
    }

    /// `rlisten`.
    ///
    /// # Errors
    /// `EBADF`, `EOPNOTSUPP` on a datagram socket, `EINVAL` if unbound or connected,
    /// `EADDRINUSE`.
    pub(crate) fn listen(&self, fd: c_int, backlog: c_int) -> Result<(), Errno> {
        let id = self.stream(fd, libc::EOPNOTSUPP)?;
        // Like listen(2), a backlog below one still admits one pending connection.
        let backlog = u32::try_from(backlog).unwrap_or(0).max(1);
        self.ctx.listen(id, backlog)?;
        Ok(())
    }

    /// `raccept`: returns the new rsocket and its peer. Accepted sockets inherit the
    /// listener's options and `O_NONBLOCK`, as in librdmacm.
    ///
    /// # Errors
    /// `EBADF` if `fd` is not a listening rsocket (librdmacm's code), `EWOULDBLOCK` on a
    /// non-blocking listener with nothing pending, descriptor exhaustion.
    pub(crate) fn accept(&self, fd: c_int) -> Result<(c_int, SocketAddr, c_int), Errno> {
        let h = self.handle(fd)?;
        let Kind::Stream(lid) = h.kind else {
            return Err(Errno(libc::EBADF));
        };
        // Take the descriptor first: if that fails, nothing has been accepted yet.
        let name = new_name(false)?;
        let id = match self.ctx.accept(lid) {
            Ok(id) => id,
            Err(RsError::Invalid) => return Err(Errno(libc::EBADF)),
            Err(e) => return Err(e.into()),
        };
        let peer = match self.ctx.peer_addr(id) {
            Ok(p) => p,
            Err(e) => {
                self.ctx.close(id);
                return Err(e.into());
            }
        };
        let fl_flags = h.extra().fl_flags;
        let n = self.handles.insert(name, h.family, Kind::Stream(id));
        self.handle(n)?.extra().fl_flags = fl_flags;
        Ok((n, peer, h.family))
    }

    /// `rconnect`.
    ///
    /// # Errors
    /// `EINPROGRESS` (non-blocking), `ECONNREFUSED`, `ETIMEDOUT`, `EISCONN`, ...
    pub(crate) fn connect(&self, fd: c_int, a: SocketAddr) -> Result<(), Errno> {
        let h = self.handle(fd)?;
        Self::check_family(&h, &a)?;
        match &h.kind {
            Kind::Stream(id) => self.ctx.connect(*id, a)?,
            Kind::Dgram(d) => Handle::dgram(d).connect(a)?,
        }
        Ok(())
    }

    /// `rshutdown`. Always blocking on streams, as in librdmacm: it returns once the
    /// shutdown message and every queued send completed. A no-op on datagram sockets.
    ///
    /// # Errors
    /// `EBADF`, `EINVAL` for a bad `how`, `ENOTCONN`.
    pub(crate) fn shutdown(&self, fd: c_int, how: c_int) -> Result<(), Errno> {
        let how = match how {
            libc::SHUT_RD => Shutdown::Read,
            libc::SHUT_WR => Shutdown::Write,
            libc::SHUT_RDWR => Shutdown::Both,
            _ => return Err(Errno(libc::EINVAL)),
        };
        match self.handle(fd)?.kind {
            Kind::Stream(id) => Ok(self.ctx.shutdown(id, how)?),
            Kind::Dgram(_) => Ok(()),
        }
    }

    /// `rclose`: a connected stream shuts down gracefully first (blocking), as in
    /// librdmacm; a datagram socket waits (briefly) for its sends.
    ///
    /// # Errors
    /// `EBADF` if `fd` is not an rsocket (librdmacm returns a positive `EBADF`; this returns
    /// -1 and sets errno).
    pub(crate) fn close(&self, fd: c_int) -> Result<(), Errno> {
        let h = self.handles.remove(fd).ok_or(Errno(libc::EBADF))?;
        if let Kind::Stream(id) = h.kind {
            self.ctx.close(id);
        }
        // The datagram socket (and the descriptor naming the handle) go with the last
        // reference: here, unless another thread is inside a call on it.
        drop(h);
        Ok(())
    }

    /// `rgetsockname`: the local address; an unbound socket reports the unspecified
    /// address, like getsockname(2).
    ///
    /// # Errors
    /// `EBADF`.
    pub(crate) fn local_addr(&self, fd: c_int) -> Result<(SocketAddr, c_int), Errno> {
        let h = self.handle(fd)?;
        let r = match &h.kind {
            Kind::Stream(id) => self.ctx.local_addr(*id),
            Kind::Dgram(d) => Handle::dgram(d).local_addr(),
        };
        match r {
            Ok(a) => Ok((a, h.family)),
            Err(RsError::NotConnected) => Ok((addr::unspecified(h.family), h.family)),
            Err(e) => Err(e.into()),
        }
    }

    /// `rgetpeername`.
    ///
    /// # Errors
    /// `EBADF`, `ENOTCONN`.
    pub(crate) fn peer_addr(&self, fd: c_int) -> Result<(SocketAddr, c_int), Errno> {
        let h = self.handle(fd)?;
        let a = match &h.kind {
            Kind::Stream(id) => self.ctx.peer_addr(*id)?,
            Kind::Dgram(d) => Handle::dgram(d).peer_addr()?,
        };
        Ok((a, h.family))
    }
}
