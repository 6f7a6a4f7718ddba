//! `std::net`-like stream sockets over rsocket.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use mempool::memory::Region;

use crate::conn::{Ready, Shutdown};
use crate::ctx::{RecvFlags, RsContext, SendFlagsRs, SockId};
use crate::error::RsError;
use crate::opts::{SockOpt, SockOptName};
use dp_fabric::Provider;

/// A connected rsocket stream, like `std::net::TcpStream`. Closing (drop) is graceful:
/// queued data is delivered and the peer reads end of stream.
pub struct RsStream<P: Provider> {
    ctx: RsContext<P>,
    id: SockId,
}

impl<P: Provider> std::fmt::Debug for RsStream<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RsStream").field("id", &self.id).finish()
    }
}

impl<P: Provider> RsStream<P> {
    /// Moves buffered sends along and says whether any remain: bytes `write` accepted
    /// beyond the peer's credits and not yet written to it (`SIOCOUTQ`'s unsent part). A
    /// poll-driven program half-closes only once this is false, so `shutdown` need not
    /// wait for a peer that it is itself responsible for polling.
    pub fn send_pending(&self) -> bool {
        self.ctx.send_pending(self.id)
    }

    /// Connects to `addr`, blocking until established.
    ///
    /// # Errors
    /// `ConnectionRefused` if nothing listens, `TimedOut`, ...
    pub fn connect(ctx: &RsContext<P>, addr: SocketAddr) -> io::Result<Self> {
        let id = ctx.socket(false);
        let s = Self {
            ctx: ctx.clone(),
            id,
        };
        ctx.connect(id, addr)?;
        Ok(s)
    }

    /// Connects with options set first (RDMA-level options only apply before connecting).
    ///
    /// # Errors
    /// Invalid options, then as [`connect`](Self::connect).
    pub fn connect_with(
        ctx: &RsContext<P>,
        addr: SocketAddr,
        opts: &[SockOpt],
    ) -> io::Result<Self> {
        let id = ctx.socket(false);
        let s = Self {
            ctx: ctx.clone(),
            id,
        };
        for o in opts {
            ctx.set_option(id, *o)?;
        }
        ctx.connect(id, addr)?;
        Ok(s)
    }

    /// Starts a non-blocking connect: the stream becomes writable when connected; check
    /// [`take_error`](Self::take_error) then.
    ///
    /// # Errors
    /// Immediate failures (bad address, resources).
    pub fn connect_nonblocking(ctx: &RsContext<P>, addr: SocketAddr) -> io::Result<Self> {
        Self::connect_nonblocking_with(ctx, addr, &[])
    }

    /// [`connect_nonblocking`](Self::connect_nonblocking) with options set first.
    ///
    /// # Errors
    /// Invalid options, immediate failures.
    pub fn connect_nonblocking_with(
        ctx: &RsContext<P>,
        addr: SocketAddr,
        opts: &[SockOpt],
    ) -> io::Result<Self> {
        let id = ctx.socket(true);
        let s = Self {
            ctx: ctx.clone(),
            id,
        };
        for o in opts {
            ctx.set_option(id, *o)?;
        }
        match ctx.connect(id, addr) {
            Ok(()) | Err(RsError::InProgress) => Ok(s),
            Err(e) => Err(e.into()),
        }
    }

    /// Wraps an accepted socket id.
    pub(crate) fn from_id(ctx: RsContext<P>, id: SockId) -> Self {
        Self { ctx, id }
    }

    /// The socket id in its context.
    pub fn id(&self) -> SockId {
        self.id
    }

    /// The context.
    pub fn context(&self) -> &RsContext<P> {
        &self.ctx
    }

    /// Sends with flags.
    ///
    /// # Errors
    /// See [`RsContext::send`].
    pub fn send(&self, data: &[u8], flags: SendFlagsRs) -> Result<usize, RsError> {
        self.ctx.send(self.id, data, flags)
    }

    /// Receives with flags (`MSG_PEEK`, `MSG_WAITALL`, `MSG_DONTWAIT`).
    ///
    /// # Errors
    /// See [`RsContext::recv`].
    pub fn recv(&self, buf: &mut [u8], flags: RecvFlags) -> Result<usize, RsError> {
        self.ctx.recv(self.id, buf, flags)
    }

    /// Shuts down reading, writing or both.
    ///
    /// # Errors
    /// `NotConnected`.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        Ok(self.ctx.shutdown(self.id, how)?)
    }

    /// Sets non-blocking mode.
    ///
    /// # Errors
    /// Never for a live socket.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        Ok(self.ctx.set_nonblocking(self.id, on)?)
    }

    /// `SO_ERROR`: the pending error, cleared by reading.
    ///
    /// # Errors
    /// Never for a live socket.
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        Ok(self.ctx.take_error(self.id)?.map(Into::into))
    }

    /// Readiness (after one progress pass).
    ///
    /// # Errors
    /// Never for a live socket.
    pub fn readiness(&self) -> io::Result<Ready> {
        Ok(self.ctx.readiness(self.id)?)
    }

    /// Sets an option.
    ///
    /// # Errors
    /// `InvalidInput` for values or timing the option does not allow.
    pub fn set_option(&self, opt: SockOpt) -> io::Result<()> {
        Ok(self.ctx.set_option(self.id, opt)?)
    }

    /// Reads an option.
    ///
    /// # Errors
    /// Never for a live socket.
    pub fn option(&self, name: SockOptName) -> io::Result<SockOpt> {
        Ok(self.ctx.option(self.id, name)?)
    }

    /// Local address.
    ///
    /// # Errors
    /// `NotConnected`.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.ctx.local_addr(self.id)?)
    }

    /// Peer address.
    ///
    /// # Errors
    /// `NotConnected`.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.ctx.peer_addr(self.id)?)
    }

    /// Publishes a buffer for the peer's direct writes (`riomap`).
    ///
    /// # Errors
    /// See [`RsContext::iomap`].
    pub fn iomap(
        &self,
        region: &Arc<Region>,
        off: usize,
        len: usize,
        offset: Option<u64>,
    ) -> io::Result<u64> {
        Ok(self.ctx.iomap(self.id, region, off, len, offset)?)
    }

    /// Withdraws a mapping (`riounmap`).
    ///
    /// # Errors
    /// `InvalidInput` if no such mapping.
    pub fn iounmap(&self, addr: u64, len: usize) -> io::Result<()> {
        Ok(self.ctx.iounmap(self.id, addr, len)?)
    }

    /// Writes into the peer's mapping at `offset` (`riowrite`).
    ///
    /// # Errors
    /// See [`RsContext::iowrite`].
    pub fn iowrite(&self, data: &[u8], offset: u64) -> io::Result<usize> {
        Ok(self
            .ctx
            .iowrite(self.id, data, offset, SendFlagsRs::default())?)
    }
}

impl<P: Provider> io::Read for RsStream<P> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        Ok(self.ctx.recv(self.id, buf, RecvFlags::default())?)
    }
}

impl<P: Provider> io::Write for RsStream<P> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(self.ctx.send(self.id, buf, SendFlagsRs::default())?)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<P: Provider> Drop for RsStream<P> {
    fn drop(&mut self) {
        self.ctx.close(self.id);
    }
}

/// Backlog of [`RsListener`]s: Linux's `SOMAXCONN`.
pub const LISTEN_BACKLOG: u32 = 4096;

/// A listening rsocket, like `std::net::TcpListener`.
pub struct RsListener<P: Provider> {
    ctx: RsContext<P>,
    id: SockId,
}

impl<P: Provider> std::fmt::Debug for RsListener<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RsListener").field("id", &self.id).finish()
    }
}

impl<P: Provider> RsListener<P> {
    /// Binds and listens on `addr` (port 0 picks one; see [`local_addr`](Self::local_addr)).
    ///
    /// # Errors
    /// `AddrInUse`, ...
    pub fn bind(ctx: &RsContext<P>, addr: SocketAddr) -> io::Result<Self> {
        Self::bind_with(ctx, addr, &[])
    }

    /// Like [`bind`](Self::bind), setting options first (accepted sockets inherit them).
    ///
    /// # Errors
    /// As `bind`, and invalid options.
    pub fn bind_with(ctx: &RsContext<P>, addr: SocketAddr, opts: &[SockOpt]) -> io::Result<Self> {
        let id = ctx.socket(false);
        let l = Self {
            ctx: ctx.clone(),
            id,
        };
        for o in opts {
            ctx.set_option(id, *o)?;
        }
        ctx.bind(id, addr)?;
        ctx.listen(id, LISTEN_BACKLOG)?;
        Ok(l)
    }

    /// Accepts a connection (blocking unless non-blocking).
    ///
    /// # Errors
    /// `WouldBlock` in non-blocking mode with nothing pending.
    pub fn accept(&self) -> io::Result<(RsStream<P>, SocketAddr)> {
        let id = self.ctx.accept(self.id)?;
        let s = RsStream::from_id(self.ctx.clone(), id);
        let peer = self.ctx.peer_addr(id)?;
        Ok((s, peer))
    }

    /// The listening address.
    ///
    /// # Errors
    /// Never for a live listener.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.ctx.local_addr(self.id)?)
    }

    /// Sets non-blocking mode (accepted sockets inherit it).
    ///
    /// # Errors
    /// Never for a live listener.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        Ok(self.ctx.set_nonblocking(self.id, on)?)
    }

    /// The socket id.
    pub fn id(&self) -> SockId {
        self.id
    }
}

impl<P: Provider> Drop for RsListener<P> {
    fn drop(&mut self) {
        self.ctx.close(self.id);
    }
}
