//! Measurements of the lcore layer, for `dp-perf lcore --json` and similar tools.
//!
//! [`measure`] runs three experiments on two pinned lcores in **busy** mode, so it needs two
//! CPUs that nothing else is using (on a shared or 2-core host expect noisy numbers):
//!
//! 1. **Loop overhead**: one lcore runs a loop with `idle_pollers` pollers that never do work
//!    and an (empty) inbox; reports clock time per iteration. This is the floor every real
//!    poller pays per round.
//! 2. **Message latency**: ping-pong between the two lcores through their inboxes and poll
//!    loops; reports half the round-trip time (p50/p99/min). It includes up to one loop
//!    iteration of waiting on each side, which is what a real message pays.
//! 3. **Message throughput**: one lcore sends sequence numbers in bursts of `burst`, the other
//!    drains them in its loop; reports messages per second seen by the consumer between the
//!    first and the last message.
//!
//! Results are in the loop clock's nanoseconds ([`RealClock`]: calibrated TSC where
//! available). Nothing here asserts a speed; tests call it only with tiny sizes.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use crate::cpuset::CoreList;
use crate::lcores::{InitError, LcoreError, Lcores, LcoresConfig};
use crate::poll_loop::{DrainPolicy, LoopBuilder, LoopConfig, LoopConfigError, PollMode};
use crate::time::{Clock, RealClock, TscClock};

/// Parameters of [`measure`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerfConfig {
    /// The two CPUs to use: `cpus[0]` is the main lcore (the calling thread is pinned to it for
    /// the duration), `cpus[1]` a worker.
    pub cpus: [usize; 2],
    /// Idle pollers in the loop-overhead run.
    pub idle_pollers: usize,
    /// Iterations of the loop-overhead run.
    pub loop_iterations: u64,
    /// Round trips in the latency run (after 1/10 as many warm-up round trips).
    pub latency_samples: usize,
    /// Messages in the throughput run.
    pub throughput_messages: u64,
    /// Producer burst size in the throughput run.
    pub burst: usize,
    /// Inbox slots (power of two).
    pub inbox_capacity: usize,
}

impl Default for PerfConfig {
    fn default() -> Self {
        Self {
            cpus: [0, 1],
            idle_pollers: 8,
            loop_iterations: 10_000_000,
            latency_samples: 100_000,
            throughput_messages: 10_000_000,
            burst: 32,
            inbox_capacity: 4096,
        }
    }
}

/// Results of [`measure`].
#[derive(Debug, Clone, PartialEq)]
pub struct PerfReport {
    /// `"tsc"` or `"monotonic"`.
    pub clock: &'static str,
    /// Calibrated TSC rate, if the TSC is used.
    pub tsc_hz: Option<u64>,
    /// CPUs used.
    pub cpus: [usize; 2],
    /// Idle pollers in the loop-overhead run.
    pub idle_pollers: usize,
    /// Iterations measured.
    pub loop_iterations: u64,
    /// Nanoseconds per loop iteration with `idle_pollers` idle pollers.
    pub loop_ns_per_iter: f64,
    /// Round trips measured.
    pub latency_samples: usize,
    /// Median one-way latency (half RTT), nanoseconds.
    pub latency_p50_ns: u64,
    /// 99th percentile one-way latency, nanoseconds.
    pub latency_p99_ns: u64,
    /// Minimum one-way latency, nanoseconds.
    pub latency_min_ns: u64,
    /// Messages in the throughput run.
    pub throughput_messages: u64,
    /// Producer burst size.
    pub burst: usize,
    /// Messages per second.
    pub msgs_per_sec: f64,
}

/// Why a measurement could not run.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum PerfError {
    /// Bad parameters.
    #[error("invalid perf parameters: {0}")]
    Config(&'static str),
    /// The lcores could not be set up (e.g. a CPU is not allowed).
    #[error(transparent)]
    Init(#[from] InitError),
    /// An lcore failed.
    #[error(transparent)]
    Lcore(#[from] LcoreError),
    /// A loop configuration was rejected.
    #[error(transparent)]
    Loop(#[from] LoopConfigError),
}

fn lcores(cfg: &PerfConfig) -> Result<Lcores<u64>, PerfError> {
    let mut lc = LcoresConfig::new(CoreList::Cpus(cfg.cpus.to_vec()));
    lc.main_cpu = Some(cfg.cpus[0]);
    lc.inbox_capacity = cfg.inbox_capacity;
    Ok(Lcores::init(&lc)?)
}

fn busy_config(name: &str) -> LoopConfig {
    LoopConfig {
        name: name.to_owned(),
        mode: PollMode::Busy,
        drain: DrainPolicy {
            idle_iterations: 0,
            timeout: Duration::from_secs(1),
        },
        ..LoopConfig::default()
    }
}

/// Runs all three measurements; see the [module docs](self).
///
/// Needs the two CPUs in [`PerfConfig::cpus`] free of other work: both lcores busy-poll, and the
/// calling thread becomes the main lcore (pinned to `cpus[0]`) for the duration.
///
/// # Errors
///
/// [`PerfError`] if the parameters are invalid or the CPUs cannot be used.
pub fn measure(cfg: &PerfConfig) -> Result<PerfReport, PerfError> {
    if cfg.cpus[0] == cfg.cpus[1] {
        return Err(PerfError::Config("the two CPUs must differ"));
    }
    if cfg.loop_iterations == 0 || cfg.latency_samples == 0 || cfg.throughput_messages == 0 {
        return Err(PerfError::Config(
            "iteration, sample and message counts must be > 0",
        ));
    }
    if cfg.burst == 0 || cfg.burst > cfg.inbox_capacity {
        return Err(PerfError::Config("burst must be in 1..=inbox_capacity"));
    }
    let clock = RealClock::new();
    let loop_ns = measure_loop_overhead(cfg)?;
    let lat = measure_latency(cfg)?;
    let rate = measure_throughput(cfg)?;
    Ok(PerfReport {
        clock: clock.source(),
        tsc_hz: TscClock::get().ok().map(|t| t.hz()),
        cpus: cfg.cpus,
        idle_pollers: cfg.idle_pollers,
        loop_iterations: cfg.loop_iterations,
        loop_ns_per_iter: loop_ns,
        latency_samples: cfg.latency_samples,
        latency_p50_ns: lat.p50,
        latency_p99_ns: lat.p99,
        latency_min_ns: lat.min,
        throughput_messages: cfg.throughput_messages,
        burst: cfg.burst,
        msgs_per_sec: rate,
    })
}

/// Nanoseconds per iteration of a loop with `cfg.idle_pollers` idle pollers on `cfg.cpus[1]`.
///
/// # Errors
///
/// As for [`measure`].
pub fn measure_loop_overhead(cfg: &PerfConfig) -> Result<f64, PerfError> {
    let lcores = lcores(cfg)?;
    let worker = lcores
        .workers()
        .next()
        .ok_or(PerfError::Config("need a worker lcore"))?;
    let pollers = cfg.idle_pollers;
    let target = cfg.loop_iterations;
    let handle = lcores.launch(worker, move |lc| -> Result<f64, LoopConfigError> {
        let mut b = LoopBuilder::<u64, _>::new(busy_config("perf-loop"), RealClock::new());
        let mut n = 0u64;
        b.poller("counter", move |ctx| {
            n += 1;
            if n == target {
                ctx.stop_local();
            }
            0
        });
        for _ in 1..pollers {
            b.poller("idle", |_| 0);
        }
        b.on_message(|_, _| {});
        let mut l = b.build()?;
        let r = lc.run(&mut l);
        Ok((r.busy_nanos + r.idle_nanos) as f64 / r.iterations.max(1) as f64)
    })?;
    Ok(handle.join()??)
}

struct Latency {
    p50: u64,
    p99: u64,
    min: u64,
}

/// One-way message latency (half RTT) between the two lcores.
fn measure_latency(cfg: &PerfConfig) -> Result<Latency, PerfError> {
    let lcores = lcores(cfg)?;
    let main = lcores.main_lcore();
    let worker = lcores
        .workers()
        .next()
        .ok_or(PerfError::Config("need a worker lcore"))?;
    let pong = lcores.launch(worker, move |lc| -> Result<(), LoopConfigError> {
        let mut b = LoopBuilder::<u64, _>::new(busy_config("perf-pong"), RealClock::new());
        b.on_message(move |ctx, m| {
            let mut m = m;
            // The ping side has at most one message in flight, so this never loops for long.
            while let Err(e) = ctx.send(main, m) {
                m = e.into_inner();
                core::hint::spin_loop();
            }
        });
        let mut l = b.build()?;
        lc.run(&mut l);
        Ok(())
    })?;
    let warmup = cfg.latency_samples / 10;
    let total = warmup + cfg.latency_samples;
    let samples = lcores.run_on_main(|lc| -> Result<Vec<u64>, LoopConfigError> {
        let clock = RealClock::new();
        let rtts = Rc::new(RefCell::new(Vec::with_capacity(total)));
        let in_flight = Rc::new(Cell::new(false));
        let sent_at = Rc::new(Cell::new(0u64));
        let mut b = LoopBuilder::<u64, _>::new(busy_config("perf-ping"), clock);
        {
            let (in_flight, sent_at) = (Rc::clone(&in_flight), Rc::clone(&sent_at));
            b.poller("ping", move |ctx| {
                if in_flight.get() {
                    return 0;
                }
                let t = clock.now().as_nanos();
                if ctx.send(worker, t).is_ok() {
                    sent_at.set(t);
                    in_flight.set(true);
                }
                1
            });
        }
        {
            let (rtts, in_flight) = (Rc::clone(&rtts), Rc::clone(&in_flight));
            b.on_message(move |ctx, _| {
                let rtt = clock.now().as_nanos().saturating_sub(sent_at.get());
                in_flight.set(false);
                let mut r = rtts.borrow_mut();
                r.push(rtt);
                if r.len() == total {
                    ctx.stop_all();
                }
            });
        }
        let mut l = b.build()?;
        lc.run(&mut l);
        drop(l);
        Ok(Rc::try_unwrap(rtts)
            .map(RefCell::into_inner)
            .unwrap_or_default())
    });
    // Whatever happened on main, make sure the worker ends before joining it.
    lcores.stop();
    pong.join()??;
    let samples = samples??;
    let mut one_way: Vec<u64> = samples.iter().skip(warmup).map(|r| r / 2).collect();
    if one_way.is_empty() {
        return Err(PerfError::Config("no latency samples were collected"));
    }
    one_way.sort_unstable();
    let pct = |p: usize| one_way[(one_way.len() - 1) * p / 100];
    Ok(Latency {
        p50: pct(50),
        p99: pct(99),
        min: one_way[0],
    })
}

/// Messages per second from the worker (producer) to the main lcore (consumer).
fn measure_throughput(cfg: &PerfConfig) -> Result<f64, PerfError> {
    let lcores = lcores(cfg)?;
    let main = lcores.main_lcore();
    let worker = lcores
        .workers()
        .next()
        .ok_or(PerfError::Config("need a worker lcore"))?;
    let total = cfg.throughput_messages;
    let burst = cfg.burst;
    let producer = lcores.launch(worker, move |lc| -> Result<(), LoopConfigError> {
        let mut b = LoopBuilder::<u64, _>::new(busy_config("perf-producer"), RealClock::new());
        let mut next = 0u64;
        let mut buf = vec![0u64; burst];
        b.poller("produce", move |ctx| {
            if next == total || ctx.is_stopping() {
                return 0;
            }
            let n = (total - next).min(burst as u64) as usize;
            for (i, slot) in buf[..n].iter_mut().enumerate() {
                *slot = next + i as u64;
            }
            let sent = ctx.send_burst(main, &buf[..n]);
            next += sent as u64;
            sent
        });
        let mut l = b.build()?;
        lc.run(&mut l);
        Ok(())
    })?;
    let rate = lcores.run_on_main(|lc| -> Result<f64, LoopConfigError> {
        let clock = RealClock::new();
        let first = Rc::new(Cell::new(None::<u64>));
        let last = Rc::new(Cell::new(0u64));
        let got = Rc::new(Cell::new(0u64));
        let mut cfg = busy_config("perf-consumer");
        cfg.msg_batch = burst.clamp(1, crate::poll_loop::MAX_MSG_BATCH);
        let mut b = LoopBuilder::<u64, _>::new(cfg, clock);
        {
            let (first, last, got) = (Rc::clone(&first), Rc::clone(&last), Rc::clone(&got));
            b.on_message(move |ctx, _| {
                let now = clock.now().as_nanos();
                if first.get().is_none() {
                    first.set(Some(now));
                }
                got.set(got.get() + 1);
                if got.get() == total {
                    last.set(now);
                    ctx.stop_all();
                }
            });
        }
        let mut l = b.build()?;
        lc.run(&mut l);
        let span = last.get().saturating_sub(first.get().unwrap_or(0)).max(1);
        Ok(got.get().saturating_sub(1) as f64 * 1e9 / span as f64)
    });
    lcores.stop();
    producer.join()??;
    Ok(rate??)
}
