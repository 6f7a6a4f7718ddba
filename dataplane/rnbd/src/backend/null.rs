//! A backend that stores nothing: every IO completes at submit time with success, and a
//! read leaves the buffer as it was. It measures the transport alone, as Linux's
//! `null_blk` does.

use std::collections::VecDeque;

use super::{Backend, BlkDone, BlkIo, Geometry, check};

/// A device of `bytes` that stores nothing.
#[derive(Debug)]
pub struct NullBackend {
    geo: Geometry,
    done: VecDeque<BlkDone>,
}

impl NullBackend {
    /// A null device of `bytes` bytes (rounded down to 512-byte sectors), with room for
    /// `depth` completions between polls.
    pub fn new(bytes: u64, depth: usize) -> Self {
        Self {
            geo: Geometry {
                bytes: bytes & !511,
                logical_block: 512,
                physical_block: 4096,
                max_io: 1 << 20,
                discard: true,
                write_zeroes: true,
                write_cache: false,
                fua: false,
            },
            done: VecDeque::with_capacity(depth),
        }
    }
}

impl Backend for NullBackend {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    unsafe fn submit(&mut self, io: BlkIo) -> Result<(), BlkIo> {
        if self.done.len() == self.done.capacity() {
            return Err(io);
        }
        let result = check(&self.geo, &io).map_or(0, |e| -e);
        self.done.push_back(BlkDone {
            tag: io.tag,
            result,
        });
        Ok(())
    }

    fn poll(&mut self, out: &mut [BlkDone]) -> usize {
        let n = out.len().min(self.done.len());
        for (o, d) in out.iter_mut().zip(self.done.drain(..n)) {
            *o = d;
        }
        n
    }

    fn in_flight(&self) -> usize {
        self.done.len()
    }
}
