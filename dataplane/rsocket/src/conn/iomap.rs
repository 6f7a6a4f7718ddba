//! The iomap side of the stream: mappings a peer may write into directly, published
//! with `IomapSgl` messages, and `riowrite` into the peer's mappings.

use super::io::{Buf, Local, OutOfBounds, RS_MAX_TRANSFER, RS_OLAP_START_SIZE, RsIo, RsWr};
use super::{PendingIomap, StreamConn, wr_id};
use crate::error::RsError;
use crate::wire::{HOST_BIG_ENDIAN, RS_SGL_SIZE, RsIomap, RsMsg, RsOp, RsSge};
use dp_fabric::RemoteAddr;

impl StreamConn {
    /// Queues publication of a buffer the peer may then `riowrite` into (`riomap` with
    /// `PROT_WRITE`); `sge` is its address, rkey and length. Returns the slot.
    ///
    /// # Errors
    /// [`RsError::NoMemory`] if the peer exposes no free iomap slot.
    pub fn iomap(&mut self, offset: u64, sge: RsSge) -> Result<u32, RsError> {
        if !self.is_connected() {
            return Err(RsError::Invalid);
        }
        let index = self
            .remote_iomap_used
            .iter()
            .position(|u| !*u)
            .ok_or(RsError::NoMemory)? as u32;
        self.remote_iomap_used[index as usize] = true;
        self.iomap_pending.push_back(PendingIomap {
            index,
            map: RsIomap { offset, sge },
        });
        Ok(index)
    }

    /// Frees a published slot (`riounmap`). The peer's copy is not invalidated: its later
    /// writes fail with a remote access error once the memory is deregistered.
    pub fn iounmap(&mut self, index: u32) {
        if let Some(u) = self.remote_iomap_used.get_mut(index as usize) {
            *u = false;
        }
        self.iomap_pending.retain(|p| p.index != index);
    }

    /// Sends queued iomap publications (before any send or iowrite).
    ///
    /// # Errors
    /// [`RsError::WouldBlock`] if a publication must wait for a send slot.
    pub fn send_iomaps(&mut self, io: &mut impl RsIo) -> Result<(), RsError> {
        while let Some(p) = self.iomap_pending.front().copied() {
            // Behind buffered stream bytes (which must stay contiguous in the send ring):
            // after they are written.
            if self.sqe_avail < 1
                || self.sbuf_bytes_avail < RsIomap::LEN as u32
                || !self.is_connected()
                || self.unposted > 0
            {
                return Err(RsError::WouldBlock);
            }
            let bytes = p.map.to_bytes(self.peer_be);
            let local = if self.cfg.sq_inline >= RsIomap::LEN as u32 {
                Local::Inline(&bytes)
            } else {
                match self.copy_to_sbuf(io, &bytes) {
                    Ok(l) => l,
                    Err(OutOfBounds) => {
                        self.bounds_fault();
                        return Err(RsError::ConnReset);
                    }
                }
            };
            let wr = RsWr {
                wr_id: wr_id(RsOp::IomapSgl, p.index),
                imm: Some(RsMsg::with(RsOp::IomapSgl, p.index).0),
                remote: RemoteAddr {
                    // The peer's address: only handed to the fabric, so it may wrap.
                    addr: self
                        .remote_iomap
                        .addr
                        .wrapping_add(RsIomap::LEN as u64 * u64::from(p.index)),
                    rkey: self.remote_iomap.key,
                },
                local,
            };
            self.sqe_avail -= 1;
            self.sbuf_bytes_avail -= RsIomap::LEN as u32;
            self.post(io, &wr);
            self.iomap_pending.pop_front();
        }
        Ok(())
    }

    fn find_iomap(&self, io: &impl RsIo, offset: u64) -> Option<RsIomap> {
        (0..self.cfg.target_iomap_size).find_map(|i| {
            let mut b = [0u8; RsIomap::LEN];
            io.read(
                Buf::Target,
                RS_SGL_SIZE * RsSge::LEN as u32 + i * RsIomap::LEN as u32,
                &mut b,
            )
            .ok()?;
            let m = RsIomap::read(&b, HOST_BIG_ENDIAN)?;
            (m.sge.length > 0 && offset >= m.offset && offset - m.offset < u64::from(m.sge.length))
                .then_some(m)
        })
    }

    /// Writes `data` directly into the peer buffer mapped at `offset` (`riowrite`), in the
    /// same chunk schedule as `send`, as plain RDMA WRITEs the peer does not see. Returns
    /// the bytes queued.
    ///
    /// # Errors
    /// [`RsError::Invalid`] if `offset` is not inside a mapping the peer published;
    /// [`RsError::WouldBlock`] if nothing could be queued now; [`RsError::ConnReset`] if the
    /// socket cannot send.
    pub fn iowrite(
        &mut self,
        data: &[u8],
        offset: u64,
        io: &mut impl RsIo,
    ) -> Result<usize, RsError> {
        if !self.writable || !self.is_connected() {
            return Err(RsError::ConnReset);
        }
        if self.unposted > 0 {
            // Buffered stream bytes go first (and stay contiguous in the send ring).
            return Err(RsError::WouldBlock);
        }
        if !self.iomap_pending.is_empty() {
            self.send_iomaps(io)?;
        }
        let mut done = 0usize;
        let mut olen = RS_OLAP_START_SIZE;
        while done < data.len() {
            let Some(at) = offset.checked_add(done as u64) else {
                break;
            };
            let Some(m) = self.find_iomap(io, at) else {
                if done == 0 {
                    return Err(RsError::Invalid);
                }
                break;
            };
            if self.sqe_avail < 1 || self.sbuf_bytes_avail == 0 {
                break;
            }
            let left = (data.len() - done).min(u32::MAX as usize) as u32;
            let mut xfer = if olen < left {
                let x = olen;
                if olen < RS_MAX_TRANSFER {
                    olen <<= 1;
                }
                x
            } else {
                left
            };
            let room = u64::from(m.sge.length) - (at - m.offset);
            xfer = xfer
                .min(self.sbuf_bytes_avail)
                .min(room.min(u64::from(u32::MAX)) as u32);
            let chunk = &data[done..done + xfer as usize];
            let local = if xfer <= self.cfg.sq_inline {
                Local::Inline(chunk)
            } else {
                match self.copy_to_sbuf(io, chunk) {
                    Ok(l) => l,
                    Err(OutOfBounds) => {
                        self.bounds_fault();
                        break;
                    }
                }
            };
            let wr = RsWr {
                wr_id: wr_id(RsOp::Write, xfer),
                imm: None,
                remote: RemoteAddr {
                    // The entry is the peer's: only handed to the fabric, so it may wrap.
                    addr: m.sge.addr.wrapping_add(at - m.offset),
                    rkey: m.sge.key,
                },
                local,
            };
            self.sqe_avail -= 1;
            self.sbuf_bytes_avail -= xfer;
            self.post(io, &wr);
            done += xfer as usize;
        }
        if done == 0 {
            Err(if self.error.is_some() {
                RsError::ConnReset
            } else {
                RsError::WouldBlock
            })
        } else {
            Ok(done)
        }
    }
}
