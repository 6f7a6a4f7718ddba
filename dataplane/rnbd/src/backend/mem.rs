//! A RAM disk: the device's bytes live in a mempool region (hugepage-backed when the
//! machine has hugepages reserved, which also keeps them resident), and every IO is a copy
//! at submit time. Discard and write-zeroes zero the range, as a RAM disk's discarded
//! pages read back as zeroes.

use std::collections::VecDeque;

use mempool::memory::{MemError, Region, RegionConfig};

use super::{Backend, BlkDone, BlkIo, BlkOp, Geometry, check};

/// A RAM disk.
#[derive(Debug)]
pub struct MemBackend {
    mem: Region,
    geo: Geometry,
    done: VecDeque<BlkDone>,
}

impl MemBackend {
    /// A zeroed RAM disk of `bytes` (rounded up to whole pages), named `name` in notices,
    /// with room for `depth` completions between polls.
    ///
    /// # Errors
    /// The region could not be allocated (the error says why and what to do).
    pub fn new(name: &str, bytes: u64, depth: usize) -> Result<Self, MemError> {
        let len = usize::try_from(bytes).map_err(|_| MemError::InvalidConfig {
            name: name.to_owned(),
            reason: "larger than the address space",
        })?;
        let mem = Region::new(&RegionConfig::new(name, len))?;
        let geo = Geometry {
            bytes: mem.len() as u64,
            logical_block: 512,
            physical_block: 4096,
            max_io: 1 << 20,
            discard: true,
            write_zeroes: true,
            write_cache: false,
            fua: false,
        };
        Ok(Self {
            mem,
            geo,
            done: VecDeque::with_capacity(depth),
        })
    }

    /// The bytes, for tests and tools (a copy of `[off, off + len)`).
    ///
    /// # Panics
    /// If the range is outside the device.
    pub fn read_back(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem.copy_out(off, &mut v);
        v
    }
}

impl Backend for MemBackend {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    unsafe fn submit(&mut self, io: BlkIo) -> Result<(), BlkIo> {
        if self.done.len() == self.done.capacity() {
            return Err(io);
        }
        let result = match check(&self.geo, &io) {
            Some(e) => -e,
            None => {
                let off = io.offset as usize;
                let len = io.len as usize;
                match io.op {
                    BlkOp::Read => {
                        // SAFETY: the caller guarantees buf is valid and writable for len
                        // bytes (trait contract); the source range lies inside the region
                        // (checked by `check`).
                        unsafe {
                            core::ptr::copy_nonoverlapping(self.mem.as_ptr().add(off), io.buf, len)
                        };
                    }
                    BlkOp::Write => {
                        // SAFETY: as above, in the other direction.
                        unsafe {
                            core::ptr::copy_nonoverlapping(io.buf, self.mem.as_ptr().add(off), len)
                        };
                    }
                    BlkOp::Discard | BlkOp::WriteZeroes => {
                        // SAFETY: the range lies inside the region (checked).
                        unsafe { core::ptr::write_bytes(self.mem.as_ptr().add(off), 0, len) };
                    }
                    BlkOp::Flush => {}
                }
                0
            }
        };
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
