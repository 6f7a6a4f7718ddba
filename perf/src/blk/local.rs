//! A job's target on this host: an RNBD server backend driven directly, without a
//! transport (`--filename PATH`: a file or block device through `io_uring`, as fio's
//! `ioengine=io_uring` with `sqthread_poll`). It is the baseline a remote device is compared
//! with: the same backend, the same engine, no RNBD or RTRS in between.
#![allow(unsafe_code)]

use std::path::Path;

use dataplane::rnbd::backend::{Backend, BlkDone, BlkIo, BlkOp, UringBackend, UringConfig};
use mempool::memory::{Region, RegionConfig};

use super::engine::{Busy, Done, Op, Target, TargetGeometry};
use crate::PerfError;

/// A backend with the job's IO buffers.
pub struct LocalTarget<B> {
    backend: B,
    bufs: Region,
    bs: usize,
    done: Vec<BlkDone>,
}

impl LocalTarget<UringBackend> {
    /// Opens `path` for a job with `iodepth` buffers of `bs` bytes.
    ///
    /// # Errors
    /// Opening the file or the ring, or allocating the buffers.
    pub fn open(
        path: &Path,
        bs: u32,
        iodepth: u32,
        direct: bool,
        read_only: bool,
    ) -> Result<Self, PerfError> {
        let cfg = UringConfig {
            entries: iodepth.next_power_of_two().max(8),
            direct,
            read_only,
            ..UringConfig::default()
        };
        let backend = UringBackend::open(path, &cfg).map_err(|e| {
            PerfError::Unavailable(format!(
                "cannot open {} through io_uring: {e}{}",
                path.display(),
                if direct {
                    " (try --direct 0 on a file system without O_DIRECT)"
                } else {
                    ""
                }
            ))
        })?;
        Self::new(backend, bs, iodepth)
    }
}

impl<B: Backend> LocalTarget<B> {
    /// `backend` with `iodepth` page-aligned buffers of `bs` bytes.
    ///
    /// # Errors
    /// The buffers could not be allocated.
    pub fn new(backend: B, bs: u32, iodepth: u32) -> Result<Self, PerfError> {
        let bytes = bs as usize * iodepth as usize;
        let bufs = Region::new(&RegionConfig::new("dp-perf-blk", bytes)).map_err(|_| {
            PerfError::Alloc {
                what: "the IO buffers",
                bytes,
            }
        })?;
        Ok(Self {
            backend,
            bufs,
            bs: bs as usize,
            done: vec![BlkDone::default(); iodepth as usize],
        })
    }
}

impl<B: Backend> Target for LocalTarget<B> {
    fn geometry(&self) -> TargetGeometry {
        let g = self.backend.geometry();
        TargetGeometry {
            bytes: g.bytes,
            block: u32::from(g.logical_block),
            max_io: g.max_io,
        }
    }

    fn buffers(&self) -> &Region {
        &self.bufs
    }

    fn submit(&mut self, op: Op, offset: u64, len: u32, slot: u32, tag: u64) -> Result<(), Busy> {
        let at = slot as usize * self.bs;
        if at + len as usize > self.bufs.len() {
            return Err(Busy);
        }
        let io = BlkIo {
            tag,
            op: match op {
                Op::Read => BlkOp::Read,
                Op::Write => BlkOp::Write,
            },
            offset,
            len,
            buf: self.bufs.as_ptr().wrapping_add(at),
            fua: false,
            preflush: false,
        };
        // SAFETY: the buffer is `len` bytes of our region (checked above), which lives as long
        // as `self` and so as the backend; the engine does not touch a slot's bytes between
        // submit and the slot's completion.
        unsafe { self.backend.submit(io) }.map_err(|_| Busy)
    }

    fn poll(&mut self, out: &mut [Done]) -> usize {
        let n = out.len().min(self.done.len());
        let got = self.backend.poll(&mut self.done[..n]);
        for (o, d) in out.iter_mut().zip(&self.done[..got]) {
            *o = Done {
                tag: d.tag,
                result: d.result,
            };
        }
        got
    }
}
