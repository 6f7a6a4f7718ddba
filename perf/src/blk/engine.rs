//! One fio-style job: keep `iodepth` IOs in flight against a [`Target`] from one thread,
//! busy-polling its completions, for `--runtime` or for `--size` bytes, recording each IO's
//! completion latency; with `--verify`, write patterns and check what comes back.

use hdrhistogram::Histogram;
use mempool::memory::Region;

use super::spec::{Offsets, RwMode};
use super::verify::{self, BlockLog, Mismatch};
use crate::harness::Timer;

/// A read or a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Read into the slot's buffer.
    Read,
    /// Write the slot's buffer.
    Write,
}

/// A completed IO: its tag and 0 or a negative errno.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Done {
    /// The tag given to [`Target::submit`].
    pub tag: u64,
    /// 0, or `-errno`.
    pub result: i32,
}

/// The device as a job sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TargetGeometry {
    /// Bytes.
    pub bytes: u64,
    /// Offsets and lengths must be multiples of this.
    pub block: u32,
    /// Largest IO.
    pub max_io: u32,
}

/// The no-free-slot answer of [`Target::submit`]: try again after a poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Busy;

/// What a job drives: a local backend or a remote device. IO buffers live in
/// [`buffers`](Target::buffers), `bs` bytes per slot, slot `i` at `i * bs`.
pub trait Target {
    /// The device.
    fn geometry(&self) -> TargetGeometry;
    /// The IO buffers (registered memory for a remote device).
    fn buffers(&self) -> &Region;
    /// Starts `op` of `len` bytes at `offset` with the buffer of `slot`.
    ///
    /// # Errors
    /// [`Busy`] when the target takes no more IOs now (nothing was started).
    fn submit(&mut self, op: Op, offset: u64, len: u32, slot: u32, tag: u64) -> Result<(), Busy>;
    /// Collects completions into `out`; returns how many.
    fn poll(&mut self, out: &mut [Done]) -> usize;
}

/// One job's parameters.
#[derive(Clone, Debug)]
pub struct JobSpec {
    /// fio's `--name` (with the job number appended when there are several).
    pub name: String,
    /// Pattern.
    pub rw: RwMode,
    /// Block size.
    pub bs: u32,
    /// IOs in flight.
    pub iodepth: u32,
    /// First byte of the job's range.
    pub base: u64,
    /// Bytes of the job's range.
    pub size: u64,
    /// Nanoseconds to run (wrapping over the range, fio's `time_based`); `None`: one pass
    /// over `size` bytes.
    pub runtime_ns: Option<u64>,
    /// Percent of reads in `randrw`.
    pub rwmixread: u32,
    /// Write patterns and check reads.
    pub verify: bool,
    /// Nap after 64 empty polls instead of spinning (`--nap`).
    pub nap: bool,
    /// Seed of the random offsets.
    pub seed: u64,
}

/// Results of one direction.
#[derive(Clone, Debug)]
pub struct DirStats {
    /// IOs completed successfully.
    pub ios: u64,
    /// Bytes of those.
    pub bytes: u64,
    /// IOs that completed with an error.
    pub errors: u64,
    /// The first error's errno.
    pub first_errno: Option<i32>,
    /// Completion latency, nanoseconds (submit to completion seen).
    pub clat: Histogram<u64>,
}

impl DirStats {
    fn new() -> Self {
        Self {
            ios: 0,
            bytes: 0,
            errors: 0,
            first_errno: None,
            // 3 significant digits, 1 ns to 100 s.
            clat: Histogram::new_with_bounds(1, 100_000_000_000, 3)
                .expect("static bounds are valid"),
        }
    }
}

/// What `--verify` found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VerifyStats {
    /// Blocks whose content was checked.
    pub checked: u64,
    /// Blocks that did not match.
    pub mismatches: u64,
    /// The first mismatch.
    pub first: Option<Mismatch>,
}

/// One job's results.
#[derive(Clone, Debug)]
pub struct JobResult {
    /// The job's parameters.
    pub spec: JobSpec,
    /// Reads.
    pub read: DirStats,
    /// Writes.
    pub write: DirStats,
    /// Nanoseconds of the measured phase.
    pub runtime_ns: u64,
    /// `--verify` results.
    pub verify: Option<VerifyStats>,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    op: Op,
    block: u64,
    generation: u32,
    start: u64,
    measured: bool,
}

/// What the loop is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Writing the pattern over the range before a verified read job.
    Prefill,
    /// Reading back every written block after a verified write job.
    ReadBack,
}

/// The job's state between IOs.
struct Job<'a, T: Target> {
    spec: &'a JobSpec,
    t: &'a mut T,
    timer: Timer,
    offs: Offsets,
    log: Option<BlockLog>,
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
    read: DirStats,
    write: DirStats,
    verify: VerifyStats,
    buf: Vec<u8>,
    scratch: Vec<u8>,
}

/// Runs one job to its end.
///
/// # Errors
/// A message if the job's geometry does not fit the device (which the caller checks first,
/// so this is a programming error surfacing) or if the target stops completing IOs.
pub fn run<T: Target>(spec: &JobSpec, t: &mut T) -> Result<JobResult, String> {
    let g = t.geometry();
    let bs = u64::from(spec.bs);
    if spec.bs == 0 || !bs.is_multiple_of(u64::from(g.block)) || spec.bs > g.max_io {
        return Err(format!(
            "--bs {} must be a multiple of the device's block size {} and at most {}",
            spec.bs, g.block, g.max_io
        ));
    }
    if spec.base + spec.size > g.bytes || spec.size < bs {
        return Err(format!(
            "the job's range [{}, {}) does not fit the device's {} bytes",
            spec.base,
            spec.base + spec.size,
            g.bytes
        ));
    }
    let offs = Offsets::new(spec.base, spec.size, bs, spec.rw.random(), spec.seed);
    let blocks = offs.blocks();
    let depth = spec.iodepth as usize;
    let mut job = Job {
        spec,
        t,
        timer: Timer::new(),
        log: spec.verify.then(|| BlockLog::new(blocks)),
        offs,
        slots: vec![None; depth],
        free: (0..spec.iodepth).rev().collect(),
        read: DirStats::new(),
        write: DirStats::new(),
        verify: VerifyStats::default(),
        buf: vec![0; spec.bs as usize],
        scratch: vec![0; spec.bs as usize],
    };
    if spec.verify && !spec.rw.writes() {
        job.sweep(Phase::Prefill)?;
    }
    let start = job.timer.now_ns();
    job.workload()?;
    let runtime_ns = job.timer.now_ns() - start;
    if spec.verify && spec.rw.writes() {
        job.sweep(Phase::ReadBack)?;
    }
    Ok(JobResult {
        spec: spec.clone(),
        read: job.read,
        write: job.write,
        runtime_ns: runtime_ns.max(1),
        verify: spec.verify.then_some(job.verify),
    })
}

/// How long the loop waits for a completion before it declares the target stuck.
const STALL_NS: u64 = 30_000_000_000;
/// The pause of `--nap` when a poll found nothing.
const NAP: std::time::Duration = std::time::Duration::from_micros(20);

impl<T: Target> Job<'_, T> {
    /// The measured phase.
    fn workload(&mut self) -> Result<(), String> {
        let bs = u64::from(self.spec.bs);
        let deadline = self.spec.runtime_ns.map(|r| self.timer.now_ns() + r);
        let mut to_issue = if deadline.is_some() {
            u64::MAX
        } else {
            self.spec.size / bs
        };
        let mut done = [Done::default(); 64];
        let mut spins = 0u32;
        let mut last_progress = self.timer.now_ns();
        loop {
            while to_issue > 0 && !self.free.is_empty() {
                let op = self.pick_op();
                let Some(block) = self.pick_block(op) else {
                    break;
                };
                if !self.issue(op, block, true)? {
                    break;
                }
                to_issue -= 1;
            }
            let n = self.t.poll(&mut done);
            for d in &done[..n] {
                self.complete(*d);
            }
            let in_flight = self.slots.len() - self.free.len();
            if n > 0 {
                spins = 0;
            } else {
                spins += 1;
            }
            // Reading the clock costs ~10 ns: look at it after every batch of completions
            // and every 64 empty polls.
            if n > 0 || spins.is_multiple_of(64) {
                if n == 0 && self.spec.nap {
                    std::thread::sleep(NAP);
                }
                let now = self.timer.now_ns();
                if n > 0 {
                    last_progress = now;
                } else if in_flight > 0 && now - last_progress > STALL_NS {
                    return Err(format!(
                        "the target completed nothing for 30 s with {in_flight} IOs in flight"
                    ));
                }
                if deadline.is_some_and(|d| now >= d) {
                    to_issue = 0;
                }
            }
            if to_issue == 0 && in_flight == 0 {
                return Ok(());
            }
        }
    }

    /// Writes the whole range once (prefill) or reads back every written block.
    fn sweep(&mut self, phase: Phase) -> Result<(), String> {
        let blocks: Vec<(u64, Op)> = match phase {
            Phase::Prefill => (0..self.offs.blocks()).map(|b| (b, Op::Write)).collect(),
            _ => self.log.as_ref().map_or_else(Vec::new, |l| {
                l.written().map(|(b, _)| (b, Op::Read)).collect()
            }),
        };
        let mut it = blocks.into_iter().peekable();
        let mut done = [Done::default(); 64];
        let mut last_progress = self.timer.now_ns();
        loop {
            while !self.free.is_empty() {
                let Some(&(b, op)) = it.peek() else { break };
                if !self.issue(op, b, false)? {
                    break;
                }
                it.next();
            }
            let n = self.t.poll(&mut done);
            for d in &done[..n] {
                self.complete(*d);
            }
            let in_flight = self.slots.len() - self.free.len();
            if it.peek().is_none() && in_flight == 0 {
                return Ok(());
            }
            if n == 0 && self.spec.nap {
                std::thread::sleep(NAP);
            }
            let now = self.timer.now_ns();
            if n > 0 {
                last_progress = now;
            } else if now - last_progress > STALL_NS {
                return Err(format!(
                    "the target completed nothing for 30 s with {in_flight} IOs in flight"
                ));
            }
        }
    }

    fn pick_op(&mut self) -> Op {
        match self.spec.rw {
            RwMode::Read | RwMode::RandRead => Op::Read,
            RwMode::Write | RwMode::RandWrite => Op::Write,
            RwMode::RandRw => {
                if (self.offs.rand() % 100) < u64::from(self.spec.rwmixread) {
                    Op::Read
                } else {
                    Op::Write
                }
            }
        }
    }

    /// The next block; with `--verify`, one `op` may start on now (a read: no write in
    /// flight; a write: no IO in flight, see [`BlockLog`]), a few tries, then none this
    /// round.
    fn pick_block(&mut self, op: Op) -> Option<u64> {
        for _ in 0..8 {
            let b = self.offs.next_block();
            if self
                .log
                .as_ref()
                .is_none_or(|l| !l.blocked(b, op == Op::Write))
            {
                return Some(b);
            }
        }
        None
    }

    /// Starts one IO; `false` if the target was busy (nothing started).
    fn issue(&mut self, op: Op, block: u64, measured: bool) -> Result<bool, String> {
        let Some(slot) = self.free.pop() else {
            return Ok(false);
        };
        let off = self.offs.offset(block);
        let bs = self.spec.bs as usize;
        let mut generation = 0;
        if let Some(log) = self.log.as_mut() {
            if op == Op::Write {
                generation = log.begin_write(block);
                verify::fill(&mut self.buf, off, generation);
                self.t.buffers().copy_in(slot as usize * bs, &self.buf);
            } else {
                log.begin_read(block);
            }
        }
        let start = self.timer.now_ns();
        if self
            .t
            .submit(op, off, self.spec.bs, slot, u64::from(slot))
            .is_err()
        {
            if let Some(log) = self.log.as_mut() {
                if op == Op::Write {
                    // Not started: the block keeps what it had.
                    let keep = log.expect(block);
                    log.end_write(block, keep, keep != 0);
                } else {
                    log.end_read(block);
                }
            }
            self.free.push(slot);
            return Ok(false);
        }
        self.slots[slot as usize] = Some(Slot {
            op,
            block,
            generation,
            start,
            measured,
        });
        Ok(true)
    }

    fn complete(&mut self, d: Done) {
        let end = self.timer.now_ns();
        let Some(s) = self.slots.get_mut(d.tag as usize).and_then(Option::take) else {
            // A completion for a slot with no IO: the target broke its contract.
            let st = &mut self.read;
            st.errors += 1;
            st.first_errno.get_or_insert(libc::EPROTO);
            return;
        };
        self.free.push(d.tag as u32);
        let ok = d.result == 0;
        if s.measured {
            let st = if s.op == Op::Read {
                &mut self.read
            } else {
                &mut self.write
            };
            if ok {
                st.ios += 1;
                st.bytes += u64::from(self.spec.bs);
                let _ = st.clat.record((end - s.start).max(1));
            } else {
                st.errors += 1;
                st.first_errno.get_or_insert(-d.result);
            }
        } else if !ok {
            let st = if s.op == Op::Read {
                &mut self.read
            } else {
                &mut self.write
            };
            st.errors += 1;
            st.first_errno.get_or_insert(-d.result);
        }
        let Some(log) = self.log.as_mut() else { return };
        if s.op == Op::Read {
            log.end_read(s.block);
        }
        match s.op {
            Op::Write => log.end_write(s.block, s.generation, ok),
            Op::Read if ok => {
                let want = log.expect(s.block);
                if want == 0 {
                    return;
                }
                let bs = self.spec.bs as usize;
                self.t
                    .buffers()
                    .copy_out(d.tag as usize * bs, &mut self.buf);
                let off = self.offs.offset(s.block);
                self.verify.checked += 1;
                if let Err(m) = verify::check(&self.buf, off, want, &mut self.scratch) {
                    self.verify.mismatches += 1;
                    self.verify.first.get_or_insert(m);
                }
            }
            Op::Read => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use mempool::memory::RegionConfig;

    use super::*;

    /// A RAM device that serves a read when it is submitted but completes it only two polls
    /// later, after writes submitted since (which complete at the next poll): what two paths
    /// or an out-of-order server look like to a job.
    struct LateReads {
        bufs: Region,
        disk: Vec<u8>,
        bs: usize,
        writes: Vec<Done>,
        reads: Vec<(Done, u32, Vec<u8>, u32)>,
    }

    impl Target for LateReads {
        fn geometry(&self) -> TargetGeometry {
            TargetGeometry {
                bytes: self.disk.len() as u64,
                block: 512,
                max_io: self.bs as u32,
            }
        }
        fn buffers(&self) -> &Region {
            &self.bufs
        }
        fn submit(&mut self, op: Op, off: u64, len: u32, slot: u32, tag: u64) -> Result<(), Busy> {
            let (off, len, at) = (off as usize, len as usize, slot as usize * self.bs);
            let done = Done { tag, result: 0 };
            match op {
                Op::Write => {
                    self.bufs.copy_out(at, &mut self.disk[off..off + len]);
                    self.writes.push(done);
                }
                Op::Read => {
                    let snap = self.disk[off..off + len].to_vec();
                    self.reads.push((done, slot, snap, 0));
                }
            }
            Ok(())
        }
        fn poll(&mut self, out: &mut [Done]) -> usize {
            let mut n = 0;
            for d in self.writes.drain(..) {
                out[n] = d;
                n += 1;
            }
            let mut k = 0;
            while k < self.reads.len() {
                self.reads[k].3 += 1;
                if self.reads[k].3 > 2 && n < out.len() {
                    let (d, slot, snap, _) = self.reads.swap_remove(k);
                    self.bufs.copy_in(slot as usize * self.bs, &snap);
                    out[n] = d;
                    n += 1;
                } else {
                    k += 1;
                }
            }
            n
        }
    }

    #[test]
    fn test_verify_write_waits_for_reads_of_its_block() {
        let (bs, depth) = (4096usize, 8u32);
        let bufs = Region::new(&RegionConfig::new("late-reads", bs * depth as usize).quiet())
            .expect("buffers");
        let mut t = LateReads {
            bufs,
            disk: vec![0; bs * 4],
            bs,
            writes: Vec::new(),
            reads: Vec::new(),
        };
        let spec = JobSpec {
            name: "late-reads".into(),
            rw: RwMode::RandRw,
            bs: bs as u32,
            iodepth: depth,
            base: 0,
            size: (bs * 4) as u64,
            runtime_ns: Some(20_000_000),
            rwmixread: 50,
            verify: true,
            nap: false,
            seed: 7,
        };
        let r = run(&spec, &mut t).expect("the job runs");
        let v = r.verify.expect("verify on");
        assert!(r.read.ios > 100 && r.write.ios > 100, "both directions ran");
        assert!(v.checked > 100, "reads were checked: {}", v.checked);
        assert_eq!(
            v.mismatches, 0,
            "a correct device reported stale: {:?}",
            v.first
        );
    }
}
