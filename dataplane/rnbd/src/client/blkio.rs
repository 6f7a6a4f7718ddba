//! Block IO of a [`ClientSession`]: read, write (with preflush), flush, discard and
//! write-zeroes on a mapped device, each checked against the device's geometry and access
//! mode before anything is sent, and `pump` for what waited for a permit.

use super::types::{
    BlkError, Buf, ClientTransport, Con, DevGeometry, DevId, DevState, Payload, WriteFlags,
    errno_of,
};
use super::{ClientSession, Kind};
use crate::server::Dir;
use crate::wire::{F_FUA, F_SYNC, Io, Op, Rw, SECTOR};

impl ClientSession {
    /// Reads `buf.len` bytes at `sector` into `buf`.
    ///
    /// # Errors
    /// [`BlkError`]: nothing was sent.
    pub fn read(
        &mut self,
        dev: DevId,
        sector: u64,
        buf: Buf,
        ctx: u64,
        io: &mut impl ClientTransport,
    ) -> Result<(), BlkError> {
        let d = self.io_dev(dev)?;
        let g = d.geometry.ok_or(BlkError::NotMapped(d.state))?;
        check_range(&g, sector, buf.len, g.max_io)?;
        let id = d.device_id;
        self.send_io(
            dev,
            id,
            Rw::new(Op::Read, F_SYNC),
            sector,
            buf.len,
            Dir::Read,
            Payload::Data(buf),
            Kind::Io { ctx },
            io,
        )
    }

    /// Writes `buf.len` bytes of `buf` at `sector`.
    ///
    /// # Errors
    /// [`BlkError`]: nothing was sent.
    pub fn write(
        &mut self,
        dev: DevId,
        sector: u64,
        buf: Buf,
        flags: WriteFlags,
        ctx: u64,
        io: &mut impl ClientTransport,
    ) -> Result<(), BlkError> {
        let d = self.writable_dev(dev)?;
        let g = d.geometry.ok_or(BlkError::NotMapped(d.state))?;
        check_range(&g, sector, buf.len, g.max_io)?;
        let id = d.device_id;
        if flags.preflush && g.write_cache {
            let rw = Rw::new(Op::Flush, F_SYNC);
            return self.send_io(
                dev,
                id,
                rw,
                0,
                0,
                Dir::Write,
                Payload::None,
                Kind::Preflush {
                    ctx,
                    sector,
                    buf,
                    flags,
                },
                io,
            );
        }
        self.send_write(dev, id, sector, buf, flags, ctx, io)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn send_write(
        &mut self,
        dev: DevId,
        id: u32,
        sector: u64,
        buf: Buf,
        flags: WriteFlags,
        ctx: u64,
        io: &mut impl ClientTransport,
    ) -> Result<(), BlkError> {
        let mut f = 0;
        if flags.sync || flags.fua {
            f |= F_SYNC;
        }
        if flags.fua {
            f |= F_FUA;
        }
        self.send_io(
            dev,
            id,
            Rw::new(Op::Write, f),
            sector,
            buf.len,
            Dir::Write,
            Payload::Data(buf),
            Kind::Io { ctx },
            io,
        )
    }

    /// Makes every completed write durable.
    ///
    /// # Errors
    /// [`BlkError`]: nothing was sent.
    pub fn flush(
        &mut self,
        dev: DevId,
        ctx: u64,
        io: &mut impl ClientTransport,
    ) -> Result<(), BlkError> {
        let d = self.writable_dev(dev)?;
        let id = d.device_id;
        self.send_io(
            dev,
            id,
            Rw::new(Op::Flush, F_SYNC),
            0,
            0,
            Dir::Write,
            Payload::None,
            Kind::Io { ctx },
            io,
        )
    }

    /// Discards `nr_sectors` at `sector`.
    ///
    /// # Errors
    /// [`BlkError`]: nothing was sent.
    pub fn discard(
        &mut self,
        dev: DevId,
        sector: u64,
        nr_sectors: u32,
        ctx: u64,
        io: &mut impl ClientTransport,
    ) -> Result<(), BlkError> {
        self.dataless(dev, Op::Discard, sector, nr_sectors, ctx, io)
    }

    /// Writes zeroes over `nr_sectors` at `sector`.
    ///
    /// # Errors
    /// [`BlkError`]: nothing was sent.
    pub fn write_zeroes(
        &mut self,
        dev: DevId,
        sector: u64,
        nr_sectors: u32,
        ctx: u64,
        io: &mut impl ClientTransport,
    ) -> Result<(), BlkError> {
        self.dataless(dev, Op::WriteZeroes, sector, nr_sectors, ctx, io)
    }

    fn dataless(
        &mut self,
        dev: DevId,
        op: Op,
        sector: u64,
        nr: u32,
        ctx: u64,
        io: &mut impl ClientTransport,
    ) -> Result<(), BlkError> {
        let d = self.writable_dev(dev)?;
        let g = d.geometry.ok_or(BlkError::NotMapped(d.state))?;
        let max = if op == Op::Discard {
            g.max_discard_sectors
        } else {
            g.max_write_zeroes_sectors
        };
        if max == 0 {
            return Err(BlkError::Unsupported);
        }
        if nr > max {
            return Err(BlkError::TooLarge);
        }
        let len = nr.checked_mul(SECTOR as u32).ok_or(BlkError::TooLarge)?;
        check_range(&g, sector, len, u32::MAX)?;
        let id = d.device_id;
        self.send_io(
            dev,
            id,
            Rw::new(op, 0),
            sector,
            len,
            Dir::Write,
            Payload::None,
            Kind::Io { ctx },
            io,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn send_io(
        &mut self,
        dev: DevId,
        device_id: u32,
        rw: Rw,
        sector: u64,
        bi_size: u32,
        dir: Dir,
        payload: Payload,
        kind: Kind,
        io: &mut impl ClientTransport,
    ) -> Result<(), BlkError> {
        let mut b = [0u8; Io::LEN];
        Io {
            device_id,
            sector,
            rw,
            bi_size,
            prio: 0,
        }
        .emit(&mut b);
        let tag = self.alloc(dev.slot, dev.generation, kind);
        let r = io.submit(tag, Con::Io, dir, &b, payload);
        self.undo_on_err(tag, r)?;
        if let Some(d) = self.devices[dev.slot as usize].as_mut() {
            d.in_flight += 1;
        }
        Ok(())
    }

    /// Sends what waits for a permit: writes behind a completed preflush, and a remap
    /// whose messages found no permit. Call it after completions, from the lcore that
    /// drives the session.
    pub fn pump(&mut self, io: &mut impl ClientTransport) {
        if self.remap_pending {
            self.remap_pending = false;
            self.remap_all(io);
        }
        while let Some(w) = self.deferred.front().copied() {
            let Ok(d) = self.dev(w.dev) else {
                self.deferred.pop_front();
                continue;
            };
            let (id, state) = (d.device_id, d.state);
            let r = if state == DevState::Mapped {
                self.send_write(w.dev, id, w.sector, w.buf, w.flags, w.ctx, io)
            } else {
                Err(BlkError::NotMapped(state))
            };
            if r == Err(BlkError::Busy) {
                break;
            }
            self.deferred.pop_front();
            // The deferred write held one in-flight count; a sent write holds its own.
            match r {
                Ok(()) => self.drop_count(w.dev),
                Err(e) => self.finish_io(w.dev, w.ctx, Err(errno_of(e))),
            }
        }
    }
}

/// Checks an IO of `len` bytes at `sector` against the device.
fn check_range(g: &DevGeometry, sector: u64, len: u32, max: u32) -> Result<(), BlkError> {
    let lb = u64::from(g.logical_block);
    let off = sector.checked_mul(SECTOR).ok_or(BlkError::OutOfRange)?;
    if len == 0 || !off.is_multiple_of(lb) || !u64::from(len).is_multiple_of(lb) {
        return Err(BlkError::Unaligned);
    }
    if len > max {
        return Err(BlkError::TooLarge);
    }
    match off.checked_add(u64::from(len)) {
        Some(end) if end <= g.bytes() => Ok(()),
        _ => Err(BlkError::OutOfRange),
    }
}
