//! What comes back to a [`ClientSession`]: link events from RTRS (the last path lost, a
//! path back: remap every device) and the completion of each request, with the checks of
//! the server's answers.

use super::types::{
    BlkError, ClientEvent, ClientTransport, Con, DevGeometry, DevId, DevState, Payload, errno_of,
};
use super::{ClientSession, DeferredWrite, Kind, SessState};
use crate::server::Dir;
use crate::wire::{
    CACHE_FUA, CACHE_WRITEBACK, Close, Msg, OpenRsp, PROTO_VER_MAJOR, SECTOR, SessInfo,
};

impl ClientSession {
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

    pub(super) fn remap_all(&mut self, io: &mut impl ClientTransport) {
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

    pub(super) fn finish_io(&mut self, dev: DevId, ctx: u64, result: Result<(), i32>) {
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

    pub(super) fn drop_count(&mut self, dev: DevId) {
        if let Ok(d) = self.dev_mut(dev) {
            d.in_flight = d.in_flight.saturating_sub(1);
        }
    }

    /// Forgets an unmapped device once nothing of it is in flight.
    pub(super) fn reap(&mut self, slot: u32) {
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
