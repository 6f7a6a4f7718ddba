//! `kind = "forwarder"` (ring to ring) and `kind = "fanout"` (one ring to several).

use std::sync::Arc;

use super::env::{Stage, StageIo, push_pending};
use crate::config::{FanoutDef, OnFull};
use crate::link::{Rx, Tx};
use crate::msg::Msg;
use crate::payload::Payloads;
use crate::stats::StageStats;

fn bytes(msgs: &[Msg]) -> u64 {
    msgs.iter().map(|m| u64::from(m.len)).sum()
}

/// Moves messages from its input to its output, a burst at a time. A full output holds the
/// rest of the burst back (lossless).
pub struct Forwarder {
    stats: Arc<StageStats>,
    rx: Rx,
    tx: Tx,
    buf: Vec<Msg>,
    pending: Vec<Msg>,
    finished: bool,
}

impl std::fmt::Debug for Forwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forwarder")
            .field("stage", &self.stats.name)
            .finish_non_exhaustive()
    }
}

impl Forwarder {
    /// A forwarder from `rx` to `tx`.
    pub fn new(rx: Rx, tx: Tx, burst: usize, stats: Arc<StageStats>) -> Self {
        Self {
            stats,
            rx,
            tx,
            buf: vec![Msg::default(); burst],
            pending: Vec::with_capacity(burst),
            finished: false,
        }
    }
}

impl Stage for Forwarder {
    fn poll(&mut self, _io: &StageIo) -> usize {
        if self.finished {
            return 0;
        }
        let c = &self.stats.counters;
        if !self.pending.is_empty() {
            let before = bytes(&self.pending);
            let n = push_pending(&mut self.tx, &mut self.pending);
            c.out_msgs.add(n as u64);
            c.out_bytes.add(before - bytes(&self.pending));
            if !self.pending.is_empty() {
                c.backpressure.add(1);
            }
            return n;
        }
        let n = self.rx.recv_burst(&mut self.buf);
        if n == 0 {
            if self.rx.at_eof() {
                self.tx.close();
                self.finished = true;
                self.stats.set_finished();
                return 1;
            }
            return 0;
        }
        let got = &self.buf[..n];
        c.in_msgs.add(n as u64);
        c.in_bytes.add(bytes(got));
        let sent = self.tx.send_burst(got);
        c.out_msgs.add(sent as u64);
        c.out_bytes.add(bytes(&got[..sent]));
        if sent < n {
            self.pending.extend_from_slice(&got[sent..]);
            c.backpressure.add(1);
        }
        n
    }

    fn is_finished(&self) -> bool {
        self.finished
    }
}

/// Copies every message to each of its outputs. The first output gets the original; the
/// others get copies whose pool payloads are copied into new objects of the same pool (DPDK's
/// `rte_pktmbuf_copy`), so every copy can be consumed and freed on its own.
///
/// With `on_full = "wait"` a full output holds back the whole fanout (every consumer sees
/// every message); with `"drop"` the copies a full output cannot take are dropped and
/// counted.
pub struct Fanout {
    stats: Arc<StageStats>,
    rx: Rx,
    outs: Vec<Tx>,
    pending: Vec<Vec<Msg>>,
    on_full: OnFull,
    payloads: Payloads,
    buf: Vec<Msg>,
    finished: bool,
}

impl std::fmt::Debug for Fanout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fanout")
            .field("stage", &self.stats.name)
            .field("outputs", &self.outs.len())
            .finish_non_exhaustive()
    }
}

impl Fanout {
    /// A fanout from `rx` to `outs`.
    pub fn new(
        rx: Rx,
        outs: Vec<Tx>,
        def: &FanoutDef,
        payloads: Payloads,
        stats: Arc<StageStats>,
    ) -> Self {
        let n = outs.len();
        Self {
            stats,
            rx,
            outs,
            pending: (0..n).map(|_| Vec::with_capacity(def.burst)).collect(),
            on_full: def.on_full,
            payloads,
            buf: vec![Msg::default(); def.burst],
            finished: false,
        }
    }

    /// Pushes every output's pending messages; returns (moved, whether any remain).
    fn flush(&mut self) -> (usize, bool) {
        let c = &self.stats.counters;
        let mut moved = 0;
        let mut left = false;
        for (tx, p) in self.outs.iter_mut().zip(&mut self.pending) {
            if p.is_empty() {
                continue;
            }
            let before = bytes(p);
            let n = push_pending(tx, p);
            c.out_msgs.add(n as u64);
            c.out_bytes.add(before - bytes(p));
            moved += n;
            if !p.is_empty() {
                if self.on_full == OnFull::Drop {
                    for m in p.iter() {
                        // SAFETY: pending descriptors were never enqueued: this stage owns
                        // their objects, and drops them here.
                        unsafe { self.payloads.free(m) };
                    }
                    c.dropped.add(p.len() as u64);
                    p.clear();
                } else {
                    left = true;
                }
            }
        }
        (moved, left)
    }
}

impl Stage for Fanout {
    fn poll(&mut self, _io: &StageIo) -> usize {
        if self.finished {
            return 0;
        }
        let (moved, left) = self.flush();
        if left {
            self.stats.counters.backpressure.add(1);
            return moved;
        }
        let n = self.rx.recv_burst(&mut self.buf);
        if n == 0 {
            if self.rx.at_eof() {
                for tx in &mut self.outs {
                    tx.close();
                }
                self.finished = true;
                self.stats.set_finished();
                return moved + 1;
            }
            return moved;
        }
        let c = &self.stats.counters;
        c.in_msgs.add(n as u64);
        c.in_bytes.add(bytes(&self.buf[..n]));
        // Copies first (from the originals, which are still ours), originals last.
        for i in 1..self.outs.len() {
            for k in 0..n {
                let m = self.buf[k];
                // SAFETY: `m` was dequeued by this stage and not passed on yet: this stage
                // owns its payload object; the copy gets a fresh object.
                match unsafe { self.payloads.duplicate(&m) } {
                    Ok(copy) => self.pending[i].push(copy),
                    Err(_) => {
                        self.stats.counters.pool_empty.add(1);
                        self.stats.counters.dropped.add(1);
                    }
                }
            }
        }
        self.pending[0].extend_from_slice(&self.buf[..n]);
        let (more, _) = self.flush();
        n + moved + more
    }

    fn is_finished(&self) -> bool {
        self.finished
    }
}
