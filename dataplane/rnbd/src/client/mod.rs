//! The client side of one RNBD session, sans-IO: devices mapped by name, block IO at sector
//! granularity, and the remap after RTRS reconnects.
//!
//! The session does not own the transport. It hands each message to a [`ClientTransport`]
//! (in production the RTRS client session, which takes a permit and posts the request)
//! with a `tag`, and the driver reports the request's completion with
//! [`ClientSession::complete`]. What the user sees comes out of
//! [`ClientSession::poll_event`].
//!
//! # Device states (Linux `enum rnbd_clt_dev_state`)
//!
//! ```text
//!   map() --OPEN--> Init --OPEN_RSP ok--> Mapped --link down--> MappedDisconnected
//!                     |                     ^  |                     |
//!                     |                     |  +--- unmap() ---+     | link up: SESS_INFO,
//!                     +--OPEN failed--> (gone)                 v     | then OPEN again
//!                                           +--OPEN_RSP ok-- Unmapped (CLOSE sent) <-+
//! ```
//!
//! IO is accepted only in `Mapped` (the kernel fails it with `BLK_STS_IOERR` otherwise).
//! While the session has a path, RTRS itself fails requests over, so a device only leaves
//! `Mapped` when the last path is gone.
//!
//! # What the server may not do to us
//!
//! Every response is checked before it changes anything: its type, its length, a logical
//! block size that is a power of two from 512 to 64 KiB, a size that fits in bytes. A
//! response that fails a check fails the open (or the session info) with `EPROTO`; it never
//! maps a device with a geometry we would then trust.
//!
//! # Flush semantics
//!
//! A write with `preflush` is sent as a FLUSH followed, once the flush has completed, by
//! the write: Linux servers before protocol minor 1 refuse the `PREFLUSH` flag, and the
//! version exchange carries only the major, so the flag cannot be negotiated.

use std::collections::VecDeque;

use crate::wire::{
    AccessMode, CACHE_FUA, CACHE_WRITEBACK, Close, DEV_NAME_MAX, F_FUA, F_SYNC, Io, Msg, Op, Open,
    OpenRsp, PROTO_VER_MAJOR, Rw, SECTOR, SessInfo,
};

mod types;

pub use crate::server::Dir;
pub use types::{
    BlkError, Buf, ClientEvent, ClientStats, ClientTransport, Con, DevGeometry, DevId, DevState,
    Payload, SubmitError, WriteFlags,
};

#[derive(Clone, Debug)]
struct Device {
    generation: u32,
    name: Vec<u8>,
    mode: AccessMode,
    state: DevState,
    device_id: u32,
    geometry: Option<DevGeometry>,
    in_flight: u32,
    /// An OPEN or CLOSE of this device is in flight.
    admin_busy: bool,
    /// Reopen once the admin message in flight completes.
    remap_wanted: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    SessInfo,
    Open {
        remap: bool,
    },
    Close,
    Io {
        ctx: u64,
    },
    /// The FLUSH ahead of a preflush write; the write follows.
    Preflush {
        ctx: u64,
        sector: u64,
        buf: Buf,
        flags: WriteFlags,
    },
}

#[derive(Clone, Copy, Debug)]
struct DeferredWrite {
    dev: DevId,
    ctx: u64,
    sector: u64,
    buf: Buf,
    flags: WriteFlags,
}

#[derive(Clone, Copy, Debug)]
struct Pending {
    generation: u32,
    slot: u32,
    kind: Kind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SessState {
    Idle,
    InfoSent,
    Ready,
    Failed,
}

/// Most devices one session tracks.
pub const MAX_DEVICES: usize = 1 << 16;

/// The client side of one session (see the module doc).
#[derive(Debug)]
pub struct ClientSession {
    state: SessState,
    ver: u8,
    max_io: u32,
    devices: Vec<Option<Device>>,
    dev_gen: u32,
    pending: Vec<Option<Pending>>,
    free: Vec<u32>,
    tag_gens: Vec<u32>,
    tag_gen: u32,
    /// Writes whose preflush completed but found no permit: sent by `pump`.
    deferred: VecDeque<DeferredWrite>,
    /// The session info and device opens of a remap that found no permit: sent by `pump`.
    remap_pending: bool,
    events: VecDeque<ClientEvent>,
    stats: ClientStats,
}

impl ClientSession {
    /// A session over a transport whose largest request carries `max_io` bytes of data
    /// (RTRS `max_io_size`).
    pub fn new(max_io: u32) -> Self {
        Self {
            state: SessState::Idle,
            ver: PROTO_VER_MAJOR,
            max_io,
            devices: Vec::new(),
            dev_gen: 0,
            pending: Vec::new(),
            free: Vec::new(),
            tag_gens: Vec::new(),
            tag_gen: 0,
            deferred: VecDeque::new(),
            remap_pending: false,
            events: VecDeque::new(),
            stats: ClientStats::default(),
        }
    }

    /// True once the session-info exchange finished.
    pub fn ready(&self) -> bool {
        self.state == SessState::Ready
    }

    /// The protocol major in use.
    pub fn version(&self) -> u8 {
        self.ver
    }

    /// Counters.
    pub fn stats(&self) -> ClientStats {
        self.stats
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<ClientEvent> {
        self.events.pop_front()
    }

    /// The transport's largest request changed (after a path came or went).
    pub fn set_max_io(&mut self, max_io: u32) {
        self.max_io = max_io;
        for d in self.devices.iter_mut().flatten() {
            if let Some(g) = d.geometry.as_mut() {
                g.max_io = g.max_io.min(max_io);
            }
        }
    }

    /// Starts the session: sends `SESS_INFO` (after RTRS opened the session).
    ///
    /// # Errors
    /// What the transport refused.
    pub fn start(&mut self, io: &mut impl ClientTransport) -> Result<(), BlkError> {
        self.send_sess_info(io)?;
        self.state = SessState::InfoSent;
        Ok(())
    }

    fn send_sess_info(&mut self, io: &mut impl ClientTransport) -> Result<(), BlkError> {
        let mut b = [0u8; SessInfo::LEN];
        SessInfo {
            ver: PROTO_VER_MAJOR,
        }
        .emit(&mut b);
        let tag = self.alloc(u32::MAX, 0, Kind::SessInfo);
        let r = io.submit(
            tag,
            Con::Admin,
            Dir::Read,
            &b,
            Payload::Answer(SessInfo::LEN as u32),
        );
        self.undo_on_err(tag, r)
    }

    /// Maps the device `name` in `mode`: sends `OPEN`. The answer comes as
    /// [`ClientEvent::Mapped`] or [`ClientEvent::MapFailed`].
    ///
    /// # Errors
    /// [`BlkError::NotReady`], [`BlkError::BadName`], [`BlkError::TooManyDevices`], or what
    /// the transport refused (nothing is mapped then).
    pub fn map(
        &mut self,
        name: &[u8],
        mode: AccessMode,
        io: &mut impl ClientTransport,
    ) -> Result<DevId, BlkError> {
        if self.state != SessState::Ready {
            return Err(BlkError::NotReady);
        }
        if name.is_empty() || name.len() > DEV_NAME_MAX || name.contains(&0) {
            return Err(BlkError::BadName);
        }
        if matches!(mode, AccessMode::Unknown(_)) {
            return Err(BlkError::Unsupported);
        }
        let slot = match self.devices.iter().position(Option::is_none) {
            Some(s) => s,
            None if self.devices.len() < MAX_DEVICES => {
                self.devices.push(None);
                self.devices.len() - 1
            }
            None => return Err(BlkError::TooManyDevices),
        };
        self.dev_gen = self.dev_gen.wrapping_add(1);
        let generation = self.dev_gen;
        self.devices[slot] = Some(Device {
            generation,
            name: name.to_vec(),
            mode,
            state: DevState::Init,
            device_id: 0,
            geometry: None,
            in_flight: 0,
            admin_busy: false,
            remap_wanted: false,
        });
        let slot = slot as u32;
        if let Err(e) = self.send_open(slot, false, io) {
            self.devices[slot as usize] = None;
            return Err(e);
        }
        Ok(DevId { slot, generation })
    }

    fn send_open(
        &mut self,
        slot: u32,
        remap: bool,
        io: &mut impl ClientTransport,
    ) -> Result<(), BlkError> {
        let d = self.devices[slot as usize]
            .as_mut()
            .ok_or(BlkError::NoDevice)?;
        let mut b = [0u8; Open::LEN];
        Open {
            access_mode: d.mode,
            dev_name: &d.name,
        }
        .emit(&mut b);
        let generation = d.generation;
        let tag = self.alloc(slot, generation, Kind::Open { remap });
        let r = io.submit(
            tag,
            Con::Admin,
            Dir::Read,
            &b,
            Payload::Answer(OpenRsp::LEN as u32),
        );
        self.undo_on_err(tag, r)?;
        if let Some(d) = self.devices[slot as usize].as_mut() {
            d.admin_busy = true;
        }
        Ok(())
    }

    /// Unmaps a device: sends `CLOSE`; new IO is refused at once, IO in flight completes.
    /// [`ClientEvent::Unmapped`] follows when both are done.
    ///
    /// # Errors
    /// [`BlkError::NoDevice`], [`BlkError::NotMapped`] if already unmapping.
    pub fn unmap(&mut self, dev: DevId, io: &mut impl ClientTransport) -> Result<(), BlkError> {
        let d = self.dev_mut(dev)?;
        match d.state {
            DevState::Unmapped => return Err(BlkError::NotMapped(DevState::Unmapped)),
            DevState::Init | DevState::MappedDisconnected => {
                // Nothing open on a reachable server (Init: the OPEN's answer is ignored
                // when it comes); forget it once its requests complete.
                d.state = DevState::Unmapped;
                d.remap_wanted = false;
                self.reap(dev.slot);
                return Ok(());
            }
            DevState::Mapped => {}
        }
        let mut b = [0u8; Close::LEN];
        Close {
            device_id: d.device_id,
        }
        .emit(&mut b);
        d.state = DevState::Unmapped;
        let tag = self.alloc(dev.slot, dev.generation, Kind::Close);
        if io
            .submit(tag, Con::Admin, Dir::Write, &b, Payload::None)
            .is_err()
        {
            // The server closes the device with the session; locally it is gone.
            self.release(tag);
        } else if let Some(d) = self.devices[dev.slot as usize].as_mut() {
            d.admin_busy = true;
        }
        self.reap(dev.slot);
        Ok(())
    }

    /// Reopens a disconnected device by hand (Linux's `remap_device`).
    ///
    /// # Errors
    /// [`BlkError::NoDevice`], [`BlkError::NotMapped`] unless disconnected or mapped,
    /// [`BlkError::NotReady`], or what the transport refused.
    pub fn remap(&mut self, dev: DevId, io: &mut impl ClientTransport) -> Result<(), BlkError> {
        if self.state != SessState::Ready {
            return Err(BlkError::NotReady);
        }
        let d = self.dev_mut(dev)?;
        match d.state {
            DevState::Mapped | DevState::MappedDisconnected => {}
            s => return Err(BlkError::NotMapped(s)),
        }
        if d.admin_busy {
            d.remap_wanted = true;
            return Ok(());
        }
        self.send_open(dev.slot, true, io)
    }

    /// The device's state.
    pub fn state(&self, dev: DevId) -> Option<DevState> {
        self.dev(dev).ok().map(|d| d.state)
    }

    /// The device's geometry, once mapped.
    pub fn geometry(&self, dev: DevId) -> Option<DevGeometry> {
        self.dev(dev).ok().and_then(|d| d.geometry)
    }

    /// The device's name and access mode.
    pub fn describe(&self, dev: DevId) -> Option<(&[u8], AccessMode, u32)> {
        self.dev(dev)
            .ok()
            .map(|d| (&d.name[..], d.mode, d.device_id))
    }

    /// Every device of the session.
    pub fn devices(&self) -> impl Iterator<Item = DevId> + '_ {
        self.devices.iter().enumerate().filter_map(|(i, d)| {
            d.as_ref().map(|d| DevId {
                slot: i as u32,
                generation: d.generation,
            })
        })
    }

    /// IOs of `dev` in flight.
    pub fn in_flight(&self, dev: DevId) -> u32 {
        self.dev(dev).map_or(0, |d| d.in_flight)
    }

    // -------------------------------------------------------------------------------------
    // Block IO
    // -------------------------------------------------------------------------------------

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
    fn send_write(
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

    // -------------------------------------------------------------------------------------
    // Link events and completions
    // -------------------------------------------------------------------------------------

    /// RTRS lost the session's last path (`RTRS_CLT_LINK_EV_DISCONNECTED`): every mapped
    /// device becomes disconnected.
    pub fn link_down(&mut self) {
        for (i, d) in self.devices.iter_mut().enumerate() {
            if let Some(d) = d
                && d.state == DevState::Mapped
            {
                d.state = DevState::MappedDisconnected;
                self.events.push_back(ClientEvent::Disconnected {
                    dev: DevId {
                        slot: i as u32,
                        generation: d.generation,
                    },
                });
            }
        }
    }

    /// RTRS has a path again (`RTRS_CLT_LINK_EV_RECONNECTED`): session info, then every
    /// device that was mapped is opened again, without waiting (`remap_devs`). Messages
    /// that find no permit go out from [`pump`](Self::pump).
    pub fn link_up(&mut self, io: &mut impl ClientTransport) {
        self.remap_all(io);
    }

    fn remap_all(&mut self, io: &mut impl ClientTransport) {
        if self.state != SessState::Failed
            && !self
                .pending
                .iter()
                .flatten()
                .any(|p| p.kind == Kind::SessInfo)
        {
            match self.send_sess_info(io) {
                Ok(()) => {}
                Err(BlkError::Busy) => {
                    self.remap_pending = true;
                    return;
                }
                Err(_) => return,
            }
        }
        for slot in 0..self.devices.len() {
            let Some(d) = self.devices[slot].as_mut() else {
                continue;
            };
            if !matches!(d.state, DevState::Mapped | DevState::MappedDisconnected) {
                continue;
            }
            if d.admin_busy {
                d.remap_wanted = true;
                continue;
            }
            match self.send_open(slot as u32, true, io) {
                Ok(()) => {}
                Err(BlkError::Busy) => {
                    if let Some(d) = self.devices[slot].as_mut() {
                        d.remap_wanted = true;
                    }
                    self.remap_pending = true;
                }
                Err(_) => {}
            }
        }
    }

    /// A request finished: `status` is 0 or the errno the server answered (or the transport
    /// failed it with); `answer` holds the bytes a session-info or open response left in
    /// the driver's buffer (ignored for other requests).
    pub fn complete(
        &mut self,
        tag: u64,
        status: i32,
        answer: &[u8],
        io: &mut impl ClientTransport,
    ) {
        let Some(p) = self.release(tag) else {
            self.stats.unknown_tags += 1;
            return;
        };
        let dev = DevId {
            slot: p.slot,
            generation: p.generation,
        };
        match p.kind {
            Kind::SessInfo => self.on_sess_info(status, answer),
            Kind::Open { remap } => self.on_open(dev, remap, status, answer, io),
            Kind::Close => {
                if let Ok(d) = self.dev_mut(dev) {
                    d.admin_busy = false;
                }
                self.reap(dev.slot);
            }
            Kind::Io { ctx } => {
                let r = if status == 0 {
                    Ok(())
                } else {
                    Err(status.abs())
                };
                self.finish_io(dev, ctx, r);
            }
            Kind::Preflush {
                ctx,
                sector,
                buf,
                flags,
            } => {
                let Ok(d) = self.dev(dev) else { return };
                let (id, state) = (d.device_id, d.state);
                let r = if status != 0 {
                    Err(status.abs())
                } else if state != DevState::Mapped {
                    Err(errno_of(BlkError::NotMapped(state)))
                } else {
                    match self.send_write(dev, id, sector, buf, flags, ctx, io) {
                        Err(BlkError::Busy) => {
                            // Keep this request's in-flight count for the deferred write.
                            self.deferred.push_back(DeferredWrite {
                                dev,
                                ctx,
                                sector,
                                buf,
                                flags,
                            });
                            return;
                        }
                        Ok(()) => {
                            // The write holds its own count and completes for the user.
                            self.drop_count(dev);
                            return;
                        }
                        Err(e) => Err(errno_of(e)),
                    }
                };
                self.finish_io(dev, ctx, r);
            }
        }
    }

    fn on_sess_info(&mut self, status: i32, answer: &[u8]) {
        let ver = match Msg::parse(answer) {
            _ if status != 0 => Err(status.abs()),
            Ok(Msg::SessInfoRsp(r)) if answer.len() == SessInfo::LEN => {
                Ok(r.ver.min(PROTO_VER_MAJOR))
            }
            _ => {
                self.stats.bad_responses += 1;
                Err(libc::EPROTO)
            }
        };
        match ver {
            Ok(ver) => {
                let first = self.state != SessState::Ready;
                self.ver = ver;
                self.state = SessState::Ready;
                if first {
                    self.events.push_back(ClientEvent::SessionReady { ver });
                }
            }
            Err(errno) if self.state != SessState::Ready => {
                self.state = SessState::Failed;
                self.events.push_back(ClientEvent::SessionFailed { errno });
            }
            // A failed re-exchange after a reconnect: the opens that follow it will tell.
            Err(_) => {}
        }
    }

    fn on_open(
        &mut self,
        dev: DevId,
        remap: bool,
        status: i32,
        answer: &[u8],
        io: &mut impl ClientTransport,
    ) {
        let max_io = self.max_io;
        let parsed = match Msg::parse(answer) {
            _ if status != 0 => Err(status.abs()),
            Ok(Msg::OpenRsp(r)) if answer.len() == OpenRsp::LEN => {
                check_open_rsp(&r, max_io).map(|g| (r.device_id, g))
            }
            _ => Err(libc::EPROTO),
        };
        if parsed == Err(libc::EPROTO) {
            self.stats.bad_responses += 1;
        }
        let Ok(d) = self.dev_mut(dev) else { return };
        d.admin_busy = false;
        match (d.state, parsed) {
            // Unmapped while the OPEN was in flight: close what the server opened.
            (DevState::Unmapped, Ok((id, _))) => {
                let mut b = [0u8; Close::LEN];
                Close { device_id: id }.emit(&mut b);
                let tag = self.alloc(dev.slot, dev.generation, Kind::Close);
                if io
                    .submit(tag, Con::Admin, Dir::Write, &b, Payload::None)
                    .is_err()
                {
                    self.release(tag);
                } else if let Ok(d) = self.dev_mut(dev) {
                    d.admin_busy = true;
                }
                self.reap(dev.slot);
            }
            (DevState::Unmapped, Err(_)) => self.reap(dev.slot),
            (DevState::Init, Err(errno)) => {
                self.devices[dev.slot as usize] = None;
                self.events.push_back(ClientEvent::MapFailed { dev, errno });
            }
            (_, Err(errno)) => {
                self.events
                    .push_back(ClientEvent::RemapFailed { dev, errno });
                self.after_admin(dev, io);
            }
            (_, Ok((id, g))) => {
                d.device_id = id;
                d.geometry = Some(g);
                d.state = DevState::Mapped;
                if remap {
                    self.stats.remaps += 1;
                }
                self.events.push_back(ClientEvent::Mapped {
                    dev,
                    geometry: g,
                    remapped: remap,
                });
                self.after_admin(dev, io);
            }
        }
    }

    /// A remap asked for while an admin message of the device was in flight goes now.
    fn after_admin(&mut self, dev: DevId, io: &mut impl ClientTransport) {
        let Ok(d) = self.dev_mut(dev) else { return };
        if d.remap_wanted && matches!(d.state, DevState::Mapped | DevState::MappedDisconnected) {
            d.remap_wanted = false;
            if self.send_open(dev.slot, true, io) == Err(BlkError::Busy) {
                if let Ok(d) = self.dev_mut(dev) {
                    d.remap_wanted = true;
                }
                self.remap_pending = true;
            }
        }
    }

    fn finish_io(&mut self, dev: DevId, ctx: u64, result: Result<(), i32>) {
        if result.is_ok() {
            self.stats.ios_ok += 1;
        } else {
            self.stats.ios_failed += 1;
        }
        self.drop_count(dev);
        self.events
            .push_back(ClientEvent::IoDone { dev, ctx, result });
        self.reap(dev.slot);
    }

    fn drop_count(&mut self, dev: DevId) {
        if let Ok(d) = self.dev_mut(dev) {
            d.in_flight = d.in_flight.saturating_sub(1);
        }
    }

    /// Forgets an unmapped device once nothing of it is in flight.
    fn reap(&mut self, slot: u32) {
        let Some(Some(d)) = self.devices.get(slot as usize) else {
            return;
        };
        if d.state == DevState::Unmapped && d.in_flight == 0 && !d.admin_busy {
            let dev = DevId {
                slot,
                generation: d.generation,
            };
            self.devices[slot as usize] = None;
            self.events.push_back(ClientEvent::Unmapped { dev });
        }
    }

    // -------------------------------------------------------------------------------------
    // Tags and handles
    // -------------------------------------------------------------------------------------

    fn alloc(&mut self, slot: u32, generation: u32, kind: Kind) -> u64 {
        let p = Pending {
            generation,
            slot,
            kind,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.pending[i as usize] = Some(p);
                i
            }
            None => {
                self.pending.push(Some(p));
                (self.pending.len() - 1) as u32
            }
        };
        self.tag_gen = self.tag_gen.wrapping_add(1);
        // The tag's high half must match on completion: a stale tag finds nothing.
        self.tag_gens_set(i, self.tag_gen);
        (u64::from(self.tag_gen) << 32) | u64::from(i)
    }

    fn tag_gens_set(&mut self, i: u32, g: u32) {
        if self.tag_gens.len() <= i as usize {
            self.tag_gens.resize(i as usize + 1, 0);
        }
        self.tag_gens[i as usize] = g;
    }

    fn release(&mut self, tag: u64) -> Option<Pending> {
        let i = (tag & 0xFFFF_FFFF) as u32;
        let g = (tag >> 32) as u32;
        if self.tag_gens.get(i as usize) != Some(&g) {
            return None;
        }
        let p = self.pending.get_mut(i as usize)?.take()?;
        self.free.push(i);
        Some(p)
    }

    fn undo_on_err(&mut self, tag: u64, r: Result<(), SubmitError>) -> Result<(), BlkError> {
        r.map_err(|e| {
            self.release(tag);
            BlkError::from(e)
        })
    }

    fn dev(&self, dev: DevId) -> Result<&Device, BlkError> {
        match self.devices.get(dev.slot as usize) {
            Some(Some(d)) if d.generation == dev.generation => Ok(d),
            _ => Err(BlkError::NoDevice),
        }
    }

    fn dev_mut(&mut self, dev: DevId) -> Result<&mut Device, BlkError> {
        match self.devices.get_mut(dev.slot as usize) {
            Some(Some(d)) if d.generation == dev.generation => Ok(d),
            _ => Err(BlkError::NoDevice),
        }
    }

    fn io_dev(&self, dev: DevId) -> Result<&Device, BlkError> {
        let d = self.dev(dev)?;
        if d.state != DevState::Mapped {
            return Err(BlkError::NotMapped(d.state));
        }
        Ok(d)
    }

    /// A mapped device that takes writes (write, flush, discard, write-zeroes): not one
    /// mapped read-only.
    fn writable_dev(&self, dev: DevId) -> Result<&Device, BlkError> {
        let d = self.io_dev(dev)?;
        if d.mode == AccessMode::Ro {
            return Err(BlkError::ReadOnly);
        }
        Ok(d)
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

/// Checks a server's `OPEN_RSP` and derives the geometry the client uses.
fn check_open_rsp(r: &OpenRsp, max_io: u32) -> Result<DevGeometry, i32> {
    let lb = u32::from(r.logical_block_size);
    let pb = u32::from(r.physical_block_size).max(lb);
    let sane_lb = lb.is_power_of_two() && (512..=65536).contains(&lb);
    if !sane_lb || r.nsectors.checked_mul(SECTOR).is_none() {
        return Err(libc::EPROTO);
    }
    let hw = r.max_hw_sectors.saturating_mul(SECTOR as u32);
    // A server may report 0 (no limit of its own): the transport's limit applies.
    let max_io = if hw == 0 { max_io } else { hw.min(max_io) };
    let max_io = max_io - max_io % lb;
    if max_io == 0 {
        return Err(libc::EPROTO);
    }
    Ok(DevGeometry {
        nsectors: r.nsectors,
        logical_block: lb,
        physical_block: pb,
        max_io,
        max_discard_sectors: r.max_discard_sectors,
        max_write_zeroes_sectors: r.max_write_zeroes_sectors,
        write_cache: r.cache_policy & CACHE_WRITEBACK != 0,
        fua: r.cache_policy & CACHE_FUA != 0,
    })
}

/// The errno a refused follow-up request completes with.
fn errno_of(e: BlkError) -> i32 {
    match e {
        BlkError::NoDevice | BlkError::NotMapped(_) => libc::ENODEV,
        BlkError::Busy => libc::EAGAIN,
        BlkError::NoPath | BlkError::NotReady => libc::ENOTCONN,
        BlkError::ReadOnly => libc::EROFS,
        BlkError::Unsupported => libc::EOPNOTSUPP,
        BlkError::TooLarge => libc::EFBIG,
        BlkError::Unaligned
        | BlkError::OutOfRange
        | BlkError::BadName
        | BlkError::TooManyDevices => libc::EINVAL,
    }
}

#[cfg(test)]
#[allow(unsafe_code)] // drives a server session, whose request path takes raw chunk memory
mod tests;
