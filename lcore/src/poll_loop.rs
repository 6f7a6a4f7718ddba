//! The run-to-completion poll loop: pollers, inbox, timers, busy/idle accounting, poll modes
//! and the two-phase stop.
//!
//! # One iteration
//!
//! ```text
//! t = end of previous iteration
//! 1. inbox     drain up to msg_batch messages, call the message handler for each    (1 clock read)
//! 2. active    call every active poller in registration order                       (1 clock read each)
//! 3. timed     call each timed poller whose next run is due (next run = call + period)
//! 4. timers    every timer_interval iterations: fire due timers through the handler
//! 5. account   busy if any step did work, else idle; elapsed = t_now - t
//! 6. stop      Running -> Draining when the stop token or stop_local is set;
//!              Draining -> return after idle_iterations idle iterations or the drain timeout
//! 7. mode      idle: busy mode spins once; hybrid mode sleeps after `spin` of idleness
//! ```
//!
//! The loop reads time only through its [`Clock`]; with the TSC clock a steady-state iteration
//! makes no syscall (hybrid-mode sleeps are syscalls by design). Every clock read closes one
//! step, so per-poller times plus loop overhead add up to the iteration time, and
//! `busy_nanos + idle_nanos` covers the whole run without gaps. Time spent between steps (the
//! loop's own bookkeeping) is attributed to the step that follows.
//!
//! ```
//! use std::time::Duration;
//! use lcore::{DrainPolicy, LoopBuilder, LoopConfig, StopToken};
//! use lcore::time::{Instant, ManualClock};
//!
//! let clock = ManualClock::new(Instant::ZERO);
//! // Return right after the iteration that sees the stop.
//! let drain = DrainPolicy { idle_iterations: 0, timeout: Duration::from_secs(1) };
//! let cfg = LoopConfig { drain, ..LoopConfig::default() };
//! let mut b = LoopBuilder::<(), _>::new(cfg, clock.clone());
//! let c = clock.clone();
//! let mut calls = 0;
//! b.poller("rx", move |ctx| {
//!     c.advance(Duration::from_micros(1));
//!     calls += 1;
//!     if calls == 10 {
//!         ctx.stop_local();
//!     }
//!     if calls % 2 == 0 { 4 } else { 0 } // work on every other call
//! });
//! let mut l = b.build()?;
//! let report = l.run_detached(&StopToken::new());
//! assert_eq!((report.iterations, report.busy_iterations), (10, 5));
//! let rx = l.snapshot().pollers[0].clone();
//! assert_eq!((rx.name.as_str(), rx.work), ("rx", 20));
//! # Ok::<(), lcore::LoopConfigError>(())
//! ```

use core::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::id::LcoreId;
use crate::port::{Outbox, Port, SendError};
use crate::stats::{LoopShared, LoopSnapshot, LoopState, PollerInfo, PollerKind, StatsHandle};
use crate::stop::StopToken;
use crate::time::{Clock, Instant, duration_to_nanos};
use crate::timer::{TimerError, TimerEvent, TimerId, Timers};

/// Largest accepted [`LoopConfig::msg_batch`].
pub const MAX_MSG_BATCH: usize = 1024;

/// What to do in an idle iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollMode {
    /// Spin (`core::hint::spin_loop`) and poll again: lowest latency, 100% of a core. The
    /// default, for dedicated cores.
    Busy,
    /// Spin while idle for up to `spin`, then sleep for `sleep` (or `yield_now` if `sleep` is
    /// zero) and spin again; any work resets the idle timer. For hosts with fewer cores than
    /// polling threads, and for tests.
    Hybrid {
        /// How long to spin idle before sleeping.
        spin: Duration,
        /// How long to sleep; zero means `sched_yield`.
        sleep: Duration,
    },
}

impl PollMode {
    /// A hybrid mode suitable for shared CI hosts: spin 50 µs, then sleep 50 µs.
    pub const fn hybrid_default() -> Self {
        Self::Hybrid {
            spin: Duration::from_micros(50),
            sleep: Duration::from_micros(50),
        }
    }
}

/// When a draining loop returns (phase two of the stop).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainPolicy {
    /// Return after this many consecutive idle iterations once draining (0: return right after
    /// the iteration that saw the stop).
    pub idle_iterations: u64,
    /// Return after draining this long even if still busy.
    pub timeout: Duration,
}

impl Default for DrainPolicy {
    fn default() -> Self {
        Self {
            idle_iterations: 1_000,
            timeout: Duration::from_secs(1),
        }
    }
}

/// Configuration of one poll loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopConfig {
    /// Name shown in statistics.
    pub name: String,
    /// Idle behaviour.
    pub mode: PollMode,
    /// Messages drained from the inbox per iteration (1..=[`MAX_MSG_BATCH`]; SPDK uses 8).
    pub msg_batch: usize,
    /// Timers are checked every this many iterations (>= 1).
    pub timer_interval: u32,
    /// Maximum number of armed timers.
    pub timer_capacity: usize,
    /// How the loop ends after the stop signal.
    pub drain: DrainPolicy,
}

impl Default for LoopConfig {
    fn default() -> Self {
        Self {
            name: "lcore".to_owned(),
            mode: PollMode::Busy,
            msg_batch: 16,
            timer_interval: 16,
            timer_capacity: 1024,
            drain: DrainPolicy::default(),
        }
    }
}

/// A loop configuration that cannot work.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoopConfigError {
    /// `msg_batch` outside `1..=MAX_MSG_BATCH`.
    #[error("msg_batch {0} is out of range; use 1..={MAX_MSG_BATCH} (SPDK uses 8)")]
    MsgBatch(usize),
    /// `timer_interval` is zero.
    #[error("timer_interval must be at least 1 iteration")]
    TimerInterval,
    /// A timed poller has a zero period.
    #[error("timed poller `{0}` has a zero period; register it as an active poller instead")]
    ZeroPeriod(String),
}

/// Identifies a registered poller within its loop (its index in
/// [`LoopSnapshot::pollers`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PollerId(pub usize);

/// A unit of work called by the poll loop.
///
/// `poll` returns how much work it did (packets, completions, messages...); 0 means idle. It
/// must not block: the loop is run-to-completion, and a blocking poller stalls everything on the
/// lcore. Closures `FnMut(&mut Ctx<'_, M>) -> usize` implement this trait.
pub trait Poller<M> {
    /// Does one round of work; returns the amount done (0 = idle).
    fn poll(&mut self, ctx: &mut Ctx<'_, M>) -> usize;
}

impl<M, F: FnMut(&mut Ctx<'_, M>) -> usize> Poller<M> for F {
    #[inline]
    fn poll(&mut self, ctx: &mut Ctx<'_, M>) -> usize {
        self(ctx)
    }
}

/// What a poller, message handler or timer handler can do while the loop runs.
pub struct Ctx<'a, M> {
    now: Instant,
    out: &'a mut Outbox<M>,
    timers: &'a mut Timers,
    stop: &'a StopToken,
    draining: bool,
    local_stop: &'a mut bool,
}

impl<M> fmt::Debug for Ctx<'_, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ctx")
            .field("now", &self.now)
            .field("draining", &self.draining)
            .finish_non_exhaustive()
    }
}

impl<M: Copy + Send + 'static> Ctx<'_, M> {
    /// The loop's clock reading just before this call (no extra clock read).
    #[inline]
    pub fn now(&self) -> Instant {
        self.now
    }

    /// The lcore running the loop (`None` for a detached loop).
    #[inline]
    pub fn lcore(&self) -> Option<LcoreId> {
        self.out.me()
    }

    /// Sends a message to `to`'s inbox without blocking.
    ///
    /// # Errors
    ///
    /// [`SendError::Full`] / [`SendError::NoSuchLcore`], handing the message back.
    #[inline]
    pub fn send(&mut self, to: LcoreId, msg: M) -> Result<(), SendError<M>> {
        self.out.send(to, msg)
    }

    /// Sends as many of `msgs` as fit; returns how many were sent.
    #[inline]
    pub fn send_burst(&mut self, to: LcoreId, msgs: &[M]) -> usize {
        self.out.send_burst(to, msgs)
    }

    /// This lcore's timers.
    #[inline]
    pub fn timers(&mut self) -> &mut Timers {
        self.timers
    }

    /// Arms a one-shot timer `after` from [`now`](Self::now).
    ///
    /// # Errors
    ///
    /// [`TimerError::Full`] if every timer slot is armed.
    #[inline]
    pub fn arm_timer(&mut self, after: Duration, token: u64) -> Result<TimerId, TimerError> {
        self.timers.arm(self.now + after, token)
    }

    /// Whether the loop is draining: stop was requested, so pollers should finish in-flight
    /// work and not start new work.
    #[inline]
    pub fn is_stopping(&self) -> bool {
        self.draining
    }

    /// Raises the shared stop signal: every loop on the same token drains and returns.
    pub fn stop_all(&self) {
        self.stop.stop();
    }

    /// Makes only this loop drain and return, at the end of the current iteration.
    pub fn stop_local(&mut self) {
        *self.local_stop = true;
    }
}

/// Why [`PollLoop::run`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoopExit {
    /// Draining reached [`DrainPolicy::idle_iterations`] consecutive idle iterations.
    Idle,
    /// Draining hit [`DrainPolicy::timeout`] while still busy.
    DrainTimeout,
}

/// Summary returned by a run. `Copy` and allocation-free, so returning it makes no syscall;
/// per-poller figures are in [`PollLoop::snapshot`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopReport {
    /// Why the loop returned.
    pub exit: LoopExit,
    /// Iterations in this run.
    pub iterations: u64,
    /// Busy iterations in this run.
    pub busy_iterations: u64,
    /// Busy time in this run, nanoseconds.
    pub busy_nanos: u64,
    /// Idle time in this run, nanoseconds.
    pub idle_nanos: u64,
    /// Messages handled in this run.
    pub messages: u64,
    /// Timer events handled in this run.
    pub timers_fired: u64,
    /// Time from the stop being seen to the return, nanoseconds.
    pub drain_nanos: u64,
}

type MsgHandler<M> = Box<dyn FnMut(&mut Ctx<'_, M>, M)>;
type TimerHandler<M> = Box<dyn FnMut(&mut Ctx<'_, M>, TimerEvent)>;

struct Active<M> {
    stat: usize,
    poller: Box<dyn Poller<M>>,
}

struct Timed<M> {
    stat: usize,
    period_ns: u64,
    next_run: Instant,
    poller: Box<dyn Poller<M>>,
}

/// Collects pollers and handlers, then [`build`](Self::build)s a [`PollLoop`].
///
/// Pollers are registered before the loop runs (SPDK registers them on the owning thread too):
/// build the loop inside the closure launched on the lcore, so pollers need not be `Send`.
pub struct LoopBuilder<M, C> {
    config: LoopConfig,
    clock: C,
    active: Vec<Active<M>>,
    timed: Vec<(Duration, Timed<M>)>,
    info: Vec<PollerInfo>,
    on_message: Option<MsgHandler<M>>,
    on_timer: Option<TimerHandler<M>>,
}

impl<M, C: fmt::Debug> fmt::Debug for LoopBuilder<M, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoopBuilder")
            .field("config", &self.config)
            .field("clock", &self.clock)
            .field("pollers", &self.info)
            .finish_non_exhaustive()
    }
}

impl<M: Copy + Send + 'static, C: Clock> LoopBuilder<M, C> {
    /// A builder with `config` reading time from `clock`.
    pub fn new(config: LoopConfig, clock: C) -> Self {
        Self {
            config,
            clock,
            active: Vec::new(),
            timed: Vec::new(),
            info: Vec::new(),
            on_message: None,
            on_timer: None,
        }
    }

    /// Registers an active poller (called every iteration) from a closure.
    pub fn poller<F>(&mut self, name: &str, f: F) -> PollerId
    where
        F: FnMut(&mut Ctx<'_, M>) -> usize + 'static,
    {
        self.register(name, f)
    }

    /// Registers an active poller.
    pub fn register<P: Poller<M> + 'static>(&mut self, name: &str, poller: P) -> PollerId {
        let stat = self.push_info(name, PollerKind::Active);
        self.active.push(Active {
            stat,
            poller: Box::new(poller),
        });
        PollerId(stat)
    }

    /// Registers a timed poller (called when `period` has passed since its last call, first
    /// one `period` after the loop starts) from a closure.
    pub fn timed_poller<F>(&mut self, name: &str, period: Duration, f: F) -> PollerId
    where
        F: FnMut(&mut Ctx<'_, M>) -> usize + 'static,
    {
        self.register_timed(name, period, f)
    }

    /// Registers a timed poller.
    pub fn register_timed<P: Poller<M> + 'static>(
        &mut self,
        name: &str,
        period: Duration,
        poller: P,
    ) -> PollerId {
        let stat = self.push_info(name, PollerKind::Timed(period));
        let t = Timed {
            stat,
            period_ns: duration_to_nanos(period),
            next_run: Instant::MAX,
            poller: Box::new(poller),
        };
        self.timed.push((period, t));
        PollerId(stat)
    }

    fn push_info(&mut self, name: &str, kind: PollerKind) -> usize {
        self.info.push(PollerInfo {
            name: name.into(),
            kind,
        });
        self.info.len() - 1
    }

    /// Sets the inbox message handler. Without one the loop does not drain its inbox (messages
    /// wait and senders eventually see [`SendError::Full`]).
    pub fn on_message<F>(&mut self, f: F) -> &mut Self
    where
        F: FnMut(&mut Ctx<'_, M>, M) + 'static,
    {
        self.on_message = Some(Box::new(f));
        self
    }

    /// Sets the timer handler, called once per expired timer. Without one, expired timers are
    /// still popped (and counted) so that periodic timers do not pile up.
    pub fn on_timer<F>(&mut self, f: F) -> &mut Self
    where
        F: FnMut(&mut Ctx<'_, M>, TimerEvent) + 'static,
    {
        self.on_timer = Some(Box::new(f));
        self
    }

    /// Validates the configuration and allocates everything the loop will use while running.
    ///
    /// # Errors
    ///
    /// [`LoopConfigError`] for a bad batch size, timer interval or zero poller period.
    pub fn build(self) -> Result<PollLoop<M, C>, LoopConfigError> {
        let c = &self.config;
        if c.msg_batch == 0 || c.msg_batch > MAX_MSG_BATCH {
            return Err(LoopConfigError::MsgBatch(c.msg_batch));
        }
        if c.timer_interval == 0 {
            return Err(LoopConfigError::TimerInterval);
        }
        let mut timed = Vec::with_capacity(self.timed.len());
        for (period, t) in self.timed {
            if period.is_zero() {
                return Err(LoopConfigError::ZeroPeriod(
                    self.info[t.stat].name.to_string(),
                ));
            }
            timed.push(t);
        }
        let shared = Arc::new(LoopShared::new(
            self.config.name.as_str().into(),
            self.info.into_boxed_slice(),
        ));
        Ok(PollLoop {
            timers: Timers::with_capacity(self.config.timer_capacity),
            msg_buf: Vec::with_capacity(self.config.msg_batch),
            config: self.config,
            clock: self.clock,
            active: self.active,
            timed,
            on_message: self.on_message,
            on_timer: self.on_timer,
            shared,
        })
    }
}

/// A built poll loop; see the [module docs](self) for one iteration.
pub struct PollLoop<M, C> {
    config: LoopConfig,
    clock: C,
    active: Vec<Active<M>>,
    timed: Vec<Timed<M>>,
    on_message: Option<MsgHandler<M>>,
    on_timer: Option<TimerHandler<M>>,
    timers: Timers,
    /// Burst buffer for the inbox. Empty until the first message arrives (`M` has no default
    /// value to fill it with), then `msg_batch` long; capacity reserved at build, so filling it
    /// does not allocate.
    msg_buf: Vec<M>,
    shared: Arc<LoopShared>,
}

impl<M, C: fmt::Debug> fmt::Debug for PollLoop<M, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PollLoop")
            .field("config", &self.config)
            .field("clock", &self.clock)
            .field("active", &self.active.len())
            .field("timed", &self.timed.len())
            .field("timers", &self.timers.len())
            .finish_non_exhaustive()
    }
}

/// Local accumulation of a run's totals for the [`LoopReport`].
#[derive(Default)]
struct RunTotals {
    iterations: u64,
    busy_iterations: u64,
    busy_nanos: u64,
    idle_nanos: u64,
    messages: u64,
    timers_fired: u64,
}

impl<M: Copy + Send + 'static, C: Clock> PollLoop<M, C> {
    /// A handle for reading this loop's statistics from any thread.
    pub fn stats(&self) -> StatsHandle {
        StatsHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Current statistics (allocates; not for the fast path).
    pub fn snapshot(&self) -> LoopSnapshot {
        self.stats().snapshot()
    }

    /// This loop's timers, e.g. to arm timers before the first run.
    pub fn timers(&mut self) -> &mut Timers {
        &mut self.timers
    }

    /// The configuration.
    pub fn config(&self) -> &LoopConfig {
        &self.config
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Runs without an inbox or peers (sends fail with [`SendError::NoSuchLcore`]) until `stop`
    /// or [`Ctx::stop_local`] and the drain policy end it.
    pub fn run_detached(&mut self, stop: &StopToken) -> LoopReport {
        self.run(&mut Port::detached(), stop)
    }

    /// Runs on `port` until `stop` (or [`Ctx::stop_local`]) and the drain policy end it. May be
    /// called again afterwards; counters keep accumulating.
    pub fn run(&mut self, port: &mut Port<M>, stop: &StopToken) -> LoopReport {
        let shared = Arc::clone(&self.shared);
        let counters = &*shared.counters;
        shared.set_state(LoopState::Running);

        let mut totals = RunTotals::default();
        let mut local_stop = false;
        let mut draining = false;
        let mut drain_start = Instant::ZERO;
        let mut idle_streak: u64 = 0;
        let mut idle_since: Option<Instant> = None;
        let mut timer_countdown = self.config.timer_interval;
        let batch = self.config.msg_batch;
        let drain = self.config.drain;
        let drain_timeout_ns = duration_to_nanos(drain.timeout);

        let mut t = self.clock.now();
        for tp in &mut self.timed {
            tp.next_run = t + Duration::from_nanos(tp.period_ns);
        }
        let mut next_timed = self
            .timed
            .iter()
            .map(|p| p.next_run)
            .min()
            .unwrap_or(Instant::MAX);

        let exit = loop {
            let iter_start = t;
            let mut work: usize = 0;

            // 1. Inbox.
            if let (Some(inbox), Some(handler)) = (port.inbox.as_mut(), self.on_message.as_mut()) {
                let n = if self.msg_buf.len() == batch {
                    inbox.dequeue_burst(&mut self.msg_buf)
                } else {
                    match inbox.dequeue() {
                        Some(first) => {
                            // Capacity was reserved at build: this resize does not allocate.
                            self.msg_buf.resize(batch, first);
                            1 + inbox.dequeue_burst(&mut self.msg_buf[1..])
                        }
                        None => 0,
                    }
                };
                let mut ctx = Ctx {
                    now: t,
                    out: &mut port.out,
                    timers: &mut self.timers,
                    stop,
                    draining,
                    local_stop: &mut local_stop,
                };
                for &msg in &self.msg_buf[..n] {
                    handler(&mut ctx, msg);
                }
                let t1 = self.clock.now();
                shared.inbox.record(n, t1.nanos_since(t));
                t = t1;
                work += n;
                totals.messages += n as u64;
            }

            // 2. Active pollers.
            for p in &mut self.active {
                let mut ctx = Ctx {
                    now: t,
                    out: &mut port.out,
                    timers: &mut self.timers,
                    stop,
                    draining,
                    local_stop: &mut local_stop,
                };
                let w = p.poller.poll(&mut ctx);
                let t1 = self.clock.now();
                shared.pollers[p.stat].record(w, t1.nanos_since(t));
                t = t1;
                work += w;
            }

            // 3. Timed pollers (one comparison unless one is due).
            if t >= next_timed {
                next_timed = Instant::MAX;
                for p in &mut self.timed {
                    if t >= p.next_run {
                        let mut ctx = Ctx {
                            now: t,
                            out: &mut port.out,
                            timers: &mut self.timers,
                            stop,
                            draining,
                            local_stop: &mut local_stop,
                        };
                        let called = t;
                        let w = p.poller.poll(&mut ctx);
                        let t1 = self.clock.now();
                        shared.pollers[p.stat].record(w, t1.nanos_since(t));
                        t = t1;
                        work += w;
                        p.next_run = called + Duration::from_nanos(p.period_ns);
                    }
                    next_timed = next_timed.min(p.next_run);
                }
            }

            // 4. Timers, every `timer_interval` iterations.
            timer_countdown -= 1;
            if timer_countdown == 0 {
                timer_countdown = self.config.timer_interval;
                let mut fired = 0usize;
                while let Some(ev) = self.timers.pop_expired(t) {
                    fired += 1;
                    if let Some(h) = self.on_timer.as_mut() {
                        let mut ctx = Ctx {
                            now: t,
                            out: &mut port.out,
                            timers: &mut self.timers,
                            stop,
                            draining,
                            local_stop: &mut local_stop,
                        };
                        h(&mut ctx, ev);
                    }
                }
                if fired > 0 {
                    let t1 = self.clock.now();
                    shared.timers.record(fired, t1.nanos_since(t));
                    t = t1;
                    work += fired;
                    totals.timers_fired += fired as u64;
                } else {
                    shared.timers.record(0, 0);
                }
            }

            // 5. Accounting.
            let elapsed = t.nanos_since(iter_start);
            counters.iterations.add(1);
            totals.iterations += 1;
            if work > 0 {
                counters.busy_iterations.add(1);
                counters.busy_nanos.add(elapsed);
                totals.busy_iterations += 1;
                totals.busy_nanos += elapsed;
            } else {
                counters.idle_nanos.add(elapsed);
                totals.idle_nanos += elapsed;
            }

            // 6. Two-phase stop.
            if !draining && (local_stop || stop.is_stopped()) {
                draining = true;
                drain_start = t;
                idle_streak = 0;
                shared.set_state(LoopState::Draining);
            }
            if draining {
                idle_streak = if work == 0 { idle_streak + 1 } else { 0 };
                if idle_streak >= drain.idle_iterations {
                    break LoopExit::Idle;
                }
                if t.nanos_since(drain_start) >= drain_timeout_ns {
                    break LoopExit::DrainTimeout;
                }
            }

            // 7. Poll mode.
            if work > 0 {
                idle_since = None;
                continue;
            }
            match self.config.mode {
                PollMode::Busy => core::hint::spin_loop(),
                PollMode::Hybrid { spin, sleep } => {
                    let since = *idle_since.get_or_insert(t);
                    if t.nanos_since(since) >= duration_to_nanos(spin) {
                        if sleep.is_zero() {
                            std::thread::yield_now();
                        } else {
                            std::thread::sleep(sleep);
                        }
                        let t1 = self.clock.now();
                        let slept = t1.nanos_since(t);
                        counters.idle_nanos.add(slept);
                        counters.sleep_nanos.add(slept);
                        counters.sleeps.add(1);
                        totals.idle_nanos += slept;
                        t = t1;
                        idle_since = Some(t);
                    } else {
                        core::hint::spin_loop();
                    }
                }
            }
        };

        shared.set_state(LoopState::Finished);
        LoopReport {
            exit,
            iterations: totals.iterations,
            busy_iterations: totals.busy_iterations,
            busy_nanos: totals.busy_nanos,
            idle_nanos: totals.idle_nanos,
            messages: totals.messages,
            timers_fired: totals.timers_fired,
            drain_nanos: t.nanos_since(drain_start),
        }
    }
}
