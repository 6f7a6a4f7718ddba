//! Socket buffer memory: large shareable regions carved into per-socket blocks.
//!
//! Every stream socket needs a send ring, a receive ring and a target list. Allocating a
//! region per socket would cost a memfd, a mapping and a peer mapping per connection; the
//! arena instead carves blocks out of a few large regions (hugepage-backed when the machine
//! has them), each registered once for local access. A socket registers its own receive
//! ring and target list for remote write, so its peer's key covers exactly those bytes and
//! nothing of any other socket.

use std::collections::HashMap;
use std::sync::Arc;

use mempool::memory::{Region, RegionConfig};

use crate::conn::{Buf, LocalKeys, StreamConfig};
use crate::error::RsError;
use dp_fabric::{Access, MemoryRegion, ProtectionDomain, Provider};

/// Default bytes per arena region.
pub const ARENA_CHUNK: usize = 64 << 20;

struct ArenaRegion<P: Provider> {
    mem: Arc<Region>,
    local: P::Mr,
    next: usize,
}

/// A block of an arena region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Block {
    region: usize,
    off: usize,
    len: usize,
}

/// The arena.
pub(crate) struct Arena<P: Provider> {
    regions: Vec<ArenaRegion<P>>,
    free: HashMap<usize, Vec<Block>>,
    chunk: usize,
}

impl<P: Provider> Arena<P> {
    pub(crate) fn new(chunk: usize) -> Self {
        Self {
            regions: Vec::new(),
            free: HashMap::new(),
            chunk,
        }
    }

    fn alloc(&mut self, pd: &P::Pd, len: usize) -> Result<Block, RsError> {
        let len = len.next_multiple_of(64);
        if let Some(b) = self.free.get_mut(&len).and_then(Vec::pop) {
            return Ok(b);
        }
        if let Some((i, r)) = self.regions.iter_mut().enumerate().last()
            && r.next + len <= r.mem.len()
        {
            let b = Block {
                region: i,
                off: r.next,
                len,
            };
            r.next += len;
            return Ok(b);
        }
        let size = self.chunk.max(len);
        let mem = Region::new(&RegionConfig::new("rsocket-buffers", size).shareable(true))
            .map(Arc::new)
            .map_err(|_| RsError::NoMemory)?;
        let local = pd
            .reg_region(&mem, 0, mem.len(), Access::LOCAL_WRITE)
            .map_err(|_| RsError::NoMemory)?;
        self.regions.push(ArenaRegion {
            mem,
            local,
            next: len,
        });
        Ok(Block {
            region: self.regions.len() - 1,
            off: 0,
            len,
        })
    }

    fn release(&mut self, b: Block) {
        self.free.entry(b.len).or_default().push(b);
    }

    /// Allocates and registers the buffers of one stream socket.
    pub(crate) fn stream_bufs(
        &mut self,
        pd: &P::Pd,
        cfg: &StreamConfig,
    ) -> Result<SockBufs<P>, RsError> {
        let sbuf_len = cfg.buf_len(Buf::Sbuf) as usize;
        let rbuf_len = cfg.buf_len(Buf::Rbuf) as usize;
        let target_len = cfg.buf_len(Buf::Target) as usize;
        let block = self.alloc(pd, sbuf_len + rbuf_len + target_len)?;
        let r = &self.regions[block.region];
        let sbuf = block.off;
        let rbuf = (sbuf + sbuf_len).next_multiple_of(8);
        let target = rbuf + rbuf_len;
        let Ok(remote) = pd.reg_region(
            &r.mem,
            rbuf,
            rbuf_len + target_len,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        ) else {
            self.release(block);
            return Err(RsError::NoMemory);
        };
        // Fresh or reused, a block starts zeroed: the target list must read as empty.
        r.mem.copy_in(target, &vec![0u8; target_len]);
        Ok(SockBufs {
            block,
            mem: r.mem.clone(),
            lkey: r.local.lkey(),
            sbuf: Span {
                at: sbuf,
                len: sbuf_len,
            },
            rbuf: Span {
                at: rbuf,
                len: rbuf_len,
            },
            target: Span {
                at: target,
                len: target_len,
            },
            remote,
        })
    }

    /// Returns a socket's buffers (its remote registration is dropped, revoking the key).
    pub(crate) fn free(&mut self, b: SockBufs<P>) {
        let block = b.block;
        drop(b);
        self.release(block);
    }
}

/// Where one buffer of a socket lies in its arena region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    /// Offset in the region.
    at: usize,
    /// Bytes.
    len: usize,
}

impl Span {
    /// The region offset of `[off, off + n)` of this buffer, if that lies inside it.
    #[inline]
    fn sub(self, off: u32, n: usize) -> Option<usize> {
        let end = (off as usize).checked_add(n)?;
        (end <= self.len).then_some(self.at + off as usize)
    }
}

/// One socket's buffers inside the arena. The region holds other sockets' buffers too:
/// every access goes through [`SockBufs::span`], bounded by the buffer it names.
pub(crate) struct SockBufs<P: Provider> {
    block: Block,
    pub mem: Arc<Region>,
    pub lkey: u32,
    sbuf: Span,
    rbuf: Span,
    target: Span,
    pub remote: P::Mr,
}

impl<P: Provider> SockBufs<P> {
    fn buf(&self, buf: Buf) -> Span {
        match buf {
            Buf::Sbuf => self.sbuf,
            Buf::Rbuf => self.rbuf,
            Buf::Target => self.target,
        }
    }

    /// Offset of `buf` within the region.
    #[inline]
    pub(crate) fn offset(&self, buf: Buf) -> usize {
        self.buf(buf).at
    }

    /// The region offset of `[off, off + n)` of `buf`, or `None` if that is not inside
    /// `buf` (it would reach another buffer, possibly another socket's).
    #[inline]
    pub(crate) fn span(&self, buf: Buf, off: u32, n: usize) -> Option<usize> {
        self.buf(buf).sub(off, n)
    }

    /// Local virtual address of `buf` + `off`.
    #[inline]
    pub(crate) fn addr(&self, buf: Buf, off: u32) -> u64 {
        self.mem.as_ptr() as u64 + (self.offset(buf) + off as usize) as u64
    }

    /// How peers address our receive ring and target list.
    pub(crate) fn keys(&self) -> LocalKeys {
        LocalKeys {
            rbuf_addr: self.addr(Buf::Rbuf, 0),
            rbuf_rkey: self.remote.rkey(),
            target_addr: self.addr(Buf::Target, 0),
            target_rkey: self.remote.rkey(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Span;

    #[test]
    fn spans_bound_every_access_by_their_own_buffer() {
        let s = Span { at: 4096, len: 100 };
        assert_eq!(s.sub(0, 100), Some(4096));
        assert_eq!(s.sub(99, 1), Some(4195));
        assert_eq!(s.sub(100, 0), Some(4196), "an empty access at the end");
        assert_eq!(s.sub(99, 2), None, "one byte into the next buffer");
        assert_eq!(s.sub(100, 1), None);
        assert_eq!(s.sub(0, 0x1FFF_FFFF), None, "a peer's 29-bit length");
        assert_eq!(s.sub(u32::MAX, usize::MAX), None, "no overflow");
    }
}
