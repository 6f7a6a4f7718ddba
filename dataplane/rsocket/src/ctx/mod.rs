//! The rsocket context: sockets over one fabric device, with all progress made inside API
//! calls (or by an lcore poller calling [`RsContext::progress`]).
//!
//! A context owns the device's protection domain, one CM event channel, the buffer arena
//! and every socket made from it. Sockets are named by [`SockId`], like file descriptors;
//! [`RsStream`](super::RsStream) and [`RsListener`](super::RsListener) wrap them for Rust
//! callers, and the C library uses the ids directly. Each stream socket has its own queue
//! pair and completion queue, as in librdmacm. Data-path work (completions, credits,
//! keepalives) is done when the application calls in; connection events are processed by
//! the context's CM thread, which accepts connections in the background as librdmacm's
//! listen service thread does.
//!
//! A context is `Send + Sync` (an `Arc` of its shared state inside); for parallelism use
//! one context per thread or lcore, as DPDK applications use one queue per lcore.
//!
//! # Locking
//!
//! The data path (send, receive, progress, readiness, `riowrite`) must never wait for the
//! control plane, whose operations block for seconds: the verbs provider resolves the
//! address and route inside `connect_prepared` (up to 2 s, three tries), and the shm
//! provider, registering memory with remote rights, announces a new region to every
//! connected peer of the protection domain and waits up to 2 s per peer for it to be
//! mapped. With one lock for everything, every thread of the context (and in the drop-in
//! `librdmacm` library, which has one context per process, every thread of the program)
//! would spin behind such a call. A context therefore has two locks:
//!
//! * **L1, the control lock** (a `Mutex`: its holders may block, and waiters sleep): the
//!   CM channel, the buffer arena, and the maps from connections and listeners to
//!   sockets. Connect, accept (done by the CM thread), listen, close and the processing of
//!   every CM event hold it for their whole length. The control plane is serialized by it.
//! * **L2, the data lock** (a [`SpinLock`]: uncontended it costs one compare-and-swap and
//!   no system call): the socket table, each socket's state machine, queue pair,
//!   completion queue and buffers. The data path takes only this one.
//!
//! The order is **L1, then L2, never the reverse**: nothing takes the control lock while
//! holding the data lock. The data lock is never held across a blocking call, a system
//! call or an allocation that the data path could wait behind: control operations take it
//! only for short steps, in phases. A connect checks the socket and marks it opening under
//! L2, builds its buffers and completion queue, registers memory and sends the request
//! (resolving on verbs) with L2 released, then publishes the stream under L2; an accept
//! does the same with a new socket it publishes into the listener's backlog. Because the
//! connecting (or accepting) thread holds L1 throughout, no CM event for the new
//! connection is processed before it is published, and no close can see the socket while
//! it is opening. Resources are dropped (queue pairs, registrations) after the socket left
//! the table, with L2 released. `riomap` registers its memory with neither lock held and
//! publishes the mapping under L2 if the same connection is still there.
//!
//! CM events are consumed only by the CM thread (under L1); the data path never takes L1,
//! so a stalled control operation delays other connection events, never I/O. The device,
//! the context's protection domain and the configuration are immutable and read without a
//! lock. Each stream records the protection domain its memory and queue pair belong to,
//! so that it can become the socket's own.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use dp_fabric::sync::{SpinGuard, SpinLock};
use std::time::{Duration, Instant as StdInstant};

use lcore::time::{Clock, RealClock};

use crate::arena::{ARENA_CHUNK, Arena};
use crate::conn::{Ready, Shutdown};
use crate::error::RsError;
use crate::opts::{RsConfig, SockOpt, SockOptName, SockOpts};
use crate::wait::{Armed, Waiter};
use dp_fabric::{CmChannel, Device, FabricError, Provider};

mod control;
mod engine;
mod iomap;
mod sock;

pub use sock::{RecvFlags, SendFlagsRs, SockId};

use control::{CmThread, Control};
use engine::{Base, CLOSE_TIMEOUT, CONNECT_TIMEOUT, Data};
use sock::{Kind, Phase, Sock};

/// How long a blocking call yields between attempts, after its polling time, before it
/// sleeps on the completion queue notifier. A sleeper wakes a scheduler wake-up after
/// the peer's message (15-50 us on a VM host); with the sleep right after a 10 us
/// polling time, one late message in a ping-pong made each end sleep at every turn from
/// then on (both ends wait longer than the polling time for an answer that waits for the
/// other's wake-up): `sockperf pp --tcp` through librspreload settled at a 45 us p50
/// instead of 1 us. A yield gives the core away as a sleep does when something else
/// wants it, and returns at once when nothing does.
const YIELD_BEFORE_SLEEP: Duration = Duration::from_micros(200);

/// A context's state, shared by its handles and its CM thread: the control half behind
/// the control lock (L1), and the data half with what never changes (deref). See the
/// locking section above for what each lock guards and their order.
struct Shared<P: Provider> {
    /// The control lock (L1), taken first. Declared first so that dropping it stops (and
    /// joins) the CM thread before anything else goes.
    control: Mutex<Control<P>>,
    base: Base<P>,
}

impl<P: Provider> Shared<P> {
    /// Takes the control lock (L1). Must not be called while holding the data lock.
    fn control(&self) -> std::sync::MutexGuard<'_, Control<P>> {
        // A panic under the lock leaves the maps consistent enough to go on (each update is
        // one insert or remove), and a poisoned context would otherwise wedge every caller.
        self.control
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl<P: Provider> std::ops::Deref for Shared<P> {
    type Target = Base<P>;
    fn deref(&self) -> &Base<P> {
        &self.base
    }
}

/// A context: sockets over one fabric device.
pub struct RsContext<P: Provider> {
    inner: Arc<Shared<P>>,
    polling_time: Duration,
}

impl<P: Provider> Clone for RsContext<P> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            polling_time: self.polling_time,
        }
    }
}

impl<P: Provider> std::fmt::Debug for RsContext<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RsContext")
            .field("provider", &P::NAME)
            .finish()
    }
}

impl<P: Provider> RsContext<P> {
    /// A context on `dev` with the system defaults ([`RsConfig::from_system`]).
    ///
    /// # Errors
    /// Failing to allocate the protection domain or the CM channel.
    pub fn new(dev: P::Device) -> Result<Self, FabricError> {
        Self::with_config(dev, RsConfig::from_system())
    }

    /// A context with explicit defaults.
    ///
    /// # Errors
    /// As [`RsContext::new`].
    pub fn with_config(dev: P::Device, cfg: RsConfig) -> Result<Self, FabricError> {
        let pd = dev.alloc_pd()?;
        let cm = dev.create_cm_channel()?;
        let polling_time = cfg.polling_time;
        let event_fd = cm.event_fd();
        let ctx = Self {
            inner: Arc::new(Shared {
                control: Mutex::new(Control::new(cm, Arena::new(ARENA_CHUNK))),
                base: Base {
                    data: SpinLock::new(Data::new()),
                    dev,
                    pd,
                    cfg,
                    clock: RealClock::new(),
                },
            }),
            polling_time,
        };
        let weak = Arc::downgrade(&ctx.inner);
        let t = CmThread::spawn(event_fd, move || {
            let Some(c) = weak.upgrade() else {
                return false;
            };
            c.control().cm_events(&c);
            drop(c);
            weak.strong_count() > 0
        })
        .map_err(|e| FabricError::Io {
            op: "starting the rsocket connection-manager thread",
            source: e,
        })?;
        ctx.inner.control().cm_thread = Some(t);
        Ok(ctx)
    }

    /// The data lock (see the locking section of the module docs).
    fn data(&self) -> SpinGuard<'_, Data<P>> {
        self.inner.data()
    }

    /// Makes progress on every socket (completions, credits, keepalive timers); returns
    /// the work done (0 when idle). Call it from an lcore poller to serve many sockets
    /// from one loop. Connection events are processed by the context's CM thread.
    pub fn progress(&self) -> usize {
        self.data().progress(&self.inner.clock)
    }

    /// Runs `f` with the context's device and protection domain (for socket kinds that
    /// manage their own queue pairs, such as datagram sockets). Takes no lock: `f` may
    /// block (resolving a route, say) without stalling the context's sockets.
    pub(crate) fn with_device<R>(&self, f: impl FnOnce(&P::Device, &P::Pd, &RsConfig) -> R) -> R {
        f(&self.inner.dev, &self.inner.pd, &self.inner.cfg)
    }

    /// The busy-poll time of blocking calls.
    pub fn polling_time(&self) -> Duration {
        self.polling_time
    }

    /// Sets the busy-poll time of blocking calls (latency-sensitive callers raise it).
    pub fn set_polling_time(&mut self, d: Duration) {
        self.polling_time = d;
    }

    /// Creates a stream socket (`rsocket(AF_INET, SOCK_STREAM, 0)`).
    pub fn socket(&self, nonblocking: bool) -> SockId {
        let s = Sock::new(SockOpts::stream(&self.inner.cfg), nonblocking);
        self.data().alloc_id(s)
    }

    /// Binds a socket (`rbind`).
    ///
    /// # Errors
    /// `EBADF` for an unknown socket, `EINVAL` once it is in use.
    pub fn bind(&self, id: SockId, addr: SocketAddr) -> Result<(), RsError> {
        let mut c = self.data();
        let s = c.sock(id)?;
        if !matches!(s.kind, Kind::Fresh) {
            return Err(RsError::Invalid);
        }
        s.bound = Some(addr);
        Ok(())
    }

    /// Listens (`rlisten`); idempotent on a listening socket.
    ///
    /// # Errors
    /// `EINVAL` without a bound address; `EADDRINUSE`.
    pub fn listen(&self, id: SockId, backlog: u32) -> Result<(), RsError> {
        self.inner.control().listen(&self.inner, id, backlog)
    }

    /// Connects (`rconnect`). A non-blocking socket returns [`RsError::InProgress`] and
    /// becomes writable (or reports its error through [`take_error`](Self::take_error)).
    ///
    /// Even a non-blocking connect waits for what the provider does synchronously (address
    /// and route resolution on verbs, memory registration), but only other control
    /// operations of the context wait with it: its sockets' I/O goes on.
    ///
    /// # Errors
    /// `ECONNREFUSED`, `EISCONN`, `EINPROGRESS`, `ETIMEDOUT`, ...
    pub fn connect(&self, id: SockId, addr: SocketAddr) -> Result<(), RsError> {
        let nonblocking = self.inner.control().connect(&self.inner, id, addr)?;
        if nonblocking {
            self.data().progress_one(id);
            return if self.is_established(id)? {
                Ok(())
            } else {
                Err(RsError::InProgress)
            };
        }
        let deadline = StdInstant::now() + CONNECT_TIMEOUT;
        let mut w = Waiter::new(self.polling_time);
        loop {
            self.data().progress_one(id);
            match self.is_established(id) {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => {
                    self.data().sock(id)?.so_error = None;
                    return Err(e);
                }
            }
            if StdInstant::now() > deadline {
                return Err(RsError::TimedOut);
            }
            w.wait();
        }
    }

    fn is_established(&self, id: SockId) -> Result<bool, RsError> {
        let mut c = self.data();
        match &c.sock(id)?.kind {
            Kind::Stream(st) => Ok(st.phase == Phase::Established),
            Kind::Opening => Ok(false),
            Kind::Failed(e) => Err(*e),
            _ => Err(RsError::NotConnected),
        }
    }

    /// Accepts a connection (`raccept`): hands out one the CM thread accepted in the
    /// background.
    ///
    /// # Errors
    /// `EWOULDBLOCK` on a non-blocking listener with nothing pending; `EINVAL` if not
    /// listening.
    pub fn accept(&self, id: SockId) -> Result<SockId, RsError> {
        let mut w = Waiter::new(self.polling_time);
        loop {
            let (r, nonblocking) = {
                let mut c = self.data();
                let r = c.accept(id);
                (r, c.sock(id)?.nonblocking)
            };
            match r {
                Err(RsError::WouldBlock) if !nonblocking => w.wait(),
                other => return other,
            }
        }
    }

    /// Sends (`rsend`). A blocking socket blocks until every byte is posted (not
    /// acknowledged), as librdmacm's; a non-blocking one returns what it could queue,
    /// posted or buffered in the send ring until credits return (which any later call on
    /// the context moves along; see `conn::send`).
    ///
    /// # Errors
    /// `EWOULDBLOCK` (non-blocking, nothing queued), `ECONNRESET` (closed or reset; never
    /// `EPIPE`), `ENOTCONN`.
    pub fn send(&self, id: SockId, data: &[u8], flags: SendFlagsRs) -> Result<usize, RsError> {
        if data.is_empty() {
            // Still reports a closed or unconnected socket.
            return match self.data().send(id, data) {
                Err(RsError::WouldBlock) => Ok(0),
                r => r,
            };
        }
        let mut done = 0usize;
        let mut w = Waiter::new(self.polling_time);
        let mut armed: Option<Armed> = None;
        loop {
            let (r, nonblocking, unposted) = {
                let mut c = self.data();
                let mut r = c.send(id, &data[done..]);
                if matches!(r, Err(RsError::WouldBlock)) {
                    // Completions not yet polled may have freed room (as `recv` does).
                    c.progress_one(id);
                    r = c.send(id, &data[done..]);
                }
                let nb = c.sock(id)?.nonblocking || flags.dontwait;
                let mut unposted = c.has_unposted(id);
                if r.is_err() || done + r.unwrap_or(0) < data.len() || unposted {
                    c.progress_one(id);
                    unposted = c.has_unposted(id);
                }
                // What a blocking send that is done needs to know is read under this lock
                // (the bytes are posted, not only buffered), not under a second one.
                (r, nb, unposted)
            };
            match r {
                Ok(n) => {
                    done += n;
                    if nonblocking {
                        return Ok(done);
                    }
                    if done == data.len() {
                        // Blocking: returns once the bytes are posted, not only buffered.
                        if !unposted {
                            return Ok(done);
                        }
                    } else {
                        w.reset();
                    }
                }
                Err(RsError::WouldBlock) if !nonblocking => {}
                Err(RsError::WouldBlock) if done > 0 => return Ok(done),
                Err(e) => return if done > 0 { Ok(done) } else { Err(e) },
            }
            if data.is_empty() {
                return Ok(0);
            }
            self.wait(id, &mut w, &mut armed);
        }
    }

    /// Receives (`rrecv`): `Ok(0)` at end of stream.
    ///
    /// # Errors
    /// `EWOULDBLOCK` (non-blocking, nothing queued), `ECONNRESET` after a transport error,
    /// `ENOTCONN`.
    pub fn recv(&self, id: SockId, buf: &mut [u8], flags: RecvFlags) -> Result<usize, RsError> {
        let mut done = 0usize;
        let mut w = Waiter::new(self.polling_time);
        let mut armed: Option<Armed> = None;
        loop {
            let (r, nonblocking) = self.data().recv_polled(id, &mut buf[done..], flags.peek)?;
            let nonblocking = nonblocking || flags.dontwait;
            match r {
                Ok(0) => return Ok(done),
                Ok(n) => {
                    done += n;
                    if !flags.waitall || flags.peek || done == buf.len() || nonblocking {
                        return Ok(done);
                    }
                    w.reset();
                }
                Err(RsError::WouldBlock) if !nonblocking => {}
                Err(e) => return if done > 0 { Ok(done) } else { Err(e) },
            }
            if buf.is_empty() {
                return Ok(0);
            }
            self.wait(id, &mut w, &mut armed);
        }
    }

    /// One wait of a blocking send or receive on stream `id` that found nothing to do:
    /// busy polls for the polling time ([`Waiter`]), then yields between attempts for
    /// [`YIELD_BEFORE_SLEEP`], then sleeps on the socket's completion queue notifier until
    /// the peer's next message (as librdmacm blocks on its completion channel after
    /// `polling_time`), so a waiting thread gives its core to the peer when both share
    /// one. The caller attempts once between arming and sleeping: a message that arrived
    /// before the arm is found then, one after it ends the sleep. Without a notifier (a
    /// provider that has none), the [`Waiter`] yields and naps instead.
    fn wait(&self, id: SockId, w: &mut Waiter, armed: &mut Option<Armed>) {
        if let Some(a) = armed.take() {
            a.sleep();
            return;
        }
        if w.yielded_for(YIELD_BEFORE_SLEEP) {
            // Not while sockets' buffered sends wait for credits: this thread moves them
            // along, and their credits ring their own queues, not this one.
            let n = {
                let mut c = self.data();
                if c.unposted.is_empty() {
                    c.stream(id).ok().and_then(|st| st.notify.clone())
                } else {
                    None
                }
            };
            if let Some(n) = n {
                *armed = Some(Armed::new(n));
                return;
            }
        }
        w.wait();
    }

    /// Shuts down one or both directions (`rshutdown`); waits (always blocking, as in
    /// librdmacm) until the control message and every send completed.
    ///
    /// # Errors
    /// `ENOTCONN` if not connected.
    pub fn shutdown(&self, id: SockId, how: Shutdown) -> Result<(), RsError> {
        {
            let mut c = self.data();
            let st = c.stream(id)?;
            if st.phase != Phase::Established {
                return Err(RsError::NotConnected);
            }
            let (conn, mut io) = st.io();
            conn.shutdown(how, &mut io);
        }
        self.wait_sends(id);
        let done = {
            let mut c = self.data();
            let st = c.stream(id)?;
            st.conn.is_disconnected().then_some(st.conn_id)
        };
        if let Some(cid) = done {
            // Control lock after the data lock is released (lock order); a close meanwhile
            // only makes this a no-op.
            let _ = self.inner.control().cm.disconnect(cid);
        }
        Ok(())
    }

    /// Makes progress on `id` and says whether it still holds sent bytes buffered for want
    /// of credits (accepted by `send`, not yet written to the peer). A non-blocking program
    /// that must not block in `shutdown` waits for this to turn false first, polling.
    pub fn send_pending(&self, id: SockId) -> bool {
        let mut c = self.data();
        c.progress_one(id);
        c.has_unposted(id)
    }

    fn wait_sends(&self, id: SockId) {
        let deadline = StdInstant::now() + CLOSE_TIMEOUT;
        let mut w = Waiter::new(self.polling_time);
        loop {
            {
                let mut c = self.data();
                c.progress_one(id);
                match c.stream(id) {
                    // A peer that disconnected takes nothing more: bytes still buffered
                    // for want of its credits are lost, as TCP's are after a reset.
                    Ok(st) if !st.conn.shutdown_done() && !st.conn.is_disconnected() => {}
                    _ => return,
                }
            }
            if StdInstant::now() > deadline {
                return;
            }
            w.wait();
        }
    }

    /// Closes a socket (`rclose`): a connected stream shuts down both directions
    /// gracefully first (blocking), then disconnects and frees everything.
    pub fn close(&self, id: SockId) {
        let graceful = {
            let mut c = self.data();
            match c.stream(id) {
                Ok(st) if st.phase == Phase::Established && st.conn.is_connected() => {
                    let (conn, mut io) = st.io();
                    conn.shutdown(Shutdown::Both, &mut io);
                    true
                }
                _ => false,
            }
        };
        if graceful {
            self.wait_sends(id);
        }
        self.inner.control().close(&self.inner, id);
    }

    /// Sets `O_NONBLOCK`.
    ///
    /// # Errors
    /// `EBADF`.
    pub fn set_nonblocking(&self, id: SockId, on: bool) -> Result<(), RsError> {
        self.data().sock(id)?.nonblocking = on;
        Ok(())
    }

    /// `O_NONBLOCK`.
    ///
    /// # Errors
    /// `EBADF`.
    pub fn is_nonblocking(&self, id: SockId) -> Result<bool, RsError> {
        Ok(self.data().sock(id)?.nonblocking)
    }

    /// Readiness after one progress pass on the socket (for `poll`).
    ///
    /// # Errors
    /// `EBADF`.
    pub fn readiness(&self, id: SockId) -> Result<Ready, RsError> {
        let mut c = self.data();
        c.progress_one(id);
        c.readiness(id)
    }

    /// Readiness of many sockets under one lock, without making progress: calls
    /// `f(index, readiness)` for each id.
    pub fn readiness_batch(
        &self,
        ids: &[SockId],
        mut f: impl FnMut(usize, Result<Ready, RsError>),
    ) {
        let mut c = self.data();
        for (i, id) in ids.iter().enumerate() {
            f(i, c.readiness(*id));
        }
    }

    /// Readiness without making progress (after [`progress`](Self::progress)).
    ///
    /// # Errors
    /// `EBADF`.
    pub fn readiness_now(&self, id: SockId) -> Result<Ready, RsError> {
        self.data().readiness(id)
    }

    /// Takes the pending socket error (`SO_ERROR`).
    ///
    /// # Errors
    /// `EBADF`.
    pub fn take_error(&self, id: SockId) -> Result<Option<RsError>, RsError> {
        let mut c = self.data();
        let s = c.sock(id)?;
        if let Some(e) = s.so_error.take() {
            return Ok(Some(e));
        }
        Ok(match &mut s.kind {
            Kind::Stream(st) => st.conn.take_so_error(),
            _ => None,
        })
    }

    /// Sets an option (`rsetsockopt`).
    ///
    /// # Errors
    /// `EINVAL` as [`SockOpts::set`] says; `EBADF`.
    pub fn set_option(&self, id: SockId, opt: SockOpt) -> Result<(), RsError> {
        let now = self.inner.clock.now();
        let mut c = self.data();
        let s = c.sock(id)?;
        let opening = matches!(s.kind, Kind::Stream(_) | Kind::Opening);
        let was_keepalive = s.opts.keepalive;
        s.opts.set(opt, opening)?;
        let keepalive = s.opts.keepalive.then_some(s.opts.keepidle);
        let changed = was_keepalive != s.opts.keepalive;
        if let Kind::Stream(st) = &mut s.kind
            && st.phase == Phase::Established
            && matches!(opt, SockOpt::KeepAlive(_) | SockOpt::KeepIdle(_))
        {
            st.conn.set_keepalive(keepalive, now);
        }
        if changed {
            if keepalive.is_some() {
                c.keepalive_socks += 1;
            } else {
                c.keepalive_socks = c.keepalive_socks.saturating_sub(1);
            }
        }
        Ok(())
    }

    /// Reads an option (`rgetsockopt`).
    ///
    /// # Errors
    /// `EBADF`.
    pub fn option(&self, id: SockId, name: SockOptName) -> Result<SockOpt, RsError> {
        Ok(self.data().sock(id)?.opts.get(name))
    }

    /// Local address (`rgetsockname`).
    ///
    /// # Errors
    /// `EBADF`, `ENOTCONN` when unbound.
    pub fn local_addr(&self, id: SockId) -> Result<SocketAddr, RsError> {
        let mut c = self.data();
        let s = c.sock(id)?;
        match &s.kind {
            Kind::Stream(st) => Ok(st.local),
            Kind::Listening(l) => Ok(l.addr),
            _ => s.bound.ok_or(RsError::NotConnected),
        }
    }

    /// Peer address (`rgetpeername`).
    ///
    /// # Errors
    /// `EBADF`, `ENOTCONN`.
    pub fn peer_addr(&self, id: SockId) -> Result<SocketAddr, RsError> {
        let mut c = self.data();
        match &c.sock(id)?.kind {
            Kind::Stream(st) => Ok(st.peer),
            _ => Err(RsError::NotConnected),
        }
    }

    /// Bytes received and not yet read on a stream socket (0 for other sockets).
    ///
    /// # Errors
    /// `EBADF` for an unknown socket.
    pub fn readable_bytes(&self, id: SockId) -> Result<usize, RsError> {
        let mut c = self.data();
        Ok(match &c.sock(id)?.kind {
            Kind::Stream(st) => st.conn.readable_bytes(),
            _ => 0,
        })
    }

    /// True once a stream socket's connection is established (for `TCP_INFO`).
    ///
    /// # Errors
    /// `EBADF` for an unknown socket.
    pub fn established(&self, id: SockId) -> Result<bool, RsError> {
        let mut c = self.data();
        Ok(match &c.sock(id)?.kind {
            Kind::Stream(st) => st.phase == Phase::Established && st.conn.is_connected(),
            _ => false,
        })
    }

    /// Protocol counters of a stream socket.
    ///
    /// # Errors
    /// `ENOTCONN` if not a stream.
    pub fn conn_stats(&self, id: SockId) -> Result<super::conn::ConnStats, RsError> {
        Ok(self.data().stream(id)?.conn.stats())
    }
}
