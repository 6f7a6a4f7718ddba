//! What the active and the passive side both use: the phase the active side publishes,
//! the sockets bound and sized as rds-stress sizes them, the readiness queue, and the
//! node's fragment count.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU8, AtomicU64};

use dataplane::rds::node::RdsNode;
use dataplane::rds::{RdsError, RdsSocket};
use lcore::time::Instant;

use super::args::StressArgs;
use crate::PerfError;
use crate::rds::set_buffers;

/// What the two sides share.
pub(super) struct Shared {
    /// 0 warm-up, 1 measuring, 2 done (written by the active side).
    pub(super) phase: AtomicU8,
    /// Requests the passive side received (published by it, for per-second rows).
    pub(super) passive_rx: AtomicU64,
}

/// Warming up: connecting, then the unmeasured `WARMUP`.
pub(super) const WARM: u8 = 0;
/// Measuring.
pub(super) const MEASURE: u8 = 1;
/// Done: the passive side returns.
pub(super) const DONE: u8 = 2;

impl StressArgs {
    pub(super) fn bind_all(
        &self,
        n: &mut RdsNode,
        now: Instant,
        addr: IpAddr,
        sockets: u32,
    ) -> Result<(Vec<RdsSocket>, HashMap<u32, usize>), PerfError> {
        let mut socks = Vec::with_capacity(sockets as usize);
        let mut index = HashMap::with_capacity(sockets as usize);
        for k in 0..sockets {
            let e = n.engine_mut();
            let s = e
                .socket()
                .map_err(|e| PerfError::Fabric(format!("RDS socket: {e}")))?;
            let port = self.port + 1 + k as u16;
            self.fabric.set_transport(n, now, s)?;
            let e = n.engine_mut();
            e.bind(s, SocketAddr::new(addr, port))
                .map_err(|e| PerfError::Fabric(format!("bind {addr}:{port}: {e}")))?;
            // rds-stress's sizing: tasks x depth x (request + ack) x 2 for both buffers
            // (RDS counts half of SO_SNDBUF), so the depth bounds what is queued; spread
            // over the sockets (each still holds one request), so that --sockets changes
            // how the load is spread, not how much is queued.
            let per = self.req as u64 + self.ack as u64;
            let bytes =
                (u64::from(self.tasks * self.depth) * per * 2 / u64::from(sockets)).max(per * 2);
            set_buffers(n, now, s, bytes)?;
            index.insert(s.index(), k as usize);
            socks.push(s);
        }
        Ok((socks, index))
    }
}

/// Fragments for `inflight` messages of `size` bytes each way, with room to spare.
pub(super) fn frags_for(size: usize, inflight: u32) -> u32 {
    let per = size.div_ceil(4096).max(1) as u64;
    (per * u64::from(inflight) * 4 + 8192).min(1 << 19) as u32
}

/// A send that must wait: the send buffer is full (`EAGAIN`), the destination is
/// congested (`ENOBUFS`) or the message store is full (`ENOMEM`).
pub(super) fn blocked(e: RdsError) -> bool {
    matches!(
        e,
        RdsError::WouldBlock | RdsError::Congested { .. } | RdsError::NoMemory(_)
    )
}

/// The sockets that became readable, from the engine's readiness events (each once).
pub(super) struct Readable {
    queue: std::collections::VecDeque<usize>,
    queued: Vec<bool>,
}

impl Readable {
    pub(super) fn new(n: usize) -> Self {
        Self {
            queue: std::collections::VecDeque::with_capacity(n),
            queued: vec![false; n],
        }
    }

    pub(super) fn take_events(&mut self, n: &mut RdsNode, index: &HashMap<u32, usize>) {
        while let Some(ev) = n.engine_mut().poll_event() {
            if !ev.ready.readable() {
                continue;
            }
            if let Some(&k) = index.get(&ev.sock.index())
                && !self.queued[k]
            {
                self.queued[k] = true;
                self.queue.push_back(k);
            }
        }
    }

    pub(super) fn next(&mut self) -> Option<usize> {
        let k = self.queue.pop_front()?;
        self.queued[k] = false;
        Some(k)
    }
}
