//! `kind = "generator"`: a traffic source, at a fixed rate or as fast as the output takes.
//!
//! Each poll builds at most one burst: sequence numbers continue per flow, every message of
//! the burst gets the same `CLOCK_MONOTONIC` stamp (one clock read per burst), sizes cycle
//! through the configured list, and with a pool each message gets an object holding its
//! payload. At a fixed rate, the burst is what the rate allows since the start, capped at
//! `burst`; a generator that fell behind (a preempted lcore) catches up by at most 10 ms
//! worth rather than flooding its output. Generators start once every rsocket client of the
//! process is connected ([`StageIo::links_up`]), so set-up time is not counted as latency.

use std::sync::Arc;

use mempool::pool::ObjId;

use super::env::{Stage, StageIo, push_pending, stamp_now};
use crate::config::{GeneratorDef, OnFull};
use crate::link::Tx;
use crate::msg::{Msg, Pattern};
use crate::payload::{self, Payloads, TickSource};
use crate::stats::StageStats;

/// `kind = "generator"`: a traffic source at a fixed rate or as fast as its output takes,
/// with sizes used in turn, a payload pattern and optionally pool payloads.
pub struct Generator {
    stats: Arc<StageStats>,
    tx: Tx,
    flow: u16,
    pattern: Pattern,
    sizes: Vec<u32>,
    next_size: usize,
    rate: Option<u64>,
    burst: usize,
    count: Option<u64>,
    on_full: OnFull,
    pool: u8,
    payloads: Payloads,
    ticks: Option<TickSource>,
    seq: u64,
    /// Rate accounting: loop time of the first poll, and messages accounted since.
    start: Option<lcore::time::Instant>,
    emitted: u64,
    buf: Vec<Msg>,
    ids: Vec<ObjId>,
    pending: Vec<Msg>,
    finished: bool,
}

impl std::fmt::Debug for Generator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generator")
            .field("stage", &self.stats.name)
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

impl Generator {
    /// A generator of flow `flow` writing `tx`; `pool` is the pool byte (0: no payloads).
    pub fn new(
        def: &GeneratorDef,
        flow: u16,
        pool: u8,
        tx: Tx,
        payloads: Payloads,
        stats: Arc<StageStats>,
    ) -> Self {
        Self {
            stats,
            tx,
            flow,
            pattern: def.pattern,
            sizes: def.sizes.clone(),
            next_size: 0,
            rate: def.rate,
            burst: def.burst,
            count: def.count,
            on_full: def.on_full,
            pool,
            payloads,
            ticks: (def.pattern == Pattern::Ticks)
                .then(|| TickSource::new(def.symbols, u64::from(flow) + 1)),
            seq: 0,
            start: None,
            emitted: 0,
            buf: Vec::with_capacity(def.burst),
            ids: vec![ObjId::default(); def.burst],
            pending: Vec::with_capacity(def.burst),
            finished: false,
        }
    }

    /// How many messages to build now.
    fn budget(&mut self, io: &StageIo) -> usize {
        let mut want = self.burst as u64;
        if let Some(rate) = self.rate {
            let start = *self.start.get_or_insert(io.now);
            let elapsed = io.now.nanos_since(start);
            let allowed = (u128::from(rate) * u128::from(elapsed) / 1_000_000_000) as u64;
            // Catch up by at most 10 ms of traffic (and at least one burst): a preempted
            // lcore recovers its rate, a stalled one does not flood its output afterwards.
            let cap = (rate / 100).max(self.burst as u64);
            if allowed.saturating_sub(self.emitted) > cap {
                self.emitted = allowed - cap;
            }
            want = want.min(allowed.saturating_sub(self.emitted));
        }
        if let Some(count) = self.count {
            want = want.min(count - self.seq);
        }
        want as usize
    }

    /// Builds `n` messages into `self.buf`; false if the pool had no objects.
    fn build(&mut self, n: usize) -> bool {
        if self.pool != 0 && self.payloads.alloc(self.pool, &mut self.ids[..n]).is_err() {
            self.stats.counters.pool_empty.add(1);
            return false;
        }
        let stamp = stamp_now();
        self.buf.clear();
        for i in 0..n {
            let len = self.sizes[self.next_size];
            self.next_size = (self.next_size + 1) % self.sizes.len();
            let (aux, word) = match &mut self.ticks {
                Some(t) => t.next_tick(),
                None => (0, 0),
            };
            let m = Msg {
                seq: self.seq,
                stamp,
                word,
                len,
                aux,
                flow: self.flow,
                pattern: self.pattern,
                pool: self.pool,
                obj: self.ids[i],
            };
            self.seq += 1;
            if m.pool != 0 {
                // SAFETY: `m.obj` was just allocated from pool `m.pool` and only `m` names it.
                payload::fill(m.pattern, m.flow, m.seq, unsafe {
                    self.payloads.bytes_mut(&m)
                });
            }
            self.buf.push(m);
        }
        true
    }

    /// Drops `self.buf[start..]` (never enqueued); returns how many.
    fn drop_msgs(&mut self, start: usize) -> u64 {
        for m in &self.buf[start..] {
            // SAFETY: these descriptors were never enqueued, so this stage still owns their
            // objects, and they are discarded right after.
            unsafe { self.payloads.free(m) };
        }
        (self.buf.len() - start) as u64
    }

    fn finish(&mut self) {
        self.tx.close();
        self.finished = true;
        self.stats.set_finished();
    }
}

impl Stage for Generator {
    fn poll(&mut self, io: &StageIo) -> usize {
        if self.finished {
            return 0;
        }
        let c = &self.stats.counters;
        let mut work = 0;
        if !self.pending.is_empty() {
            let bytes: u64 = self.pending.iter().map(|m| u64::from(m.len)).sum();
            let n = push_pending(&mut self.tx, &mut self.pending);
            let sent_bytes = bytes - self.pending.iter().map(|m| u64::from(m.len)).sum::<u64>();
            c.out_msgs.add(n as u64);
            c.out_bytes.add(sent_bytes);
            work += n;
            if !self.pending.is_empty() {
                // Also while stopping: these messages exist, so they are delivered (the
                // drain timeout bounds the wait).
                c.backpressure.add(1);
                return work;
            }
        }
        if io.quiesce || self.count.is_some_and(|n| self.seq >= n) {
            self.finish();
            return work + 1;
        }
        if !io.links_up {
            return work;
        }
        let want = self.budget(io);
        if want == 0 || !self.build(want) {
            return work;
        }
        self.emitted += want as u64;
        let n = self.tx.send_burst(&self.buf);
        let sent_bytes: u64 = self.buf[..n].iter().map(|m| u64::from(m.len)).sum();
        let c = &self.stats.counters;
        c.out_msgs.add(n as u64);
        c.out_bytes.add(sent_bytes);
        if n < want {
            match self.on_full {
                OnFull::Drop => {
                    let d = self.drop_msgs(n);
                    self.stats.counters.dropped.add(d);
                }
                OnFull::Wait => {
                    self.pending.extend_from_slice(&self.buf[n..]);
                    self.stats.counters.backpressure.add(1);
                }
            }
        }
        work + want
    }

    fn is_finished(&self) -> bool {
        self.finished
    }
}
