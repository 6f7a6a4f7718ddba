//! [`BlockingNode`]: an [`RdsNode`] for ordinary threads, with blocking `send_to` and
//! `recv_from` as Linux sockets have them.
//!
//! A progress thread runs the node's loop (busy, or hybrid so that two busy sides fit two
//! cores); the node sits behind a mutex that the progress thread releases between
//! iterations. A blocking call takes the lock, makes the engine call, pushes its frames out
//! at once ([`RdsNode::flush`]) and, when the engine says the call must wait
//! ([`RdsError::Blocked`]), sleeps on a condition variable that the progress thread
//! signals whenever a socket's readiness changes. This is the control-friendly face; an
//! lcore application registers the node itself as a poller and never blocks.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use lcore::PollMode;
use lcore::time::{Clock, Instant, RealClock};

use super::core::RdsNode;
use crate::engine::{RdsSocket, Received, RecvFlags, SendFlags};
use crate::error::RdsError;

struct Shared {
    node: Mutex<RdsNode>,
    ready: Condvar,
    stop: AtomicBool,
    clock: RealClock,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, RdsNode> {
        // A panic under the lock leaves the engine as consistent as any of its calls
        // does; a poisoned node would otherwise wedge every thread.
        self.node.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One iteration; wakes waiters if a socket's readiness changed.
    fn iterate(&self, node: &mut RdsNode) -> usize {
        let now = self.clock.now();
        let work = node.poll(now);
        let mut woke = false;
        while node.engine_mut().poll_event().is_some() {
            woke = true;
        }
        if woke {
            self.ready.notify_all();
        }
        work
    }
}

/// A node driven by its own progress thread, with blocking socket calls.
pub struct BlockingNode {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl core::fmt::Debug for BlockingNode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("BlockingNode").finish_non_exhaustive()
    }
}

impl BlockingNode {
    /// Starts the progress thread (named `name`) over `node`, polling in `mode`.
    ///
    /// # Errors
    ///
    /// The thread could not be started.
    pub fn spawn(node: RdsNode, mode: PollMode, name: &str) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            node: Mutex::new(node),
            ready: Condvar::new(),
            stop: AtomicBool::new(false),
            clock: RealClock::new(),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || progress(&s, mode))?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// The current time on the node's clock.
    pub fn now(&self) -> Instant {
        self.shared.clock.now()
    }

    /// Runs `f` on the node under its lock, then pushes out what it queued. For socket
    /// setup, options, counters, and non-blocking calls.
    pub fn with<R>(&self, f: impl FnOnce(&mut RdsNode, Instant) -> R) -> R {
        let mut node = self.shared.lock();
        let now = self.now();
        let r = f(&mut node, now);
        node.flush(now);
        r
    }

    /// Calls `op` until it stops answering [`RdsError::Blocked`], sleeping on readiness
    /// changes in between, for at most `timeout` (`None`: forever).
    fn blocking<R>(
        &self,
        timeout: Option<Duration>,
        mut op: impl FnMut(&mut RdsNode, Instant) -> Result<R, RdsError>,
    ) -> Result<R, RdsError> {
        let start = self.now();
        let mut node = self.shared.lock();
        loop {
            let now = self.now();
            let r = op(&mut node, now);
            node.flush(now);
            match r {
                Err(RdsError::Blocked(_)) => {}
                r => return r,
            }
            let waited = Duration::from_nanos(now.nanos_since(start));
            let left = match timeout {
                Some(t) if waited >= t => return Err(RdsError::TimedOut),
                Some(t) => t - waited,
                None => Duration::from_millis(10),
            };
            // The bound also covers a change this thread made itself (no event then).
            let wait = left.min(Duration::from_millis(1));
            node = self
                .shared
                .ready
                .wait_timeout(node, wait)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// A blocking `sendto`: waits while the send buffer, the message store or the
    /// destination's congestion says so (`SO_SNDTIMEO` is `timeout`).
    ///
    /// # Errors
    ///
    /// The engine's errors (Linux's errnos); [`RdsError::TimedOut`] after `timeout`.
    pub fn send_to(
        &self,
        sock: RdsSocket,
        dest: SocketAddr,
        data: &[u8],
        timeout: Option<Duration>,
    ) -> Result<usize, RdsError> {
        self.blocking(timeout, |n, now| {
            n.engine_mut()
                .send_to(now, sock, Some(dest), data, SendFlags::NONE)
        })
    }

    /// A blocking `recvfrom` of the next data message (notifications are returned too:
    /// see [`Received`]).
    ///
    /// # Errors
    ///
    /// The engine's errors; [`RdsError::TimedOut`] after `timeout`.
    pub fn recv_from(
        &self,
        sock: RdsSocket,
        buf: &mut [u8],
        timeout: Option<Duration>,
    ) -> Result<Received, RdsError> {
        self.blocking(timeout, |n, now| {
            n.engine_mut().recv_from(now, sock, buf, RecvFlags::NONE)
        })
    }

    /// Stops the progress thread (also done on drop).
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        // Release: the progress thread's Acquire load sees it at its next iteration.
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for BlockingNode {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The progress thread: the node's loop, with the poll mode's idle policy.
fn progress(s: &Shared, mode: PollMode) {
    let mut idle_since: Option<Instant> = None;
    // Acquire: pairs with the Release store in `halt`.
    while !s.stop.load(Ordering::Acquire) {
        let work = {
            let mut node = s.lock();
            s.iterate(&mut node)
        };
        if work > 0 {
            idle_since = None;
            continue;
        }
        match mode {
            PollMode::Busy => core::hint::spin_loop(),
            PollMode::Hybrid { spin, sleep } => {
                let now = s.clock.now();
                let since = *idle_since.get_or_insert(now);
                if now.nanos_since(since) >= spin.as_nanos() as u64 {
                    if sleep.is_zero() {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(sleep);
                    }
                } else {
                    core::hint::spin_loop();
                }
            }
        }
    }
}
