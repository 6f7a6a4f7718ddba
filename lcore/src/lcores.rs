//! Lcores: pinned threads with roles, launch/join, and their messaging endpoints.
//!
//! DPDK's EAL model: [`Lcores::init`] takes a core list, reads the process's allowed CPUs, and
//! creates one lcore per CPU with an inbox each. The first CPU (or
//! [`LcoresConfig::main_cpu`]) is the **main** lcore, run on the launching thread with
//! [`Lcores::run_on_main`]; the others are **workers**, each started on its own thread pinned
//! to exactly its CPU with [`Lcores::launch`]. A launch returns a [`LcoreHandle`] whose
//! [`join`](LcoreHandle::join) returns the closure's result, or
//! [`LcoreError::Panicked`] naming the lcore if it panicked. A panic on any lcore raises the
//! shared [`StopToken`], so the other lcores' loops drain and return.
//!
//! An lcore is launched at most once at a time ([`LcoreError::Busy`] otherwise, like
//! `rte_eal_remote_launch`'s `-EBUSY`); it becomes launchable again when its closure returns.

use core::fmt;
use std::io;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use mempool::ring::{Multi, Ring, RingError, Single};

use crate::cpuset::{CoreList, CoreSelectError, CpuSet, configured_cpus};
use crate::id::{LcoreId, LcoreInfo, Role};
use crate::poll_loop::{LoopBuilder, LoopConfig, LoopConfigError, LoopReport, PollLoop};
use crate::port::{InboxProducer, Port, Sender};
use crate::stats::{LoopSnapshot, StatsHandle};
use crate::stop::StopToken;
use crate::time::{Clock, RealClock};

/// Configuration for [`Lcores::init`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LcoresConfig {
    /// The CPUs, as a DPDK `-l` core list.
    pub cores: CoreList,
    /// CPU of the main lcore (DPDK `--main-lcore`); default: the first CPU of the list.
    pub main_cpu: Option<usize>,
    /// Slots per inbox; a power of two (SPDK uses 65,536).
    pub inbox_capacity: usize,
}

impl LcoresConfig {
    /// `cores` with default main lcore and a 4096-slot inbox.
    pub fn new(cores: CoreList) -> Self {
        Self {
            cores,
            main_cpu: None,
            inbox_capacity: 4096,
        }
    }
}

/// Why [`Lcores::init`] failed.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// A CPU of the list does not exist or is not allowed.
    #[error(transparent)]
    Cores(#[from] CoreSelectError),
    /// `sched_getaffinity` failed.
    #[error("cannot read the process's CPU affinity: {0}")]
    Affinity(#[source] io::Error),
    /// `main_cpu` is not in the core list.
    #[error("main CPU {main} is not in the core list {cores}; add it to the list")]
    MainNotInList {
        /// The requested main CPU.
        main: usize,
        /// The resolved list.
        cores: Box<CpuSet>,
    },
    /// An inbox ring could not be created.
    #[error("cannot create the inbox of {lcore}: {source}")]
    Inbox {
        /// The lcore.
        lcore: LcoreId,
        /// The ring error (e.g. capacity not a power of two).
        #[source]
        source: RingError,
    },
}

/// Why an lcore could not be launched, or how it ended.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum LcoreError {
    /// The closure panicked; the shared stop signal was raised.
    #[error("{lcore} (cpu {cpu}) panicked: {message}; the other lcores were told to stop")]
    Panicked {
        /// The lcore.
        lcore: LcoreId,
        /// Its CPU.
        cpu: usize,
        /// The panic message.
        message: String,
    },
    /// The lcore is already running something.
    #[error("{lcore} is busy; join its current launch before launching again")]
    Busy {
        /// The lcore.
        lcore: LcoreId,
    },
    /// [`Lcores::launch`] was asked to start the main lcore.
    #[error("{lcore} is the main lcore; run it on the launching thread with run_on_main")]
    NotAWorker {
        /// The lcore.
        lcore: LcoreId,
    },
    /// No lcore has this id.
    #[error("{lcore} does not exist (there are {count} lcores)")]
    NoSuchLcore {
        /// The id asked for.
        lcore: LcoreId,
        /// Number of lcores.
        count: usize,
    },
    /// Pinning the thread failed.
    #[error("cannot pin {lcore} to cpu {cpu}: {source}")]
    Pin {
        /// The lcore.
        lcore: LcoreId,
        /// Its CPU.
        cpu: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The thread could not be spawned.
    #[error("cannot spawn the thread of {lcore}: {source}")]
    Spawn {
        /// The lcore.
        lcore: LcoreId,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// Shared per-lcore state: the environment and busy flag, and the stats of its loop.
struct Slot<M> {
    state: Mutex<SlotState<M>>,
    stats: Arc<Mutex<Option<StatsHandle>>>,
}

/// `busy` is set from launch until the closure has returned and `env` is back. While busy,
/// `env` may still be present (between launch and the thread taking it).
struct SlotState<M> {
    env: Option<Lcore<M>>,
    busy: bool,
}

impl<M> Slot<M> {
    /// Marks the slot busy, or fails if it already is.
    fn claim(&self, id: LcoreId) -> Result<(), LcoreError> {
        let mut st = lock(&self.state);
        if st.busy || st.env.is_none() {
            return Err(LcoreError::Busy { lcore: id });
        }
        st.busy = true;
        Ok(())
    }

    /// Takes the environment of a claimed slot.
    fn take(&self) -> Option<Lcore<M>> {
        lock(&self.state).env.take()
    }

    /// Puts the environment back (if given) and clears the busy flag.
    fn release(&self, env: Option<Lcore<M>>) {
        let mut st = lock(&self.state);
        if env.is_some() {
            st.env = env;
        }
        st.busy = false;
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Poisoning would mean a panic while holding one of these short control-path locks; the
    // data (an Option) is still consistent, so carry on.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What a launched closure gets: identity, messaging endpoint and stop token of its lcore.
pub struct Lcore<M> {
    info: LcoreInfo,
    port: Port<M>,
    stop: StopToken,
    stats: Arc<Mutex<Option<StatsHandle>>>,
}

impl<M> fmt::Debug for Lcore<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lcore")
            .field("info", &self.info)
            .field("port", &self.port)
            .finish()
    }
}

impl<M: Copy + Send + 'static> Lcore<M> {
    /// Its id.
    pub fn id(&self) -> LcoreId {
        self.info.id
    }

    /// Its CPU.
    pub fn cpu(&self) -> usize {
        self.info.cpu
    }

    /// Its role.
    pub fn role(&self) -> Role {
        self.info.role
    }

    /// Id, CPU and role.
    pub fn info(&self) -> LcoreInfo {
        self.info
    }

    /// The shared stop token.
    pub fn stop_token(&self) -> &StopToken {
        &self.stop
    }

    /// The messaging endpoint (inbox and producers), for closures that poll by hand.
    pub fn port(&mut self) -> &mut Port<M> {
        &mut self.port
    }

    /// Runs `poll_loop` on this lcore's endpoint and the shared stop token, after publishing
    /// its statistics handle to [`Lcores::stats`].
    pub fn run<C: Clock>(&mut self, poll_loop: &mut PollLoop<M, C>) -> LoopReport {
        *lock(&self.stats) = Some(poll_loop.stats());
        poll_loop.run(&mut self.port, &self.stop)
    }
}

/// A launched worker; [`join`](Self::join) it for the result.
#[derive(Debug)]
pub struct LcoreHandle<R> {
    info: LcoreInfo,
    thread: JoinHandle<Result<R, String>>,
}

impl<R> LcoreHandle<R> {
    /// The lcore.
    pub fn info(&self) -> LcoreInfo {
        self.info
    }

    /// Whether the closure has returned (a non-blocking check, for hang guards).
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Waits for the closure and returns its result.
    ///
    /// # Errors
    ///
    /// [`LcoreError::Panicked`] naming the lcore if it panicked.
    pub fn join(self) -> Result<R, LcoreError> {
        let info = self.info;
        let panicked = |message| LcoreError::Panicked {
            lcore: info.id,
            cpu: info.cpu,
            message,
        };
        match self.thread.join() {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(message)) => Err(panicked(message)),
            Err(payload) => Err(panicked(panic_message(payload.as_ref()))),
        }
    }
}

/// Joins every handle (so none is left running) and returns the results, or the first error.
///
/// # Errors
///
/// The first [`LcoreError`] in handle order.
pub fn join_all<R>(handles: Vec<LcoreHandle<R>>) -> Result<Vec<R>, LcoreError> {
    let results: Vec<_> = handles.into_iter().map(LcoreHandle::join).collect();
    results.into_iter().collect()
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

/// Pins the calling thread to exactly `cpu` with `core_affinity` and checks the result.
fn pin_current(cpu: usize) -> io::Result<()> {
    // Build the CoreId from the real CPU number: `core_affinity::get_core_ids()` reflects the
    // calling thread's affinity and is not an index space we can rely on.
    if !core_affinity::set_for_current(core_affinity::CoreId { id: cpu }) {
        return Err(io::Error::last_os_error());
    }
    let now = CpuSet::current_thread_affinity()?;
    if now.len() != 1 || !now.contains(cpu) {
        return Err(io::Error::other(format!(
            "affinity is {now} after pinning to {cpu}"
        )));
    }
    Ok(())
}

/// The lcores of one process.
///
/// DPDK's EAL model: [`Lcores::init`] takes a core list, reads the process's allowed CPUs, and
/// creates one lcore per CPU with an inbox each. The first CPU (or
/// [`LcoresConfig::main_cpu`]) is the **main** lcore, run on the launching thread with
/// [`Lcores::run_on_main`]; the others are **workers**, each started on its own thread pinned
/// to exactly its CPU with [`Lcores::launch`]. A launch returns a [`LcoreHandle`] whose
/// [`join`](LcoreHandle::join) returns the closure's result, or [`LcoreError::Panicked`] naming
/// the lcore if it panicked. A panic on any lcore raises the shared [`StopToken`], so the other
/// lcores' loops drain and return.
///
/// An lcore runs at most one launch at a time ([`LcoreError::Busy`] otherwise, like
/// `rte_eal_remote_launch`'s `-EBUSY`); it becomes launchable again when its closure returns.
/// Dropping `Lcores` neither stops nor joins running lcores: raise the stop and join the
/// handles first.
///
/// `Lcores` is `Sync`: monitoring threads may share it to read statistics, raise the stop
/// signal or create senders while lcores run.
pub struct Lcores<M> {
    infos: Box<[LcoreInfo]>,
    slots: Box<[Arc<Slot<M>>]>,
    /// One producer per inbox, cloned into [`Sender`]s.
    producers: Mutex<Box<[InboxProducer<M>]>>,
    stop: StopToken,
    allowed: CpuSet,
    main: LcoreId,
}

impl<M> fmt::Debug for Lcores<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lcores")
            .field("lcores", &self.infos)
            .field("allowed", &self.allowed)
            .field("stop", &self.stop)
            .finish_non_exhaustive()
    }
}

impl<M: Copy + Send + 'static> Lcores<M> {
    /// Resolves the core list against the process's affinity (read now, before anything is
    /// pinned), assigns roles and creates the inboxes.
    ///
    /// # Errors
    ///
    /// [`InitError`]: a CPU that does not exist or is not allowed (naming it and the allowed
    /// set), a main CPU outside the list, or an inbox capacity that is not a power of two.
    pub fn init(config: &LcoresConfig) -> Result<Self, InitError> {
        let allowed = CpuSet::process_affinity().map_err(InitError::Affinity)?;
        let cpus = config.cores.resolve(&allowed, configured_cpus())?;
        let main_cpu = config.main_cpu.unwrap_or(cpus[0]);
        let Some(main_pos) = cpus.iter().position(|&c| c == main_cpu) else {
            return Err(InitError::MainNotInList {
                main: main_cpu,
                cores: Box::new(cpus.iter().copied().collect()),
            });
        };
        let infos: Box<[LcoreInfo]> = cpus
            .iter()
            .enumerate()
            .map(|(i, &cpu)| LcoreInfo {
                // `cpus` has at most MAX_CPUS (1024) distinct entries, so `i` fits in u16.
                id: LcoreId::new(i as u16),
                cpu,
                role: if i == main_pos {
                    Role::Main
                } else {
                    Role::Worker
                },
            })
            .collect();
        let mut producers = Vec::with_capacity(infos.len());
        let mut consumers = Vec::with_capacity(infos.len());
        for info in infos.iter() {
            let (p, c) = Ring::<M>::with_capacity::<Multi, Single>(config.inbox_capacity).map_err(
                |source| InitError::Inbox {
                    lcore: info.id,
                    source,
                },
            )?;
            producers.push(p);
            consumers.push(c);
        }
        let stop = StopToken::new();
        let slots = infos
            .iter()
            .zip(consumers)
            .map(|(info, inbox)| {
                let stats = Arc::new(Mutex::new(None));
                let peers: Box<[_]> = producers.iter().cloned().collect();
                let env = Lcore {
                    info: *info,
                    port: Port::new(info.id, inbox, peers),
                    stop: stop.clone(),
                    stats: Arc::clone(&stats),
                };
                Arc::new(Slot {
                    state: Mutex::new(SlotState {
                        env: Some(env),
                        busy: false,
                    }),
                    stats,
                })
            })
            .collect();
        Ok(Self {
            infos,
            slots,
            producers: Mutex::new(producers.into_boxed_slice()),
            stop,
            allowed,
            main: LcoreId::new(main_pos as u16),
        })
    }

    /// All lcores in core-list order.
    pub fn lcores(&self) -> &[LcoreInfo] {
        &self.infos
    }

    /// Number of lcores.
    pub fn len(&self) -> usize {
        self.infos.len()
    }

    /// Always false: `init` rejects empty lists.
    pub fn is_empty(&self) -> bool {
        self.infos.is_empty()
    }

    /// The main lcore.
    pub fn main_lcore(&self) -> LcoreId {
        self.main
    }

    /// The worker lcores in core-list order (DPDK's `RTE_LCORE_FOREACH_WORKER`).
    pub fn workers(&self) -> impl Iterator<Item = LcoreId> + '_ {
        self.infos
            .iter()
            .filter(|i| i.role == Role::Worker)
            .map(|i| i.id)
    }

    /// Description of `id`.
    ///
    /// # Errors
    ///
    /// [`LcoreError::NoSuchLcore`].
    pub fn info(&self, id: LcoreId) -> Result<LcoreInfo, LcoreError> {
        self.infos
            .get(usize::from(id.index()))
            .copied()
            .ok_or(LcoreError::NoSuchLcore {
                lcore: id,
                count: self.infos.len(),
            })
    }

    /// The lcore pinned to `cpu`, if any.
    pub fn by_cpu(&self, cpu: usize) -> Option<LcoreId> {
        self.infos.iter().find(|i| i.cpu == cpu).map(|i| i.id)
    }

    /// The CPUs the process was allowed to use at `init`.
    pub fn allowed_cpus(&self) -> &CpuSet {
        &self.allowed
    }

    /// The shared stop token.
    pub fn stop_token(&self) -> &StopToken {
        &self.stop
    }

    /// Raises the shared stop signal (phase one of the stop).
    pub fn stop(&self) {
        self.stop.stop();
    }

    /// A sender into `id`'s inbox, for any thread.
    ///
    /// # Errors
    ///
    /// [`LcoreError::NoSuchLcore`].
    pub fn sender(&self, id: LcoreId) -> Result<Sender<M>, LcoreError> {
        self.info(id)?;
        Ok(Sender::new(
            id,
            lock(&self.producers)[usize::from(id.index())].clone(),
        ))
    }

    /// The statistics handle of the loop `id` ran most recently, once it has started one with
    /// [`Lcore::run`].
    pub fn stats(&self, id: LcoreId) -> Option<StatsHandle> {
        lock(&self.slots.get(usize::from(id.index()))?.stats).clone()
    }

    /// A snapshot of [`stats`](Self::stats).
    pub fn snapshot(&self, id: LcoreId) -> Option<LoopSnapshot> {
        self.stats(id).map(|s| s.snapshot())
    }

    /// Takes the messages left in `id`'s inbox while it is not running (e.g. after a drain
    /// timeout), passing each to `f`; returns how many.
    ///
    /// # Errors
    ///
    /// [`LcoreError::Busy`] while the lcore runs, [`LcoreError::NoSuchLcore`].
    pub fn drain_inbox(&self, id: LcoreId, mut f: impl FnMut(M)) -> Result<usize, LcoreError> {
        self.info(id)?;
        let mut st = lock(&self.slots[usize::from(id.index())].state);
        let busy = st.busy;
        let (Some(env), false) = (&mut st.env, busy) else {
            return Err(LcoreError::Busy { lcore: id });
        };
        let mut n = 0;
        while let Some(m) = env.port.try_recv() {
            f(m);
            n += 1;
        }
        Ok(n)
    }

    /// Starts `f` on worker `id`'s own thread, pinned to its CPU, and returns once the thread is
    /// pinned (before `f` necessarily runs), like `rte_eal_remote_launch`.
    ///
    /// # Errors
    ///
    /// [`LcoreError::NotAWorker`] for the main lcore, [`LcoreError::Busy`] if it is running,
    /// [`LcoreError::Pin`] / [`LcoreError::Spawn`] if the thread could not be set up.
    pub fn launch<R, F>(&self, id: LcoreId, f: F) -> Result<LcoreHandle<R>, LcoreError>
    where
        F: FnOnce(&mut Lcore<M>) -> R + Send + 'static,
        R: Send + 'static,
    {
        let info = self.info(id)?;
        if info.role == Role::Main {
            return Err(LcoreError::NotAWorker { lcore: id });
        }
        let slot = Arc::clone(&self.slots[usize::from(id.index())]);
        slot.claim(id)?;
        let thread_slot = Arc::clone(&slot);
        let (pinned_tx, pinned_rx) = mpsc::sync_channel::<io::Result<()>>(1);
        let spawned = std::thread::Builder::new()
            .name(format!("lcore-{}", id.index()))
            .spawn(move || -> Result<R, String> {
                let slot = thread_slot;
                let pinned = pin_current(info.cpu);
                let failed = pinned.is_err();
                if failed {
                    slot.release(None);
                }
                let _ = pinned_tx.send(pinned);
                if failed {
                    return Err("not started: pinning failed".to_owned());
                }
                let Some(mut env) = slot.take() else {
                    slot.release(None);
                    return Err("lcore environment missing".to_owned());
                };
                let result = catch_unwind(AssertUnwindSafe(|| f(&mut env)));
                if result.is_err() {
                    env.stop.stop_for_panic(info.id);
                }
                slot.release(Some(env));
                result.map_err(|p| panic_message(p.as_ref()))
            });
        let thread = match spawned {
            Ok(t) => t,
            Err(source) => {
                slot.release(None);
                return Err(LcoreError::Spawn { lcore: id, source });
            }
        };
        match pinned_rx.recv() {
            Ok(Ok(())) => Ok(LcoreHandle { info, thread }),
            Ok(Err(source)) => {
                let _ = thread.join();
                Err(LcoreError::Pin {
                    lcore: id,
                    cpu: info.cpu,
                    source,
                })
            }
            Err(_) => {
                let message = match thread.join() {
                    Err(p) => panic_message(p.as_ref()),
                    Ok(_) => "thread exited before pinning".to_owned(),
                };
                slot.release(None);
                Err(LcoreError::Panicked {
                    lcore: id,
                    cpu: info.cpu,
                    message,
                })
            }
        }
    }

    /// Launches a poll loop on worker `id`: builds a [`LoopBuilder`] with `config` and the
    /// [`RealClock`] on the lcore's thread, lets `setup` register pollers and handlers there
    /// (so they need not be `Send`), and runs it. The handle yields the [`LoopReport`], or the
    /// configuration error.
    ///
    /// # Errors
    ///
    /// As for [`launch`](Self::launch).
    pub fn launch_loop<F>(
        &self,
        id: LcoreId,
        config: LoopConfig,
        setup: F,
    ) -> Result<LcoreHandle<Result<LoopReport, LoopConfigError>>, LcoreError>
    where
        F: FnOnce(&mut LoopBuilder<M, RealClock>) + Send + 'static,
    {
        self.launch(id, move |lc| {
            let mut b = LoopBuilder::new(config, RealClock::new());
            setup(&mut b);
            let mut l = b.build()?;
            Ok(lc.run(&mut l))
        })
    }

    /// Launches a clone of `f` on every worker (DPDK's `rte_eal_mp_remote_launch` with
    /// `SKIP_MAIN`). Launches nothing if any worker is busy.
    ///
    /// # Errors
    ///
    /// [`LcoreError::Busy`] naming the first busy worker; otherwise the first launch error
    /// (workers launched before it keep running; their handles are dropped, detaching them,
    /// after the stop signal is raised).
    pub fn launch_workers<R, F>(&self, f: F) -> Result<Vec<LcoreHandle<R>>, LcoreError>
    where
        F: FnOnce(&mut Lcore<M>) -> R + Send + Clone + 'static,
        R: Send + 'static,
    {
        for id in self.workers() {
            let st = lock(&self.slots[usize::from(id.index())].state);
            if st.busy || st.env.is_none() {
                return Err(LcoreError::Busy { lcore: id });
            }
        }
        let mut handles = Vec::new();
        for id in self.workers().collect::<Vec<_>>() {
            match self.launch(id, f.clone()) {
                Ok(h) => handles.push(h),
                Err(e) => {
                    self.stop();
                    return Err(e);
                }
            }
        }
        Ok(handles)
    }

    /// Runs `f` as the main lcore on the calling thread, pinned to the main CPU for the
    /// duration; the thread's previous affinity is restored afterwards.
    ///
    /// # Errors
    ///
    /// [`LcoreError::Busy`] if the main lcore is already running, [`LcoreError::Pin`] if
    /// pinning failed, [`LcoreError::Panicked`] if `f` panicked (the stop signal is raised and
    /// the panic does not propagate).
    pub fn run_on_main<R>(&self, f: impl FnOnce(&mut Lcore<M>) -> R) -> Result<R, LcoreError> {
        let id = self.main;
        let info = self.info(id)?;
        let slot = &self.slots[usize::from(id.index())];
        slot.claim(id)?;
        let Some(mut env) = slot.take() else {
            slot.release(None);
            return Err(LcoreError::Busy { lcore: id });
        };
        let give_back = |env| slot.release(Some(env));
        let previous = match CpuSet::current_thread_affinity() {
            Ok(p) => p,
            Err(source) => {
                give_back(env);
                return Err(LcoreError::Pin {
                    lcore: id,
                    cpu: info.cpu,
                    source,
                });
            }
        };
        if let Err(source) = pin_current(info.cpu) {
            let _ = previous.set_current_thread_affinity();
            give_back(env);
            return Err(LcoreError::Pin {
                lcore: id,
                cpu: info.cpu,
                source,
            });
        }
        let result = catch_unwind(AssertUnwindSafe(|| f(&mut env)));
        // Best effort: if restoring fails the thread merely stays pinned.
        let _ = previous.set_current_thread_affinity();
        if result.is_err() {
            env.stop.stop_for_panic(id);
        }
        give_back(env);
        result.map_err(|p| LcoreError::Panicked {
            lcore: id,
            cpu: info.cpu,
            message: panic_message(p.as_ref()),
        })
    }
}
