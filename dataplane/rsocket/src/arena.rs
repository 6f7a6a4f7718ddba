//! Socket buffer memory: large shareable regions carved into per-socket blocks.
//!
//! Every stream socket needs a send ring, a receive ring and a target list. Allocating a
//! region per socket would cost a memfd and a mapping per connection; the arena instead
//! carves blocks out of a few large regions (hugepage-backed when the machine has them).
//! Each socket registers its blocks in its own protection domain: the send ring for local
//! access, the receive ring and target list for remote write. The latter sit in whole pages
//! of their own (no other socket's bytes share a page with them), because providers that
//! map memory into a peer (the shm provider) can only expose whole pages: a socket's peer
//! may touch exactly those pages and nothing of any other socket.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc;

use mempool::memory::{Region, RegionConfig};

use crate::conn::{Buf, LocalKeys, StreamConfig};
use crate::error::RsError;
use dp_fabric::{Access, MemoryRegion, ProtectionDomain, Provider};

/// Default bytes per arena region.
pub const ARENA_CHUNK: usize = 64 << 20;

struct ArenaRegion {
    mem: Arc<Region>,
    next: usize,
}

/// A block of an arena region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Block {
    region: usize,
    off: usize,
    len: usize,
    whole_pages: bool,
}

/// The arena.
pub(crate) struct Arena<P: Provider> {
    regions: Vec<ArenaRegion>,
    /// The provider whose protection domains register the blocks.
    _p: PhantomData<fn() -> P>,
    free: HashMap<(usize, bool), Vec<Block>>,
    chunk: usize,
}

impl<P: Provider> Arena<P> {
    pub(crate) fn new(chunk: usize) -> Self {
        Self {
            regions: Vec::new(),
            _p: PhantomData,
            free: HashMap::new(),
            chunk,
        }
    }

    /// A block of `len` bytes (rounded up to a multiple of 64, or of the region's page
    /// size with `whole_pages`, in which case it also starts on a page), in region `only`
    /// if given (else in any region, adding one if all are full).
    fn alloc(
        &mut self,
        len: usize,
        whole_pages: bool,
        only: Option<usize>,
    ) -> Result<Block, RsError> {
        let page = self.regions.first().map_or(4096, |r| r.mem.page_size());
        let align = if whole_pages { page } else { 64 };
        let len = len.next_multiple_of(align);
        if let Some(list) = self.free.get_mut(&(len, whole_pages))
            && let Some(i) = list.iter().position(|b| only.is_none_or(|r| r == b.region))
        {
            return Ok(list.swap_remove(i));
        }
        let last = self.regions.len().checked_sub(1);
        if let Some(i) = last
            && only.is_none_or(|r| r == i)
        {
            let r = &mut self.regions[i];
            let off = r.next.next_multiple_of(align);
            if off + len <= r.mem.len() {
                r.next = off + len;
                return Ok(Block {
                    region: i,
                    off,
                    len,
                    whole_pages,
                });
            }
        }
        if only.is_some() {
            return Err(RsError::NoMemory);
        }
        self.add_region(len)?;
        self.alloc(len, whole_pages, Some(self.regions.len() - 1))
    }

    /// Adds a region of at least `len` bytes.
    fn add_region(&mut self, len: usize) -> Result<(), RsError> {
        let size = self.chunk.max(len);
        let mem = Region::new(&RegionConfig::new("rsocket-buffers", size).shareable(true))
            .map(Arc::new)
            .map_err(|_| RsError::NoMemory)?;
        self.regions.push(ArenaRegion { mem, next: 0 });
        Ok(())
    }

    /// The remotely writable block (`rlen`, whole pages) and the send-ring block (`slen`)
    /// of one socket, in one region.
    ///
    /// Tried in order: a free or new receive block with the send ring beside it; both at
    /// the end of the last region; both in a new region. The second step matters: a
    /// receive block handed back because its region had no room for the ring is found
    /// first again by the next socket, so without it every later socket took a new region
    /// of [`ARENA_CHUNK`] bytes (a socket pair of 1 MiB cost 64 MiB past the first region).
    fn alloc_pair(&mut self, rlen: usize, slen: usize) -> Result<[Block; 2], RsError> {
        let r = self.alloc(rlen, true, None)?;
        if let Ok(s) = self.alloc(slen, false, Some(r.region)) {
            return Ok([r, s]);
        }
        self.release(r);
        if let Some(i) = self.regions.len().checked_sub(1)
            && let Ok(r) = self.alloc(rlen, true, Some(i))
        {
            if let Ok(s) = self.alloc(slen, false, Some(i)) {
                return Ok([r, s]);
            }
            self.release(r);
        }
        // No room for both anywhere: a new region.
        self.add_region(rlen + slen + (2 << 20))?;
        let i = self.regions.len() - 1;
        let r = self.alloc(rlen, true, Some(i))?;
        let s = self.alloc(slen, false, Some(i))?;
        Ok([r, s])
    }

    fn release(&mut self, b: Block) {
        self.free.entry((b.len, b.whole_pages)).or_default().push(b);
    }

    /// Allocates the buffers of one stream socket and registers them in `pd`, the socket's
    /// own protection domain.
    pub(crate) fn stream_bufs(
        &mut self,
        pd: &P::Pd,
        cfg: &StreamConfig,
    ) -> Result<SockBufs<P>, RsError> {
        let sbuf_len = cfg.buf_len(Buf::Sbuf) as usize;
        let rbuf_len = cfg.buf_len(Buf::Rbuf) as usize;
        let target_len = cfg.buf_len(Buf::Target) as usize;
        // The remotely writable part in pages of its own; the send ring beside it.
        let [rblock, sblock] = self.alloc_pair(rbuf_len + target_len, sbuf_len)?;
        let r = &self.regions[rblock.region];
        let rbuf = rblock.off;
        let target = rbuf + rbuf_len;
        let sbuf = sblock.off;
        // Fresh or reused, a block starts zeroed: the target list must read as empty.
        r.mem.copy_in(target, &vec![0u8; target_len]);
        let regs = pd
            .reg_region(&r.mem, sbuf, sblock.len, Access::LOCAL_WRITE)
            .and_then(|local| {
                pd.reg_region(
                    &r.mem,
                    rbuf,
                    rbuf_len + target_len,
                    Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                )
                .map(|remote| (local, remote))
            });
        let Ok((local, remote)) = regs else {
            self.release(sblock);
            self.release(rblock);
            return Err(RsError::NoMemory);
        };
        Ok(SockBufs {
            blocks: [rblock, sblock],
            mem: r.mem.clone(),
            lkey: local.lkey(),
            _local: local,
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
        let blocks = b.blocks;
        drop(b);
        for block in blocks {
            self.release(block);
        }
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
    /// The remotely writable block and the send-ring block.
    blocks: [Block; 2],
    pub mem: Arc<Region>,
    /// Key of the send ring's local registration.
    pub lkey: u32,
    _local: P::Mr,
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
    use super::{Arena, Span};

    /// Socket buffers fill a region before the arena takes another, also once a receive
    /// block was handed back because its region had no room left for a send ring (before
    /// the fix every socket from then on took a region of its own).
    #[test]
    fn pairs_fill_regions_before_adding_one() {
        let mut a = Arena::<dp_shm::Shm>::new(8 << 20);
        // A receive part of 3 pages and a ring of 1 MiB: 7 fit a region of 8 MiB, the 8th
        // receive part fits but its ring does not.
        let (rlen, slen) = (3 * 4096, 1 << 20);
        for _ in 0..40 {
            let [r, s] = a.alloc_pair(rlen, slen).unwrap();
            assert_eq!(r.region, s.region, "a socket's two blocks share a region");
        }
        assert!(
            a.regions.len() <= 7,
            "40 socket pairs took {} regions of 8 MiB",
            a.regions.len()
        );
    }

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
