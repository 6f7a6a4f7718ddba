//! `dp-perf rds-stress --kernel`: the same request/ack (or one-way) load on the kernel's
//! own RDS sockets (`AF_RDS`, `SO_RDS_TRANSPORT` = TCP, or IB with `--transport ib`), as
//! `rstream --tcp` runs kernel TCP beside rsockets, so ratios come from one run on one
//! machine. With `--transport ib` the kernel's `rds_rdma` carries the load (RDS-IB: in the
//! initial network namespace only, on addresses of an RDMA device).
//!
//! Each side is one pinned thread busy-polling its non-blocking sockets (`MSG_DONTWAIT`).
//! Between two network namespaces (the kernel lab: `-r ADDR` on one side, `-s PEER -r
//! ADDR` on the other) this measures kernel RDS-TCP. `--pair` runs both sides in this
//! process on 127.0.80.1/.2, where the kernel uses its loopback transport, not TCP (RDS
//! between two addresses of one namespace never leaves it): a reference point only.
//! One way, the rate is what the active side sent (RDS is reliable; the passive side
//! reports what it received).

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use super::ksock::{KSock, RDS_TRANS_IB};
use crate::PerfError;

/// The load of a kernel run (rds-stress's options).
#[derive(Debug, Clone, Copy)]
pub(super) struct KernelLoad {
    pub(super) port: u16,
    pub(super) req: usize,
    pub(super) ack: usize,
    pub(super) inflight: u64,
    pub(super) sockets: u32,
    pub(super) one_way: bool,
    pub(super) warmup: Duration,
    /// `SO_RDS_TRANSPORT` of the sockets (`RDS_TRANS_TCP` or `RDS_TRANS_IB`).
    pub(super) transport: libc::c_int,
}

/// 0 warm-up, 1 measuring, 2 done (pair runs: written by the active side).
pub(super) struct Phase(pub(super) AtomicU8);

fn open(addr: IpAddr, load: &KernelLoad) -> Result<Vec<KSock>, PerfError> {
    let mut v = Vec::with_capacity(load.sockets as usize);
    for k in 0..load.sockets {
        let s = KSock::new().map_err(|e| {
            PerfError::Fabric(format!(
                "socket(AF_RDS): {e}: this kernel has no RDS; load it with `modprobe rds_tcp` \
                 (as root), or run in the kernel lab VM (/work/shared/tools/kernel-peers)"
            ))
        })?;
        s.set_transport(load.transport).map_err(|e| {
            PerfError::Fabric(if load.transport == RDS_TRANS_IB {
                format!(
                    "SO_RDS_TRANSPORT ib: {e}: `modprobe rds_rdma` (as root, in the initial \
                     network namespace: RDS-IB serves no other)"
                )
            } else {
                format!(
                    "SO_RDS_TRANSPORT tcp: {e}: `modprobe rds_tcp` (the rds module alone has no TCP)"
                )
            })
        })?;
        let per = (load.req + load.ack) as u64;
        let bytes = (load.inflight * per * 2 / u64::from(load.sockets)).max(per * 2);
        s.set_buffers(bytes.min(16 << 20) as u32)
            .map_err(|e| PerfError::Fabric(format!("RDS socket buffers: {e}")))?;
        let at = SocketAddr::new(addr, load.port + 1 + k as u16);
        s.bind(at)
            .map_err(|e| PerfError::Fabric(format!("bind {at} (AF_RDS): {e}")))?;
        v.push(s);
    }
    Ok(v)
}

fn would_wait(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EAGAIN) | Some(libc::ENOBUFS) | Some(libc::ENOMEM)
    )
}

/// The active side: returns (completed per second while measuring, sends that waited).
pub(super) fn active(
    load: &KernelLoad,
    addr: IpAddr,
    peer: IpAddr,
    secs: u64,
    phase: &Phase,
) -> Result<(f64, u64), PerfError> {
    let socks = open(addr, load)?;
    let dests: Vec<SocketAddr> = (0..load.sockets)
        .map(|k| SocketAddr::new(peer, load.port + 1 + k as u16))
        .collect();
    let req = vec![0xa5u8; load.req];
    let mut buf = vec![0u8; 1 << 20];
    let t0 = Instant::now();
    let (mut done, mut inflight, mut waits) = (0u64, 0u64, 0u64);
    let mut rr = 0usize;
    let mut measure: Option<(Instant, u64)> = None;
    let connect_deadline = t0 + Duration::from_secs(10) + load.warmup;
    loop {
        let now = Instant::now();
        match measure {
            None if now.duration_since(t0) >= load.warmup && done > 0 => {
                measure = Some((now, done));
                // Relaxed: a flag the other side polls; nothing else is ordered by it.
                phase.0.store(1, Ordering::Relaxed);
            }
            None if now >= connect_deadline => {
                phase.0.store(2, Ordering::Relaxed);
                return Err(PerfError::Fabric(format!(
                    "kernel RDS: nothing completed in 10 s ({peer} reachable? its side running?)"
                )));
            }
            Some((at, base)) if now.duration_since(at) >= Duration::from_secs(secs) => {
                phase.0.store(2, Ordering::Relaxed);
                let s = now.duration_since(at).as_secs_f64();
                return Ok(((done - base) as f64 / s, waits));
            }
            _ => {}
        }
        // Send while the window allows.
        let window = if load.one_way {
            u64::MAX
        } else {
            load.inflight
        };
        let mut burst = 0;
        while inflight < window && burst < 64 {
            let k = rr % socks.len();
            match socks[k].send_to(dests[k], &req) {
                Ok(_) => {
                    rr += 1;
                    burst += 1;
                    if load.one_way {
                        done += 1;
                    } else {
                        inflight += 1;
                    }
                }
                Err(e) if would_wait(&e) => {
                    waits += 1;
                    break;
                }
                Err(e) => return Err(PerfError::Fabric(format!("kernel RDS sendto: {e}"))),
            }
        }
        // Acks.
        for s in &socks {
            loop {
                match s.recv_from(&mut buf) {
                    Ok(_) => {
                        done += 1;
                        inflight = inflight.saturating_sub(1);
                    }
                    Err(e) if would_wait(&e) => break,
                    Err(e) => return Err(PerfError::Fabric(format!("kernel RDS recvfrom: {e}"))),
                }
            }
        }
    }
}

/// The passive side: answers every request with an ack (unless one way) until the phase
/// says done or `limit` passes. Returns the requests received.
pub(super) fn passive(
    load: &KernelLoad,
    addr: IpAddr,
    phase: &Phase,
    limit: Option<Duration>,
) -> Result<u64, PerfError> {
    let socks = open(addr, load)?;
    let ack = vec![0x5au8; load.ack];
    let mut buf = vec![0u8; 1 << 20];
    let mut backlog: std::collections::VecDeque<(usize, SocketAddr)> = Default::default();
    let t0 = Instant::now();
    let mut rx = 0u64;
    loop {
        // Relaxed: see `active`.
        if phase.0.load(Ordering::Relaxed) == 2 || limit.is_some_and(|l| t0.elapsed() >= l) {
            return Ok(rx);
        }
        while let Some(&(k, to)) = backlog.front() {
            match socks[k].send_to(to, &ack) {
                Ok(_) => {
                    backlog.pop_front();
                }
                Err(e) if would_wait(&e) => break,
                Err(e) => return Err(PerfError::Fabric(format!("kernel RDS ack: {e}"))),
            }
        }
        for (k, s) in socks.iter().enumerate() {
            loop {
                match s.recv_from(&mut buf) {
                    Ok((_, from)) => {
                        rx += 1;
                        if !load.one_way {
                            backlog.push_back((k, from));
                        }
                    }
                    Err(e) if would_wait(&e) => break,
                    Err(e) => return Err(PerfError::Fabric(format!("kernel RDS recvfrom: {e}"))),
                }
            }
        }
    }
}
