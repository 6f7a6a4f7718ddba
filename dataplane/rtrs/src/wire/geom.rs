//! The arithmetic that ties the 28-bit immediate payload to the server's chunks.
//!
//! A session has `queue_depth` chunks of `chunk_size` bytes on the server. An IO request's
//! immediate names a chunk and the offset of the RTRS header inside it: the high
//! `bits(queue_depth)` bits of the payload are the chunk index and the low
//! `mem_bits = 28 - bits(queue_depth)` bits the offset (`alloc_permits` on the client,
//! `map_cont_bufs` on the server). Both fit only if
//! `bits(queue_depth) + bits(chunk_size) <= 28` (`check_module_params`, `process_info_rsp`).

use super::imm::PAYLOAD_BITS;
use super::{Bad, MAX_QUEUE_DEPTH, Result};

/// `ilog2(n - 1) + 1` as Linux computes it: the bits needed to number `n` things, 0 for
/// `n <= 1` (Linux's `ilog2(0)` is -1).
#[inline]
pub const fn bits(n: u32) -> u32 {
    if n <= 1 {
        0
    } else {
        32 - (n - 1).leading_zeros()
    }
}

/// A negotiated queue depth and chunk size, checked against the 28-bit budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    queue_depth: u16,
    chunk_size: u32,
    mem_bits: u32,
}

impl Geometry {
    /// Checks and builds: `queue_depth` in `1..=65535`, `chunk_size` non-zero, and
    /// `bits(queue_depth) + bits(chunk_size) <= 28`.
    ///
    /// # Errors
    /// [`Bad::QueueDepth`], [`Bad::ChunkSize`] or [`Bad::ImmBudget`].
    pub const fn new(queue_depth: u16, chunk_size: u32) -> Result<Self> {
        if queue_depth == 0 {
            return Err(Bad::QueueDepth);
        }
        if chunk_size == 0 {
            return Err(Bad::ChunkSize);
        }
        let qbits = bits(queue_depth as u32);
        if qbits + bits(chunk_size) > PAYLOAD_BITS {
            return Err(Bad::ImmBudget);
        }
        Ok(Self {
            queue_depth,
            chunk_size,
            mem_bits: PAYLOAD_BITS - qbits,
        })
    }

    /// The largest queue depth the budget allows with chunks of `chunk_size` bytes (at most
    /// [`MAX_QUEUE_DEPTH`]); 0 if even one chunk does not fit.
    pub const fn max_queue_depth(chunk_size: u32) -> u16 {
        let cbits = bits(chunk_size);
        if cbits > PAYLOAD_BITS {
            return 0;
        }
        let qbits = PAYLOAD_BITS - cbits;
        if qbits >= 16 {
            MAX_QUEUE_DEPTH
        } else {
            1 << qbits
        }
    }

    /// Chunks in the session: the number of permits.
    #[inline]
    pub const fn queue_depth(&self) -> u16 {
        self.queue_depth
    }

    /// Bytes per chunk.
    #[inline]
    pub const fn chunk_size(&self) -> u32 {
        self.chunk_size
    }

    /// Low bits of an IO request payload that carry the offset.
    #[inline]
    pub const fn mem_bits(&self) -> u32 {
        self.mem_bits
    }

    /// `permit->mem_off`: chunk `id`'s base in the immediate payload.
    #[inline]
    pub const fn mem_off(&self, id: u16) -> u32 {
        if self.mem_bits >= 32 {
            0
        } else {
            (id as u32) << self.mem_bits
        }
    }

    /// The IO request payload for the RTRS header at `off` in chunk `id`; `None` if `id` is
    /// not a chunk or `off` is not inside one.
    #[inline]
    pub const fn encode(&self, id: u16, off: u32) -> Option<u32> {
        if id >= self.queue_depth || off >= self.chunk_size {
            None
        } else {
            Some(self.mem_off(id) | off)
        }
    }

    /// Splits an IO request payload into (chunk index, offset), as the server does
    /// (`rtrs_srv_rdma_done`), and checks both: `None` if the index is not below the queue
    /// depth or the offset is not below the chunk size.
    #[inline]
    pub const fn split(&self, payload: u32) -> Option<(u16, u32)> {
        let payload = payload & super::imm::PAYLOAD_MASK;
        let id = payload >> self.mem_bits;
        let off = payload & ((1u32 << self.mem_bits) - 1);
        if id >= self.queue_depth as u32 || off >= self.chunk_size {
            None
        } else {
            Some((id as u16, off))
        }
    }
}
