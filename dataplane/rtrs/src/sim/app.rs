//! The two applications of the simulator: a client workload that keeps IOs in flight and
//! checks every byte that comes back ([`App`]), and a server handler that is a small disk
//! ([`Handler`]).
//!
//! Each IO of permit `p` addresses block `p` (no two IOs in flight share a block) and
//! carries a 16-byte user message `(seq, block)`; a WRITE's data is `pattern(seq)`. The
//! handler checks every WRITE's data against the pattern of its sequence number and stores
//! the number (when the request arrives, so a late answer of a dead path changes nothing);
//! a READ returns `pattern(stored seq)`, which the client checks against the last write it
//! saw complete for that block. A write that failed leaves its block unknown until the next
//! successful write.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use crate::clt::{ClientSession, DataRef, Request};
use crate::error::{IoError, RtrsError};
use crate::permit::{ConType, Permit, Wait};
use crate::srv::{OpId, Server, SessId};
use crate::timer::{Instant, Jitter};
use crate::work::{Dir, SrcRef};

use super::net::{ClientSide, Net, ServerSide};

/// Position-dependent filler shared by every IO's data (built once).
fn base() -> &'static [u8] {
    static BASE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BASE.get_or_init(|| {
        let mut j = Jitter::new(0xBA5E);
        (0..BASE_LEN / 8)
            .flat_map(|_| j.below(u64::MAX).to_le_bytes())
            .collect()
    })
}

/// The longest data the pattern covers.
pub const BASE_LEN: usize = 1 << 20;

/// The byte at `i` of the `n`-byte data of IO `seq`: the shared filler, with `seq` in the
/// first 8 bytes and `!seq` in the last 8 (so data of another IO, at another offset, cut
/// short or stale all differ).
pub fn pattern(seq: u64, n: usize, i: usize) -> u8 {
    if i < 8 {
        seq.to_le_bytes()[i]
    } else if n >= 16 && i >= n - 8 {
        (!seq).to_le_bytes()[i - (n - 8)]
    } else {
        base()[i % BASE_LEN]
    }
}

/// Fills `buf` with the data of IO `seq`.
pub fn fill_pattern(seq: u64, buf: &mut [u8]) {
    let n = buf.len().min(BASE_LEN);
    buf[..n].copy_from_slice(&base()[..n]);
    let k = n.min(8);
    buf[..k].copy_from_slice(&seq.to_le_bytes()[..k]);
    if n >= 16 {
        buf[n - 8..n].copy_from_slice(&(!seq).to_le_bytes());
    }
}

/// True if `buf` holds the data of IO `seq`.
pub fn check_pattern(seq: u64, buf: &[u8]) -> bool {
    let n = buf.len();
    if n > BASE_LEN {
        return false;
    }
    let k = n.min(8);
    if buf[..k] != seq.to_le_bytes()[..k] {
        return false;
    }
    if n >= 16 {
        buf[8..n - 8] == base()[8..n - 8] && buf[n - 8..] == (!seq).to_le_bytes()
    } else {
        buf[k..] == base()[k..n]
    }
}

/// Bytes of the user message the workload sends (Linux RNBD sends 32).
pub const USR_LEN: usize = 16;

#[derive(Debug)]
struct Rec {
    permit: Permit,
    seq: u64,
    dir: Dir,
    block: u64,
    at: Instant,
}

/// The client workload (see the module doc).
#[derive(Debug)]
pub struct App {
    /// IOs to keep in flight (0: idle).
    pub target: usize,
    /// Bytes per IO.
    pub io_size: u32,
    /// Percentage of READs.
    pub read_pct: u64,
    /// Stop issuing after this many IOs.
    pub limit: Option<u64>,
    /// At most one new IO per this interval (zero: as fast as permits come back), so long
    /// runs of virtual time stay cheap.
    pub interval: Duration,
    /// IOs issued.
    pub issued: u64,
    /// IOs completed successfully.
    pub ok: u64,
    /// IOs completed with an error.
    pub failed: u64,
    /// Requests refused at submission.
    pub submit_errors: u64,
    /// READ data that did not match the last write.
    pub verify_errors: u64,
    /// Completions for no IO in flight, or with another IO's cookie (each IO must complete
    /// exactly once).
    pub spurious: u64,
    /// The errors, in order.
    pub errors: Vec<(Instant, IoError)>,
    /// Completion latencies, nanoseconds.
    pub latencies: Vec<u64>,
    /// The last completion time.
    pub last_completion: Option<Instant>,
    /// Completions seen after each instant of interest (tests set a mark and count).
    pub completions_since_mark: u64,
    /// Record every completion in [`done`](App::done).
    pub track: bool,
    /// (time, sequence number) of every completion while `track` is on.
    pub done: Vec<(Instant, u64)>,
    next_at: Instant,
    inflight: HashMap<u16, Rec>,
    expected: HashMap<u64, Option<u64>>,
    next_seq: u64,
    rng: Jitter,
    data_per_slot: usize,
}

impl App {
    pub(crate) fn new(seed: u64, data_per_slot: usize) -> Self {
        Self {
            target: 0,
            io_size: 4096,
            read_pct: 50,
            limit: None,
            interval: Duration::ZERO,
            next_at: Instant::ZERO,
            issued: 0,
            ok: 0,
            failed: 0,
            submit_errors: 0,
            verify_errors: 0,
            spurious: 0,
            errors: Vec::new(),
            latencies: Vec::new(),
            last_completion: None,
            completions_since_mark: 0,
            track: false,
            done: Vec::new(),
            inflight: HashMap::new(),
            expected: HashMap::new(),
            next_seq: 1,
            rng: Jitter::new(seed ^ 0xA11),
            data_per_slot,
        }
    }

    /// IOs in flight.
    pub fn inflight(&self) -> usize {
        self.inflight.len()
    }

    /// The sequence number of the IO in flight through permit `id`.
    pub fn seq_of(&self, id: u16) -> Option<u64> {
        self.inflight.get(&id).map(|r| r.seq)
    }

    /// When the next IO may be issued, if one is wanted and a permit is free.
    pub(crate) fn next_due(&self, client: &ClientSession) -> Option<Instant> {
        let want = self.inflight.len() < self.target && self.limit.is_none_or(|l| self.issued < l);
        let free = client
            .permits()
            .is_some_and(|p| p.in_use() < u32::from(p.depth()));
        (want && free).then_some(self.next_at)
    }

    /// Issues IOs up to the target.
    pub(crate) fn submit(&mut self, now: Instant, client: &mut ClientSession, net: &mut Net) {
        while self.inflight.len() < self.target && self.limit.is_none_or(|l| self.issued < l) {
            if now < self.next_at {
                return;
            }
            let Some(permits) = client.permits().cloned() else {
                return;
            };
            let Some(permit) = permits.get(ConType::Io, self.rng.below(4) as u16, Wait::NoWait)
            else {
                return;
            };
            let seq = self.next_seq;
            self.next_seq += 1;
            let id = permit.id();
            let block = u64::from(id);
            let dir = if self.rng.below(100) < self.read_pct {
                Dir::Read
            } else {
                Dir::Write
            };
            let len = self.io_size.min(self.data_per_slot as u32);
            let off = usize::from(id) * self.data_per_slot;
            let buf = &mut net.data[off..off + len as usize];
            match dir {
                Dir::Write => fill_pattern(seq, buf),
                Dir::Read => buf.fill(0xEE),
            }
            let mut usr = [0u8; USR_LEN];
            usr[..8].copy_from_slice(&seq.to_le_bytes());
            usr[8..16].copy_from_slice(&block.to_le_bytes());
            let data = DataRef {
                region: 0,
                offset: off as u64,
                len,
            };
            let req = Request {
                dir,
                usr: &usr,
                data: Some(data),
                ctx: seq,
            };
            match client.request(now, &permit, req, &mut ClientSide(net)) {
                Ok(()) => {
                    self.issued += 1;
                    if !self.interval.is_zero() {
                        self.next_at = now.saturating_add(self.interval);
                    }
                    self.inflight.insert(
                        id,
                        Rec {
                            permit,
                            seq,
                            dir,
                            block,
                            at: now,
                        },
                    );
                }
                Err(e) => {
                    self.submit_errors += 1;
                    self.errors.push((now, e));
                    permits.put(permit);
                    // Try again after the interval (or a millisecond), not in a tight loop.
                    self.next_at = now.saturating_add(self.interval.max(Duration::from_millis(1)));
                    return;
                }
            }
        }
    }

    /// A completion.
    pub(crate) fn completed(
        &mut self,
        now: Instant,
        id: u16,
        ctx: u64,
        result: Result<(), IoError>,
        client: &ClientSession,
        net: &Net,
    ) {
        let Some(rec) = self.inflight.remove(&id) else {
            self.spurious += 1;
            return;
        };
        if rec.seq != ctx {
            self.spurious += 1;
        }
        self.last_completion = Some(now);
        self.completions_since_mark += 1;
        if self.track {
            self.done.push((now, rec.seq));
        }
        self.latencies.push(now.nanos_since(rec.at));
        match result {
            Ok(()) => {
                self.ok += 1;
                match rec.dir {
                    Dir::Write => {
                        self.expected.insert(rec.block, Some(rec.seq));
                    }
                    Dir::Read => {
                        if let Some(Some(want)) =
                            self.expected.get(&rec.block).copied().or(Some(Some(0)))
                        {
                            let len = self.io_size.min(self.data_per_slot as u32) as usize;
                            let off = usize::from(id) * self.data_per_slot;
                            let got = &net.data[off..off + len];
                            if !check_pattern(want, got) {
                                self.verify_errors += 1;
                            }
                        }
                    }
                }
            }
            Err(e) => {
                self.failed += 1;
                self.errors.push((now, e));
                if rec.dir == Dir::Write {
                    self.expected.insert(rec.block, None);
                }
            }
        }
        if let Some(p) = client.permits() {
            p.put(rec.permit);
        }
    }

    /// Returns every permit held (the session closed: nothing completes any more).
    pub fn abandon(&mut self, client: &ClientSession) {
        for (_, r) in self.inflight.drain() {
            if let Some(p) = client.permits() {
                p.put(r.permit);
            }
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Pending {
    due: Instant,
    op: OpId,
    sess: SessId,
    chunk: u16,
    dir: Dir,
    read_len: u32,
    block: u64,
    seq: u64,
}

/// The server handler: a disk of blocks (see the module doc).
#[derive(Debug, Default)]
pub struct Handler {
    /// How long the handler takes to answer.
    pub delay: Duration,
    /// Answer every request with this negative errno.
    pub fail_with: Option<i32>,
    /// Do not answer at all (requests stay with the handler).
    pub hold: bool,
    /// Answer READs from handler memory (source 0 of the net, one chunk-sized area per
    /// chunk) with `resp_rdma_from`, instead of filling the chunk.
    pub from_source: bool,
    /// Requests received.
    pub requests: u64,
    /// WRITE data that did not match its pattern, or user messages that made no sense.
    pub bad_requests: u64,
    /// Answers refused as stale (the path closed meanwhile and the id was reused).
    pub stale_answers: u64,
    /// Requests that arrived in a chunk while the handler still worked on another request
    /// (another client sequence number) in the same chunk of the session, on any path: the
    /// client reused a chunk the server had not finished with. (A failed-over copy of the
    /// same request is not counted: same bytes.)
    pub chunk_reuses: u64,
    /// The last write seen per block.
    pub disk: HashMap<u64, u64>,
    pending: VecDeque<Pending>,
}

impl Handler {
    pub(crate) fn next_due(&self) -> Option<Instant> {
        if self.hold {
            return None;
        }
        self.pending.iter().map(|p| p.due).min()
    }

    /// A request from the server.
    #[allow(clippy::too_many_arguments, reason = "the fields of one request event")]
    pub(crate) fn request(
        &mut self,
        now: Instant,
        op: OpId,
        sess: SessId,
        chunk: u16,
        dir: Dir,
        data_len: u32,
        usr_len: u16,
        read_len: u32,
        net: &Net,
    ) {
        self.requests += 1;
        let Some(c) = net.chunk(sess, chunk) else {
            self.bad_requests += 1;
            return;
        };
        let (d, u) = (data_len as usize, usize::from(usr_len));
        let (mut seq, mut block) = (0, u64::MAX);
        if u >= USR_LEN && d + u <= c.len() {
            seq = u64::from_le_bytes(c[d..d + 8].try_into().expect("8 bytes"));
            block = u64::from_le_bytes(c[d + 8..d + 16].try_into().expect("8 bytes"));
        } else {
            self.bad_requests += 1;
        }
        if self
            .pending
            .iter()
            .any(|p| p.sess == sess && p.chunk == chunk && p.seq != seq)
        {
            self.chunk_reuses += 1;
        }
        if dir == Dir::Write && block != u64::MAX {
            if !check_pattern(seq, &c[..d]) {
                self.bad_requests += 1;
            }
            self.disk.insert(block, seq);
        }
        self.pending.push_back(Pending {
            due: now.saturating_add(self.delay),
            op,
            sess,
            chunk,
            dir,
            read_len,
            block,
            seq,
        });
    }

    /// Answers what is due.
    pub(crate) fn answer_due(&mut self, now: Instant, server: &mut Server, net: &mut Net) {
        if self.hold {
            return;
        }
        // In due order, not arrival order: a change of `delay` makes later requests due
        // earlier (a slow server over some requests, fast over the next).
        while let Some(k) = self
            .pending
            .iter()
            .enumerate()
            .filter(|(_, p)| p.due <= now)
            .min_by_key(|(_, p)| p.due)
            .map(|(k, _)| k)
        {
            let p = self.pending.remove(k).expect("found above");
            let seq = self.disk.get(&p.block).copied().unwrap_or(0);
            if self.fail_with.is_none() && p.dir == Dir::Read && self.from_source {
                let cs = net.chunk_size() as usize;
                let at = usize::from(p.chunk) * cs;
                if net.sources.is_empty() {
                    net.sources.push(Vec::new());
                }
                let src = &mut net.sources[0];
                if src.len() < at + cs {
                    src.resize(at + cs, 0);
                }
                let n = (p.read_len as usize).min(cs);
                fill_pattern(seq, &mut src[at..at + n]);
                let from = SrcRef {
                    id: 0,
                    offset: at as u64,
                };
                match server.resp_rdma_from(now, p.op, from, &mut ServerSide(net)) {
                    Ok(_) => continue,
                    // A READ that moves no data: answered as any other.
                    Err(RtrsError::NotARead) => {}
                    Err(_) => {
                        self.stale_answers += 1;
                        continue;
                    }
                }
            }
            let status = match self.fail_with {
                Some(e) => e,
                None => {
                    if p.dir == Dir::Read
                        && let Some(c) = net.chunk_mut(p.sess, p.chunk)
                    {
                        let n = (p.read_len as usize).min(c.len());
                        fill_pattern(seq, &mut c[..n]);
                    }
                    0
                }
            };
            if server
                .resp_rdma(now, p.op, status, &mut ServerSide(net))
                .is_err()
            {
                self.stale_answers += 1;
            }
        }
    }

    /// Requests waiting for an answer.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}
