//! The client side of `dp-perf rtrs`: one lcore keeps `iodepth` requests in flight over
//! the session's paths for the run's seconds, timing each from submission to completion,
//! and with `--kill-path-after` tears a path down under load and follows its failover and
//! reconnect.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use dataplane::fabric::Provider;
use dataplane::rtrs::clt::{
    ClientConfig, ClientEvent, ClientSession, ClientState, DataRef, MpPolicy, Request,
};
use dataplane::rtrs::fabric::{ClientDriver, ClientDriverConfig, PathKill};
use dataplane::rtrs::permit::{ConType, Permit, Wait};
use dataplane::rtrs::work::{Dir, PathId};
use dp_plot::{PercentileSeries, fmt_bytes};
use hdrhistogram::Histogram;
use lcore::time::{Clock, Instant, RealClock};
use mempool::memory::{Region, RegionConfig};

use super::msg::{BYE, USR_LEN};
use super::report::{KillReport, RtrsReport};
use crate::PerfError;
use crate::harness::Idle;

/// What one client run does.
#[derive(Debug, Clone)]
pub(super) struct Plan {
    pub(super) addrs: Vec<SocketAddr>,
    pub(super) dir: Dir,
    pub(super) bs: u32,
    pub(super) iodepth: u16,
    pub(super) secs: f64,
    pub(super) policy: MpPolicy,
    pub(super) kill_after: Option<f64>,
    pub(super) kill_how: PathKill,
    pub(super) per_io: bool,
    pub(super) busy: bool,
}

fn fail(what: impl std::fmt::Display) -> PerfError {
    PerfError::Fabric(what.to_string())
}

struct InFlight {
    permit: Permit,
    start: Instant,
}

struct Run<P: Provider> {
    clock: RealClock,
    drv: ClientDriver<P>,
    sess: ClientSession,
    region: u32,
    bs: u32,
    dir: Dir,
    slots: Vec<Option<InFlight>>,
    inflight: usize,
    block: u64,
    hist: Histogram<u64>,
    counting: bool,
    completed: u64,
    failed: u64,
    /// Permits whose requests were on the killed path at the kill.
    moved: Vec<bool>,
    moving: usize,
    /// When the last of them completed.
    failover_at: Option<Instant>,
    /// Of them, those that completed with an error.
    moved_failed: u64,
    /// Submission pauses until then after a refused request.
    refused_until: Option<Instant>,
    events: Vec<(Instant, ClientEvent)>,
    idle: Idle,
}

impl<P: Provider> Run<P> {
    /// Submits one request. A request the session refuses (no path connected: the only
    /// path was killed) counts as failed, and submission pauses for a millisecond.
    fn submit(&mut self, bye: bool) -> Result<bool, PerfError> {
        if self.refused_until.is_some_and(|t| self.clock.now() < t) {
            return Ok(false);
        }
        let Some(permits) = self.sess.permits() else {
            return Ok(false);
        };
        let Some(permit) = permits.get(ConType::Io, 0, Wait::NoWait) else {
            return Ok(false);
        };
        let id = permit.id();
        self.block += 1;
        let mut usr = [0u8; USR_LEN];
        usr[..8].copy_from_slice(&self.block.to_le_bytes());
        if bye {
            usr[8..].copy_from_slice(&BYE);
        }
        let req = Request {
            dir: self.dir,
            usr: &usr,
            data: Some(DataRef {
                region: self.region,
                offset: u64::from(id) * u64::from(self.bs),
                len: self.bs,
            }),
            ctx: self.block,
        };
        let now = self.clock.now();
        if let Err(e) = self.sess.request(now, &permit, req, &mut self.drv) {
            self.sess.permits().expect("open").put(permit);
            self.failed += 1;
            if bye {
                return Err(fail(format_args!("the last request was refused: {e}")));
            }
            self.refused_until = Some(now.saturating_add(Duration::from_millis(1)));
            return Ok(false);
        }
        self.slots[usize::from(id)] = Some(InFlight { permit, start: now });
        self.inflight += 1;
        Ok(true)
    }

    /// One poll turn; returns the completions it saw.
    ///
    /// A request's latency ends when the turn that found its completion hands it over (the
    /// clock read after the poll, once per turn that completed something), as fio's
    /// completion latency does: the clock read that starts the turn came before the poll
    /// that found the answer and before the work of reaping it, which measured up to a
    /// turn too little.
    fn turn(&mut self) -> usize {
        let now = self.clock.now();
        let mut work = self.drv.poll(now, &mut self.sess);
        let mut done = 0;
        let mut end = None;
        while let Some(ev) = self.sess.poll_event() {
            work += 1;
            match ev {
                ClientEvent::Completed { id, result, .. } => {
                    let Some(f) = self.slots.get_mut(usize::from(id)).and_then(Option::take) else {
                        continue;
                    };
                    self.inflight -= 1;
                    done += 1;
                    if result.is_err() {
                        self.failed += 1;
                    } else if self.counting {
                        self.completed += 1;
                        let end = *end.get_or_insert_with(|| self.clock.now());
                        let _ = self.hist.record(end.nanos_since(f.start).max(1));
                    }
                    if self.moved.get(usize::from(id)).copied() == Some(true) {
                        self.moved[usize::from(id)] = false;
                        self.moving -= 1;
                        self.moved_failed += u64::from(result.is_err());
                        if self.moving == 0 {
                            self.failover_at = Some(now);
                        }
                    }
                    self.sess.permits().expect("open").put(f.permit);
                }
                e => self.events.push((now, e)),
            }
        }
        self.idle.after(work);
        done
    }

    fn fill(&mut self, depth: usize) -> Result<(), PerfError> {
        while self.inflight < depth {
            if !self.submit(false)? {
                break;
            }
        }
        Ok(())
    }

    fn drain(&mut self, limit: Duration) -> Result<(), PerfError> {
        let end = std::time::Instant::now() + limit;
        while self.inflight > 0 {
            if std::time::Instant::now() > end {
                return Err(fail(format_args!(
                    "{} requests still in flight {limit:?} after the end",
                    self.inflight
                )));
            }
            self.turn();
        }
        Ok(())
    }
}

/// Runs the client side of `plan` on provider `P`.
pub(super) fn measure<P: Provider>(
    dev: Arc<P::Device>,
    plan: &Plan,
) -> Result<RtrsReport, PerfError> {
    let qd = plan.iodepth;
    let clock = RealClock::new();
    let mut drv = ClientDriver::<P>::new(
        dev,
        ClientDriverConfig {
            max_queue_depth: qd,
            hdr_bytes: 256,
        },
    )
    .map_err(fail)?;
    drv.set_per_io_registration(plan.per_io);
    for a in &plan.addrs {
        drv.add_route(*a);
    }
    let data = Region::new(
        &RegionConfig::new("dp-perf-rtrs", usize::from(qd) * plan.bs as usize)
            .shareable(true)
            .quiet(),
    )
    .map_err(|e| fail(format_args!("allocating the data buffers: {e}")))?;
    let region = drv.add_region(Arc::new(data)).map_err(fail)?;
    let seed = std::process::id() as u64 ^ clock.now().as_nanos();
    let mut uuid = [0u8; 16];
    uuid[..8].copy_from_slice(&seed.to_le_bytes());
    let mut cfg = ClientConfig::new(b"dp-perf-rtrs", uuid).map_err(fail)?;
    cfg.policy = plan.policy;
    cfg.reconnect_delay = Duration::from_millis(100);
    let mut sess = ClientSession::new(cfg).map_err(fail)?;
    let uuids: Vec<[u8; 16]> = (0..plan.addrs.len())
        .map(|k| {
            let mut u = uuid;
            u[15] = k as u8 + 1;
            u
        })
        .collect();
    // The server may still be starting: retry the open for a while.
    let open_by = std::time::Instant::now() + Duration::from_secs(20);
    let mut hist = Histogram::<u64>::new(3).map_err(fail)?;
    hist.auto(true);
    let mut run = loop {
        sess.open(clock.now(), &uuids, &mut drv).map_err(fail)?;
        let mut idle = Idle::new(plan.busy);
        let opened = loop {
            let w = drv.poll(clock.now(), &mut sess);
            let mut r = None;
            while let Some(ev) = sess.poll_event() {
                match ev {
                    ClientEvent::Opened { queue_depth, .. } => r = Some(Ok(queue_depth)),
                    ClientEvent::OpenFailed { error, .. } => r = Some(Err(error)),
                    _ => {}
                }
            }
            if let Some(r) = r {
                break r;
            }
            idle.after(w);
        };
        match opened {
            Ok(got) if got < qd => {
                return Err(PerfError::Usage(format!(
                    "the server offers queue depth {got}, below --iodepth {qd}"
                )));
            }
            Ok(_) => {}
            Err(e) if std::time::Instant::now() < open_by => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(100));
                sess = ClientSession::new(cfg).map_err(fail)?;
                continue;
            }
            Err(e) => return Err(fail(format_args!("opening the session: {e}"))),
        }
        break Run {
            clock,
            drv,
            sess,
            region,
            bs: plan.bs,
            dir: plan.dir,
            slots: (0..qd).map(|_| None).collect(),
            inflight: 0,
            block: 0,
            hist,
            counting: false,
            completed: 0,
            failed: 0,
            moved: vec![false; usize::from(qd)],
            moving: 0,
            failover_at: None,
            refused_until: None,
            moved_failed: 0,
            events: Vec::new(),
            idle: Idle::new(plan.busy),
        };
    };
    let depth = usize::from(qd);
    // Warm-up: a tenth of the run, at most half a second.
    let warm = Duration::from_secs_f64((plan.secs / 10.0).min(0.5));
    let w_end = std::time::Instant::now() + warm;
    while std::time::Instant::now() < w_end {
        run.fill(depth)?;
        run.turn();
    }
    run.counting = true;
    let t0 = run.clock.now();
    let len = Duration::from_secs_f64(plan.secs);
    let kill_at = plan
        .kill_after
        .map(|s| t0.saturating_add(Duration::from_secs_f64(s)));
    let victim: Option<PathId> = run.sess.paths().next();
    let mut kill: Option<(Instant, KillReport)> = None;
    let t1 = loop {
        run.fill(depth)?;
        run.turn();
        let now = run.clock.now();
        if let (Some(at), Some(v), None) = (kill_at, victim, kill.as_ref())
            && now >= at
        {
            let mut moved = 0;
            for id in 0..qd {
                if run.slots[usize::from(id)].is_some() && run.sess.request_path(id) == Some(v) {
                    run.moved[usize::from(id)] = true;
                    moved += 1;
                }
            }
            run.moving = moved as usize;
            run.events.clear();
            let before = run
                .sess
                .path_stats(v)
                .map_or(0, |s| s.rdma.read_cnt + s.rdma.write_cnt);
            run.drv.kill_path_by(v, plan.kill_how);
            let k = KillReport {
                at_s: now.nanos_since(t0) as f64 / 1e9,
                moved,
                after: before,
                how: match plan.kill_how {
                    PathKill::Disconnect => "CM disconnect",
                    PathKill::QpError => "queue pairs to error",
                },
                ..KillReport::default()
            };
            kill = Some((now, k));
        }
        if now.nanos_since(t0) >= len.as_nanos() as u64 {
            break now;
        }
    };
    run.counting = false;
    let secs = t1.nanos_since(t0) as f64 / 1e9;
    run.drain(Duration::from_secs(10))?;
    let kill = kill.map(|(at, mut k)| {
        for (t, e) in &run.events {
            match e {
                ClientEvent::PathUp { path }
                    if Some(*path) == victim && k.reconnect_ns.is_none() =>
                {
                    k.reconnect_ns = Some(t.nanos_since(at));
                }
                _ => {}
            }
        }
        k.moved_failed = run.moved_failed;
        k.failover_ns = if k.moved == 0 {
            Some(0)
        } else {
            run.failover_at.map(|t| t.nanos_since(at))
        };
        if k.reconnect_ns.is_some()
            && let Some(s) = victim.and_then(|v| run.sess.path_stats(v))
        {
            // Counted at the kill; the path carried nothing until it was back.
            k.after = (s.rdma.read_cnt + s.rdma.write_cnt).saturating_sub(k.after);
        } else {
            k.after = 0;
        }
        k
    });
    let path_lines = run
        .sess
        .paths()
        .enumerate()
        .filter_map(|(k, id)| {
            let s = run.sess.path_stats(id)?;
            Some(format!(
                "path {k} {}: {:?}; stats/rdma: {}; stats/reconnects: {}; cur_latency: {}",
                run.drv
                    .path_addr(id)
                    .map_or_else(|| "-".to_string(), |a| a.to_string()),
                run.sess.path_state(id)?,
                s.rdma_sysfs().to_string().trim_end(),
                s.reconnects_sysfs().to_string().trim_end(),
                s.cur_latency_sysfs().to_string().trim_end()
            ))
        })
        .collect();
    // Tell the server we are done (on a connected path: a killed one may still be on its
    // way back), then close.
    let by = std::time::Instant::now() + Duration::from_secs(10);
    while !run
        .sess
        .paths()
        .any(|p| run.sess.path_state(p) == Some(ClientState::Connected))
    {
        if std::time::Instant::now() > by {
            return Err(fail("no path came back within 10 s to end the run on"));
        }
        run.turn();
    }
    run.refused_until = None;
    run.submit(true)?;
    run.drain(Duration::from_secs(10))?;
    let now = run.clock.now();
    run.sess.close(now, &mut run.drv);
    while run.sess.poll_event().is_some() {}
    let h = &run.hist;
    let q = |p: f64| {
        if h.is_empty() {
            0.0
        } else {
            h.value_at_quantile(p) as f64
        }
    };
    let iops = run.completed as f64 / secs.max(1e-9);
    Ok(RtrsReport {
        rw: if plan.dir == Dir::Read {
            "read"
        } else {
            "write"
        },
        bs: plan.bs,
        iodepth: qd,
        secs,
        paths: plan.addrs.len(),
        policy: policy_name(plan.policy),
        provider: P::NAME,
        poll: if plan.busy { "busy" } else { "hybrid" },
        completed: run.completed,
        iops,
        gbps: iops * f64::from(plan.bs) * 8.0 / 1e9,
        p50_ns: q(0.5),
        p99_ns: q(0.99),
        p999_ns: q(0.999),
        failed: run.failed,
        kill,
        path_lines,
        dist: PercentileSeries::from_histogram(
            format!(
                "rtrs {} {}",
                if plan.dir == Dir::Read {
                    "read"
                } else {
                    "write"
                },
                fmt_bytes(f64::from(plan.bs))
            ),
            h,
            1.0,
        ),
        served: None,
    })
}

/// The `--policy` spelling of a policy.
pub(super) const fn policy_name(p: MpPolicy) -> &'static str {
    match p {
        MpPolicy::RoundRobin => "rr",
        MpPolicy::MinInflight => "min-inflight",
        MpPolicy::MinLatency => "min-latency",
    }
}
