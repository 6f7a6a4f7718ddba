//! The send path of [`StreamConn`]: data posted as RDMA WRITEs with immediate into the
//! peer's granted receive buffer, and data buffered in the send ring while no credit is
//! left.
//!
//! # Posting
//!
//! As librdmacm's `rsend`: while a send slot, a credit (`sseq_no != sseq_comp`), target
//! space and send-buffer space are there, the data goes out in chunks of 2048 bytes
//! doubling to 64 KiB, each one RDMA WRITE with a `Data` immediate; chunks up to the inline
//! size are posted inline, larger ones are copied into the send ring first.
//!
//! # Buffering (unlike librdmacm)
//!
//! When a credit, the target space or a send slot is missing, librdmacm's `rsend` returns
//! `EWOULDBLOCK` even with room in the send buffer, so in-flight data is bounded by
//! messages (one per credit), not only by bytes as with TCP. Two programs that each write
//! many small messages before reading then deadlock where TCP's buffers absorb them: each
//! side's writes wait for credits the other only returns once it reads. Here such a send
//! is accepted into the send ring instead (the *unposted* bytes, which always end at
//! `sbuf_off`), and [`StreamConn::after_completions`] writes them out, coalesced into
//! chunks of up to 64 KiB, as credits and target space return. Until then, new sends
//! append to them (the byte order is the order of the calls), control messages wait
//! behind them (a shutdown follows every byte accepted before it), and iomap publications
//! and `riowrite`s wait too (they use the ring as well). The wire is unchanged: every
//! write is a `Data` message within a granted half and a credit, as a librdmacm peer
//! expects. A send returns `EWOULDBLOCK` only when the send buffer is full.
//!
//! Buffered bytes move only when the connection makes progress, so the socket layer keeps
//! a list of connections holding some and makes progress on them whenever it makes
//! progress on any connection of the context; a blocking send returns only once its bytes
//! are posted, as librdmacm's (see `ctx`).

use super::{
    Buf, Local, OutOfBounds, RS_MAX_TRANSFER, RS_OLAP_START_SIZE, RS_SNDLOWAT, RsIo, RsWr, Seg,
    StreamConn, wr_id,
};
use crate::error::RsError;
use crate::wire::{HOST_BIG_ENDIAN, RsMsg, RsOp, RsSge};
use dp_fabric::RemoteAddr;

impl StreamConn {
    /// True while bytes accepted by [`send`](Self::send) wait in the send ring for credits:
    /// the socket layer must keep making progress on this connection (it is written only
    /// from [`after_completions`](Self::after_completions)).
    pub fn has_unposted(&self) -> bool {
        self.unposted > 0
    }

    /// Room to accept a send into the send ring (`POLLOUT` while out of credits).
    pub(super) fn can_buffer(&self) -> bool {
        self.writable
            && self.is_connected()
            && self.sbuf_bytes_avail >= RS_SNDLOWAT.min(self.cfg.sbuf_size)
    }

    /// A write may be posted now: a send slot, a credit and target space (send-buffer
    /// space is the caller's to check).
    fn can_post(&self, io: &impl RsIo) -> bool {
        self.is_connected()
            && self.sqe_avail >= 1
            && self.sseq_no != self.sseq_comp
            && self.current_target(io).length != 0
    }

    /// Sends as much of `data` as the send buffer takes (`rsend`): posted at once while
    /// credits, send slots and target space allow, in chunks of 2048 bytes doubling to
    /// 64 KiB; the rest buffered in the send ring and posted as credits return (see the
    /// module docs). Returns the bytes accepted.
    ///
    /// # Errors
    /// [`RsError::ConnReset`] if the socket cannot send any more (closed, reset or shut
    /// down for writing); [`RsError::WouldBlock`] if the send buffer is full.
    pub fn send(&mut self, data: &[u8], io: &mut impl RsIo) -> Result<usize, RsError> {
        if !self.writable || !self.is_connected() {
            return Err(RsError::ConnReset);
        }
        if data.is_empty() {
            return Ok(0);
        }
        if !self.iomap_pending.is_empty() {
            self.send_iomaps(io)?;
        }
        let mut sent = if self.unposted == 0 {
            self.post_now(data, io)
        } else {
            0
        };
        if sent < data.len() && self.error.is_none() {
            sent += self.buffer(&data[sent..], io);
            self.flush_unposted(io);
        }
        if sent == 0 {
            Err(if self.error.is_some() {
                RsError::ConnReset
            } else {
                RsError::WouldBlock
            })
        } else {
            Ok(sent)
        }
    }

    /// librdmacm's send loop: posts chunks while everything a write needs is there.
    /// Returns the bytes posted.
    fn post_now(&mut self, data: &[u8], io: &mut impl RsIo) -> usize {
        let mut sent = 0usize;
        let mut olen = RS_OLAP_START_SIZE;
        while sent < data.len() {
            let Some(target) = self.send_target(io) else {
                break;
            };
            let left = (data.len() - sent).min(u32::MAX as usize) as u32;
            let mut xfer = if olen < left {
                let x = olen;
                if olen < RS_MAX_TRANSFER {
                    olen <<= 1;
                }
                x
            } else {
                left
            };
            xfer = xfer.min(self.sbuf_bytes_avail).min(target.length);
            let chunk = &data[sent..sent + xfer as usize];
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
            self.sbuf_bytes_avail -= xfer;
            if !self.post_data(io, target, xfer, local) {
                break;
            }
            sent += xfer as usize;
        }
        sent
    }

    /// Accepts the start of `data` into the send ring as unposted bytes; returns how many.
    fn buffer(&mut self, data: &[u8], io: &mut impl RsIo) -> usize {
        let n = data.len().min(self.sbuf_bytes_avail as usize);
        if n == 0 {
            return 0;
        }
        if self.copy_to_sbuf(io, &data[..n]).is_err() {
            self.bounds_fault();
            return 0;
        }
        self.sbuf_bytes_avail -= n as u32;
        self.unposted += n as u32;
        n
    }

    /// Posts buffered bytes while credits, send slots and target space allow, in chunks of
    /// up to 64 KiB (each within one target entry); then any iomap publication that waited
    /// behind them.
    pub(super) fn flush_unposted(&mut self, io: &mut impl RsIo) {
        while self.unposted > 0 && self.can_post(io) {
            let target = self.current_target(io);
            let xfer = self.unposted.min(target.length).min(RS_MAX_TRANSFER);
            let size = self.cfg.sbuf_size;
            // The unposted bytes end at sbuf_off.
            let start = (self.sbuf_off + size - self.unposted) % size;
            let first = xfer.min(size - start);
            let s1 = Seg {
                buf: Buf::Sbuf,
                off: start,
                len: first,
            };
            let s2 = (first < xfer).then_some(Seg {
                buf: Buf::Sbuf,
                off: 0,
                len: xfer - first,
            });
            if !self.post_data(io, target, xfer, Local::Segs(s1, s2)) {
                return;
            }
            self.unposted -= xfer;
        }
        if self.unposted == 0 && !self.iomap_pending.is_empty() {
            // Failures are the connection's (recorded there) or a wait for a slot.
            let _ = self.send_iomaps(io);
        }
    }

    /// Posts one `Data` write of `xfer` bytes from `local` into `target` (the current
    /// target entry), consuming a credit and a send slot; the caller has taken the bytes
    /// out of `sbuf_bytes_avail` (the send completion gives them back). False if the
    /// target entry could not be updated (the connection then failed).
    fn post_data(
        &mut self,
        io: &mut impl RsIo,
        mut target: RsSge,
        xfer: u32,
        local: Local<'_>,
    ) -> bool {
        let remote = RemoteAddr {
            addr: target.addr,
            rkey: target.key,
        };
        // Consume from the entry. The address is the peer's (possibly nonsense: it is only
        // ever handed to the fabric, which checks it against the peer's key), so it wraps.
        target.addr = target.addr.wrapping_add(u64::from(xfer));
        target.length -= xfer;
        if target.length == 0 {
            // Used up: written back before posting (the peer may rewrite the entry once the
            // data lands), and read again from the list next time round.
            if io
                .write(
                    Buf::Target,
                    self.target_sge * RsSge::LEN as u32,
                    &target.to_bytes(HOST_BIG_ENDIAN),
                )
                .is_err()
            {
                self.bounds_fault();
                return false;
            }
            self.cur_target = RsSge::default();
            self.target_sge = (self.target_sge + 1) % crate::wire::RS_SGL_SIZE;
        } else {
            // Still ours: the list's copy goes stale, this one is the entry.
            self.cur_target = target;
        }
        self.sseq_no = self.sseq_no.wrapping_add(1);
        self.sqe_avail -= 1;
        self.stats.data_msgs_sent += 1;
        self.post(
            io,
            &RsWr {
                wr_id: wr_id(RsOp::Data, xfer),
                imm: Some(RsMsg::with(RsOp::Data, xfer).0),
                remote,
                local,
            },
        );
        true
    }

    /// Copies `chunk` into the send ring at `sbuf_off` (wrapping into two segments if
    /// needed) and moves `sbuf_off` past it.
    pub(super) fn copy_to_sbuf<'a>(
        &mut self,
        io: &mut impl RsIo,
        chunk: &[u8],
    ) -> Result<Local<'a>, OutOfBounds> {
        let n = chunk.len() as u32;
        let first = n.min(self.cfg.sbuf_size - self.sbuf_off);
        io.write(Buf::Sbuf, self.sbuf_off, &chunk[..first as usize])?;
        let s1 = Seg {
            buf: Buf::Sbuf,
            off: self.sbuf_off,
            len: first,
        };
        let s2 = if first < n {
            io.write(Buf::Sbuf, 0, &chunk[first as usize..])?;
            Some(Seg {
                buf: Buf::Sbuf,
                off: 0,
                len: n - first,
            })
        } else {
            None
        };
        self.sbuf_off = (self.sbuf_off + n) % self.cfg.sbuf_size;
        Ok(Local::Segs(s1, s2))
    }
}
