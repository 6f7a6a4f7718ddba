//! `kind = "sink"`: the end of a pipeline. Counts messages and bytes, tracks sequence numbers
//! per flow (gaps are lost messages, repeats are duplicates or reordering), checks payloads
//! against their pattern, records end-to-end latency (now minus the generation stamp) in an
//! HDR histogram, and returns pool payloads to their pool.

use std::sync::Arc;

use super::env::{Stage, StageIo, Terminus, stamp_now};
use crate::config::SinkDef;
use crate::link::Rx;
use crate::msg::Msg;
use crate::payload::Payloads;
use crate::stats::StageStats;

/// `kind = "sink"`: counts, checks and times the messages of its input ring, and frees their
/// payloads.
pub struct Sink {
    rx: Rx,
    term: Terminus,
    payloads: Payloads,
    buf: Vec<Msg>,
    finished: bool,
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink")
            .field("stage", &self.term.stats.name)
            .finish_non_exhaustive()
    }
}

impl Sink {
    /// A sink reading `rx`.
    pub fn new(rx: Rx, def: &SinkDef, payloads: Payloads, stats: Arc<StageStats>) -> Self {
        Self {
            rx,
            term: Terminus::new(stats, def.verify),
            payloads,
            buf: vec![Msg::default(); def.burst],
            finished: false,
        }
    }
}

impl Stage for Sink {
    fn poll(&mut self, _io: &StageIo) -> usize {
        if self.finished {
            return 0;
        }
        let n = self.rx.recv_burst(&mut self.buf);
        if n == 0 {
            if self.rx.at_eof() {
                self.finished = true;
                self.term.stats.set_finished();
                return 1;
            }
            return 0;
        }
        let now = stamp_now();
        let mut bytes = 0u64;
        for m in &self.buf[..n] {
            bytes += u64::from(m.len);
            if m.pool != 0 {
                // SAFETY: the sink dequeued `m`, so it holds the only descriptor of its
                // payload; it reads it, then frees it, and drops the descriptor.
                unsafe {
                    self.term.see(m, now, Some(self.payloads.bytes(m)));
                    self.payloads.free(m);
                }
            } else {
                self.term.see(m, now, None);
            }
        }
        let c = &self.term.stats.counters;
        c.in_msgs.add(n as u64);
        c.in_bytes.add(bytes);
        self.term.publish(now);
        n
    }

    fn is_finished(&self) -> bool {
        self.finished
    }
}
