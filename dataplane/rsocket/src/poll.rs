//! A readiness poll set over many rsockets of one context, in the manner of `mio::Poll`.
//!
//! Registrations name a socket, a caller [`Token`] and an [`Interest`]. [`RsPoll::poll`]
//! makes progress on the whole context, then reports every registered socket that is
//! ready for what it asked, plus hang-ups and errors, which are always reported (like
//! `POLLHUP`/`POLLERR`). Readiness is level-triggered, as `rpoll` is: a socket stays
//! ready until the condition is consumed. Waiting spins for the context's polling time,
//! then yields, then sleeps briefly; there is no background thread.

use std::time::Duration;

use crate::conn::Ready;
use crate::ctx::{RsContext, SockId};
use crate::error::RsError;
use crate::stream::{RsListener, RsStream};
use crate::wait::Waiter;
use dp_fabric::Provider;

/// Identifies a registration in events (the caller's choice).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Token(pub usize);

/// What a registration waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interest {
    /// Data to read, a connection to accept, or end of stream.
    pub readable: bool,
    /// Room to send.
    pub writable: bool,
}

impl Interest {
    /// Readable.
    pub const READABLE: Self = Self {
        readable: true,
        writable: false,
    };
    /// Writable.
    pub const WRITABLE: Self = Self {
        readable: false,
        writable: true,
    };
    /// Both.
    pub const BOTH: Self = Self {
        readable: true,
        writable: true,
    };
}

/// One readiness event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// The registration's token.
    pub token: Token,
    /// What the socket is ready for.
    pub ready: Ready,
}

/// Something that names a socket of a context.
pub trait Source {
    /// The socket.
    fn sock_id(&self) -> SockId;
}

impl Source for SockId {
    fn sock_id(&self) -> SockId {
        *self
    }
}

impl<P: Provider> Source for RsStream<P> {
    fn sock_id(&self) -> SockId {
        self.id()
    }
}

impl<P: Provider> Source for RsListener<P> {
    fn sock_id(&self) -> SockId {
        self.id()
    }
}

#[derive(Clone, Copy, Debug)]
struct Reg {
    id: SockId,
    token: Token,
    interest: Interest,
}

/// A poll set.
#[derive(Debug)]
pub struct RsPoll<P: Provider> {
    ctx: RsContext<P>,
    regs: Vec<Reg>,
    ids: Vec<SockId>,
}

impl<P: Provider> RsPoll<P> {
    /// An empty set over `ctx`'s sockets.
    pub fn new(ctx: &RsContext<P>) -> Self {
        Self {
            ctx: ctx.clone(),
            regs: Vec::new(),
            ids: Vec::new(),
        }
    }

    /// Registers a socket.
    ///
    /// # Errors
    /// [`RsError::BadSocket`] if the socket does not exist; [`RsError::Invalid`] if it is
    /// registered already.
    pub fn register(
        &mut self,
        s: &impl Source,
        token: Token,
        interest: Interest,
    ) -> Result<(), RsError> {
        let id = s.sock_id();
        self.ctx.readiness_now(id)?;
        if self.regs.iter().any(|r| r.id == id) {
            return Err(RsError::Invalid);
        }
        self.regs.push(Reg {
            id,
            token,
            interest,
        });
        self.ids.push(id);
        Ok(())
    }

    /// Changes a registration.
    ///
    /// # Errors
    /// [`RsError::Invalid`] if the socket is not registered.
    pub fn reregister(
        &mut self,
        s: &impl Source,
        token: Token,
        interest: Interest,
    ) -> Result<(), RsError> {
        let id = s.sock_id();
        let r = self
            .regs
            .iter_mut()
            .find(|r| r.id == id)
            .ok_or(RsError::Invalid)?;
        r.token = token;
        r.interest = interest;
        Ok(())
    }

    /// Removes a registration.
    ///
    /// # Errors
    /// [`RsError::Invalid`] if the socket is not registered.
    pub fn deregister(&mut self, s: &impl Source) -> Result<(), RsError> {
        let id = s.sock_id();
        let i = self
            .regs
            .iter()
            .position(|r| r.id == id)
            .ok_or(RsError::Invalid)?;
        self.regs.swap_remove(i);
        self.ids.swap_remove(i);
        Ok(())
    }

    /// Registered sockets.
    pub fn len(&self) -> usize {
        self.regs.len()
    }

    /// True if nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.regs.is_empty()
    }

    /// Waits up to `timeout` (`None`: forever, zero: just check) for registered sockets to
    /// become ready; fills `events` (cleared first) and returns how many.
    ///
    /// # Errors
    /// None today; kept for closed sockets being reported in future.
    pub fn poll(
        &mut self,
        events: &mut Vec<Event>,
        timeout: Option<Duration>,
    ) -> Result<usize, RsError> {
        events.clear();
        let mut w = Waiter::new(self.ctx.polling_time());
        loop {
            self.ctx.progress();
            let regs = &self.regs;
            self.ctx.readiness_batch(&self.ids, |i, r| {
                let reg = regs[i];
                // A socket closed behind the set's back reports a hang-up.
                let ready = r.unwrap_or(Ready {
                    hup: true,
                    err: true,
                    ..Ready::default()
                });
                let want = (reg.interest.readable && ready.readable)
                    || (reg.interest.writable && ready.writable);
                if want || ready.hup || ready.err {
                    events.push(Event {
                        token: reg.token,
                        ready,
                    });
                }
            });
            if !events.is_empty() || timeout == Some(Duration::ZERO) || w.expired(timeout) {
                return Ok(events.len());
            }
            w.wait();
        }
    }
}
