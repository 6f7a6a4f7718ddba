//! Pinned run-to-completion lcores with pollers, timers, inter-lcore messages and busy/idle
//! accounting, in the manner of DPDK EAL lcores and SPDK reactors and pollers.
//!
//! # Model
//!
//! **Lcores and roles.** [`Lcores::init`] takes a DPDK-style core list ([`CoreList`]:
//! `0-3,6`, `all`), checks every CPU against the process's allowed set (read once with
//! `sched_getaffinity` before anything is pinned), and creates one lcore per CPU. The first
//! CPU, or [`LcoresConfig::main_cpu`], is the **main** lcore: it runs on the launching thread via
//! [`Lcores::run_on_main`]. The others are **workers**: [`Lcores::launch`] starts a closure on a
//! new thread pinned to exactly its CPU (with `core_affinity`) and returns an [`LcoreHandle`]
//! whose [`join`](LcoreHandle::join) yields the closure's result. A panic on any lcore is caught,
//! reported as [`LcoreError::Panicked`] naming the lcore, and raises the shared stop signal so
//! the rest shut down.
//!
//! **The loop.** A [`PollLoop`] is built on its lcore from a [`LoopBuilder`] and run with
//! [`Lcore::run`]. Each iteration drains the inbox, calls every *active* poller, calls *timed*
//! pollers whose period has elapsed and, every [`LoopConfig::timer_interval`] iterations, fires
//! due timers. A poller is a [`Poller`] (or closure) returning how much work it did; 0 is
//! idle. An iteration is busy if any step did work. Pollers get a [`Ctx`] to read the time, send
//! messages, arm timers and stop.
//!
//! **Time.** The loop reads time only through a [`Clock`](time::Clock): a TSC clock calibrated
//! once against `CLOCK_MONOTONIC` in production ([`RealClock`](time::RealClock), falling back
//! to `CLOCK_MONOTONIC` through the vDSO when the TSC is not invariant), or
//! [`ManualClock`](time::ManualClock) in tests. Everything else takes a
//! [`time::Instant`] (nanoseconds, saturating) as an argument.
//!
//! **Timers** are data, not closures: an id, a deadline and a `u64` token in a per-lcore
//! [`Timers`] heap with O(1) cancel and no allocation after construction. The loop's timer
//! handler receives a [`TimerEvent`] per expiry.
//!
//! **Inbox.** Every lcore has an MPSC inbox ring (from `mempool::ring`) of a user message type
//! `M: Copy + Send + 'static`, copied by value: no allocation per message. The loop drains up to
//! [`LoopConfig::msg_batch`] messages per iteration. Sending never blocks; a full inbox returns
//! [`SendError::Full`] with the message. Non-lcore threads send through a [`Sender`].
//!
//! **Poll modes.** [`PollMode::Busy`] spins with `spin_loop` when idle (dedicated cores).
//! [`PollMode::Hybrid`] spins for `spin` of idleness, then sleeps for `sleep` (or yields), then
//! spins again; any work resets it. Use it when polling threads outnumber cores.
//!
//! # Stopping
//!
//! Two phases, as DPDK applications and SPDK's shutdown do it:
//!
//! 1. **Signal**: a [`StopToken`] shared by all lcores is raised by [`Lcores::stop`],
//!    [`Ctx::stop_all`], a panic on any lcore, or SIGINT/SIGTERM via [`install_stop_signals`]
//!    (the handler does one atomic store).
//! 2. **Drain**: each loop notices at the end of an iteration and starts draining:
//!    [`Ctx::is_stopping`] turns true so pollers stop creating work, and the loop keeps polling
//!    until [`DrainPolicy::idle_iterations`] consecutive idle iterations or
//!    [`DrainPolicy::timeout`], then returns a [`LoopReport`]; the closure returns and the
//!    thread is joined. Messages still in an inbox afterwards can be taken with
//!    [`Lcores::drain_inbox`].
//!
//! # Statistics
//!
//! Each loop publishes, per lcore, iterations, busy iterations, busy and idle nanoseconds and
//! sleep time, and per poller (plus the built-in inbox and timer steps) calls, busy calls, work
//! and time. Counters are single-writer atomics updated with `Relaxed` load+store by the lcore
//! (see [`stats`] for why that suffices); [`StatsHandle::snapshot`] reads them from any thread,
//! and [`Lcores::snapshot`] finds the handle of an lcore's current loop. Pollers are named at
//! registration, and the snapshot lists them in registration order.
//!
//! # Invariants
//!
//! - A worker thread is pinned to exactly one CPU before its closure runs; `run_on_main` pins
//!   the calling thread for the duration and restores its affinity afterwards.
//! - An lcore runs at most one launch at a time; its inbox has exactly one consumer, the lcore.
//! - With a TSC clock in busy mode, a steady-state iteration makes no syscall: no allocation,
//!   no locks, no clock syscalls. `tests/seccomp.rs` proves it with a seccomp trap filter
//!   ([`seccomp`]). Exceptions by design: hybrid-mode sleeps, and a contended multi-producer
//!   send, which may `sched_yield` while waiting for a preempted producer (see [`port`]).
//! - `busy_nanos + idle_nanos` of a run equals the clock time from its first to its last clock
//!   read; per-poller times plus the time between steps add up to it.
//! - The loop never blocks on its own; a poller that blocks stalls its lcore.
//!
//! # Example
//!
//! ```no_run
//! use lcore::{CoreList, Lcores, LcoresConfig, LoopBuilder, LoopConfig, PollMode};
//! use lcore::time::RealClock;
//!
//! let lcores = Lcores::<u64>::init(&LcoresConfig::new(CoreList::parse("0-1")?))?;
//! let main = lcores.main_lcore();
//! let worker = lcores.workers().next().unwrap();
//! let handle = lcores.launch(worker, move |lc| {
//!     let cfg = LoopConfig { mode: PollMode::hybrid_default(), ..LoopConfig::default() };
//!     let mut b = LoopBuilder::new(cfg, RealClock::new());
//!     let mut n = 0u64;
//!     b.poller("produce", move |ctx| {
//!         if ctx.is_stopping() || ctx.send(main, n).is_err() { return 0; }
//!         n += 1;
//!         1
//!     });
//!     let mut l = b.build().expect("valid config");
//!     lc.run(&mut l)
//! })?;
//! lcores.run_on_main(|lc| {
//!     let mut got = 0u64;
//!     while got < 1000 {
//!         if lc.port().try_recv().is_some() { got += 1 } else { std::hint::spin_loop() }
//!     }
//! })?;
//! lcores.stop();
//! let report = handle.join()?;
//! println!("worker: {} iterations, {} busy", report.iterations, report.busy_iterations);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks, clippy::unnecessary_safety_comment)]

pub mod cpuset;
mod id;
mod lcores;
pub mod perf;
pub mod poll_loop;
pub mod port;
#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
pub mod seccomp;
pub mod stats;
pub mod stop;
pub mod time;
pub mod timer;

pub use cpuset::{CoreList, CoreListError, CoreSelectError, CpuSet};
pub use id::{LcoreId, LcoreInfo, Role};
pub use lcores::{InitError, Lcore, LcoreError, LcoreHandle, Lcores, LcoresConfig, join_all};
pub use poll_loop::{
    Ctx, DrainPolicy, LoopBuilder, LoopConfig, LoopConfigError, LoopExit, LoopReport, PollLoop,
    PollMode, Poller, PollerId,
};
pub use port::{Inbox, Outbox, Port, SendError, Sender};
pub use stats::{LoopSnapshot, LoopState, PollerKind, PollerSnapshot, StatsHandle};
pub use stop::{SignalError, SignalGuard, StopReason, StopToken, install_stop_signals};
pub use timer::{TimerError, TimerEvent, TimerId, Timers};
