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

use crate::wire::{AccessMode, Close, DEV_NAME_MAX, Open, OpenRsp, PROTO_VER_MAJOR, SessInfo};

mod blkio;
mod events;
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

#[cfg(test)]
#[allow(unsafe_code)] // drives a server session, whose request path takes raw chunk memory
mod tests;
