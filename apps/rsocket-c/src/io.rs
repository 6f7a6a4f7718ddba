//! Data transfer: `rsend`/`rrecv` and their `to`/`from`, `msg`, `read`/`write` and vector
//! forms. Every form goes through [`Engine::send`] and [`Engine::recv`].
//!
//! Differences from librdmacm, where its behaviour is a known defect: `rrecvmsg` and
//! `rreadv` fill every iovec (librdmacm fills only the first) and honour the `flags`
//! argument; `rrecvmsg` reports truncated datagrams with `MSG_TRUNC` and returns no control
//! data (`msg_controllen = 0`) instead of failing.

use std::net::SocketAddr;

use dataplane::fabric::Provider;
use dataplane::rsocket::{RecvFlags, RsError, SendFlagsRs};
use libc::c_int;

use crate::engine::{Engine, SendtoMode};
use crate::errno::Errno;
use crate::handles::{Handle, Kind};

/// What a receive returned.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Received {
    /// Bytes copied.
    pub len: usize,
    /// The sender (datagram) or the peer (stream), when asked for.
    pub from: Option<SocketAddr>,
    /// The datagram was longer than the buffer.
    pub truncated: bool,
    /// The socket's family, for writing `from`.
    pub family: c_int,
}

/// The errno of a failed data call on a stream. A stream whose connect failed keeps its
/// connect error, which `rconnect` or `SO_ERROR` reported already; its data calls fail
/// with `ENOTCONN`, as librdmacm's and Linux's do.
pub(crate) fn data_err(e: RsError) -> Errno {
    match e {
        RsError::ConnRefused | RsError::TimedOut | RsError::NotSupported | RsError::AddrInUse => {
            Errno(libc::ENOTCONN)
        }
        e => e.into(),
    }
}

pub(crate) fn recv_flags(flags: c_int) -> RecvFlags {
    RecvFlags {
        dontwait: flags & libc::MSG_DONTWAIT != 0,
        peek: flags & libc::MSG_PEEK != 0,
        waitall: flags & libc::MSG_WAITALL != 0,
    }
}

pub(crate) fn send_flags(flags: c_int) -> SendFlagsRs {
    SendFlagsRs {
        dontwait: flags & libc::MSG_DONTWAIT != 0,
    }
}

impl<P: Provider> Engine<P> {
    /// Sends `data`; on a datagram socket, to `to` (or the connected peer).
    ///
    /// # Errors
    /// `EWOULDBLOCK`, `ECONNRESET` (never `EPIPE`), `ENOTCONN`, `EISCONN` (an address on a
    /// stream, as librdmacm; ignored instead with `DP_RSOCKET_SENDTO=linux`, as Linux TCP),
    /// `EDESTADDRREQ` (unconnected datagram socket without an
    /// address), `EMSGSIZE`.
    pub(crate) fn send(
        &self,
        fd: c_int,
        data: &[u8],
        flags: c_int,
        to: Option<SocketAddr>,
    ) -> Result<usize, Errno> {
        let h = self.handle(fd)?;
        let f = send_flags(flags);
        match &h.kind {
            Kind::Stream(_) if to.is_some() && self.sendto == SendtoMode::Librdmacm => {
                Err(Errno(libc::EISCONN))
            }
            Kind::Stream(id) => self.ctx.send(*id, data, f).map_err(data_err),
            Kind::Dgram(d) => {
                let mut d = Handle::dgram(d);
                let r = match to {
                    Some(a) => d.send_to_with(data, a, f),
                    None => d.send_with(data, f),
                };
                match r {
                    Err(RsError::NotConnected) => Err(Errno(libc::EDESTADDRREQ)),
                    r => Ok(r?),
                }
            }
        }
    }

    /// Receives into `buf`; `want_from` asks for the sender's address.
    ///
    /// # Errors
    /// `EWOULDBLOCK`, `ENOTCONN`, `ECONNRESET` after a transport error.
    pub(crate) fn recv(
        &self,
        fd: c_int,
        buf: &mut [u8],
        flags: c_int,
        want_from: bool,
    ) -> Result<Received, Errno> {
        let h = self.handle(fd)?;
        let f = recv_flags(flags);
        match &h.kind {
            Kind::Stream(id) => {
                let len = self.ctx.recv(*id, buf, f).map_err(data_err)?;
                let from = if want_from {
                    self.ctx.peer_addr(*id).ok()
                } else {
                    None
                };
                Ok(Received {
                    len,
                    from,
                    truncated: false,
                    family: h.family,
                })
            }
            Kind::Dgram(d) => {
                let m = Handle::dgram(d).recv_msg(buf, f)?;
                Ok(Received {
                    len: m.len,
                    from: Some(m.src),
                    truncated: m.truncated(),
                    family: h.family,
                })
            }
        }
    }

    /// Gathers `bufs` into one send. A stream sends them in order, stopping at the first
    /// short send; a datagram socket sends them as one datagram.
    ///
    /// # Errors
    /// As [`send`](Self::send); errors after some bytes were sent return the count instead.
    pub(crate) fn send_vectored(
        &self,
        fd: c_int,
        bufs: &[&[u8]],
        flags: c_int,
        to: Option<SocketAddr>,
    ) -> Result<usize, Errno> {
        let h = self.handle(fd)?;
        if let Kind::Dgram(_) = h.kind {
            // One datagram: gather into a slot-sized buffer (larger ones fail anyway).
            let total: usize = bufs.iter().map(|b| b.len()).sum();
            let mut one = [0u8; 4096];
            if total > one.len() {
                return Err(Errno(libc::EMSGSIZE));
            }
            let mut at = 0;
            for b in bufs {
                one[at..at + b.len()].copy_from_slice(b);
                at += b.len();
            }
            return self.send(fd, &one[..total], flags, to);
        }
        let mut done = 0usize;
        for b in bufs.iter().filter(|b| !b.is_empty()) {
            match self.send(fd, b, flags, to) {
                Ok(n) => {
                    done += n;
                    if n < b.len() {
                        break;
                    }
                }
                Err(_) if done > 0 => break,
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    /// Scatters one receive over `bufs`, filling each in turn. The first receive follows
    /// `flags`; later ones only take what is already there (unless `MSG_WAITALL`), so the
    /// call blocks at most as a single receive would.
    ///
    /// # Errors
    /// As [`recv`](Self::recv); errors after some bytes arrived return the count instead.
    pub(crate) fn recv_vectored(
        &self,
        fd: c_int,
        bufs: &mut [&mut [u8]],
        flags: c_int,
        want_from: bool,
    ) -> Result<Received, Errno> {
        let h = self.handle(fd)?;
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let single = bufs.iter().filter(|b| !b.is_empty()).count() <= 1;
        if single || matches!(h.kind, Kind::Dgram(_)) || flags & libc::MSG_PEEK != 0 {
            // One receive: a datagram is one message; a peek must not consume.
            if let Some(b) = bufs.iter_mut().find(|b| !b.is_empty()).filter(|_| single) {
                return self.recv(fd, b, flags, want_from);
            }
            let mut tmp = vec![0u8; total];
            let r = self.recv(fd, &mut tmp, flags, want_from)?;
            let mut at = 0;
            for b in bufs.iter_mut() {
                let n = b.len().min(r.len - at);
                b[..n].copy_from_slice(&tmp[at..at + n]);
                at += n;
            }
            return Ok(r);
        }
        let mut out = Received {
            len: 0,
            from: None,
            truncated: false,
            family: h.family,
        };
        let mut f = flags;
        for b in bufs.iter_mut().filter(|b| !b.is_empty()) {
            match self.recv(fd, b, f, want_from && out.from.is_none()) {
                Ok(r) => {
                    out.len += r.len;
                    out.from = out.from.or(r.from);
                    if r.len < b.len() {
                        break;
                    }
                }
                Err(_) if out.len > 0 => break,
                Err(e) => return Err(e),
            }
            if flags & libc::MSG_WAITALL == 0 {
                f = flags | libc::MSG_DONTWAIT;
            }
        }
        Ok(out)
    }
}
