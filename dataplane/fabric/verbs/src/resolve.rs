//! Synchronous address and route resolution on a private event channel.
//!
//! `connect`, `create_ud_qp` and `resolve_ud_dest` need the device, port and path for an
//! address before they can create anything, so they resolve on a throw-away
//! `rdma_event_channel` and wait for its events with a bound: each attempt waits
//! [`VerbsConfig::resolve_timeout`](super::VerbsConfig::resolve_timeout) (plus a second of
//! slack for the event itself), and an attempt that ends in a retryable error (`ETIMEDOUT`,
//! `ENODATA`: neighbour resolution did not finish) is repeated up to
//! [`VerbsConfig::resolve_attempts`](super::VerbsConfig::resolve_attempts) times. A resolved
//! id can then be moved to the caller's channel (`rdma_migrate_id`).

use std::net::{IpAddr, SocketAddr};
use std::ptr;
use std::time::{Duration, Instant};

use rdma_sys as ffi;
use rdma_sys::rdma_cm_event_type as ev;

use crate::dev::DevInner;
use crate::sys::{IdPtr, SockAddr, errno, os_err};
use dp_fabric::error::{FabricError, Result};

/// An id on its own event channel, destroyed (with the channel) on drop unless migrated.
pub(crate) struct TempId {
    ch: *mut ffi::rdma_event_channel,
    id: *mut ffi::rdma_cm_id,
}

/// How waiting for an event ended.
enum Waited {
    /// The expected event arrived.
    Done,
    /// Another event (an error); its status.
    Failed(i32),
    /// Nothing arrived in time.
    TimedOut,
}

impl Drop for TempId {
    fn drop(&mut self) {
        if !self.id.is_null() {
            // SAFETY: id was created on ch, every event of it was acked, it is destroyed once.
            unsafe { ffi::rdma_destroy_id(self.id) };
        }
        // SAFETY: ch was created by rdma_create_event_channel; its ids are gone or migrated.
        unsafe { ffi::rdma_destroy_event_channel(self.ch) };
    }
}

impl TempId {
    /// A new id in port space `ps` with user context `ctx`.
    pub(crate) fn new(ps: ffi::rdma_port_space::Type, ctx: u64) -> Result<Self> {
        // SAFETY: no arguments; returns NULL with errno on failure.
        let ch = unsafe { ffi::rdma_create_event_channel() };
        if ch.is_null() {
            return Err(FabricError::last_os("rdma_create_event_channel"));
        }
        let mut t = Self {
            ch,
            id: ptr::null_mut(),
        };
        // SAFETY: ch is live; id receives the new id; the context is an opaque integer.
        let rc = unsafe {
            ffi::rdma_create_id(ch, &raw mut t.id, ctx as usize as *mut libc::c_void, ps)
        };
        if rc != 0 {
            t.id = ptr::null_mut();
            return Err(FabricError::last_os("rdma_create_id"));
        }
        Ok(t)
    }

    /// The id.
    pub(crate) fn id(&self) -> *mut ffi::rdma_cm_id {
        self.id
    }

    /// The device context the id is bound to (null before binding or resolution).
    pub(crate) fn verbs(&self) -> *mut ffi::ibv_context {
        // SAFETY: id is live while self is.
        unsafe { (*self.id).verbs }
    }

    /// The port the id is bound to.
    pub(crate) fn port(&self) -> u8 {
        // SAFETY: id is live while self is.
        unsafe { (*self.id).port_num }
    }

    /// Binds to a local address (port 0).
    pub(crate) fn bind(ps: ffi::rdma_port_space::Type, local: IpAddr) -> Result<Self> {
        let t = Self::new(ps, 0)?;
        let mut sa = SockAddr::new(SocketAddr::new(local, 0));
        // SAFETY: id is live; sa is a valid sockaddr for the call.
        if unsafe { ffi::rdma_bind_addr(t.id, sa.as_mut_ptr()) } != 0 {
            let e = errno();
            return Err(FabricError::InvalidArgument {
                what: "local address",
                why: format!("cannot bind an RDMA id to {local}: {}", os_err(e)),
            });
        }
        Ok(t)
    }

    /// Resolves address and route from `src` (or the routing table's choice) to `dst`.
    pub(crate) fn resolve(
        dev: &DevInner,
        ps: ffi::rdma_port_space::Type,
        src: Option<IpAddr>,
        dst: SocketAddr,
        ctx: u64,
    ) -> Result<Self> {
        let t = Self::new(ps, ctx)?;
        let per = dev.cfg.resolve_timeout;
        let ms = i32::try_from(per.as_millis()).unwrap_or(i32::MAX);
        let total_ms = per.as_millis() as u64 * u64::from(dev.cfg.resolve_attempts);
        let mut src_sa = src.map(|ip| SockAddr::new(SocketAddr::new(ip, 0)));
        let mut dst_sa = SockAddr::new(dst);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let srcp = src_sa
                .as_mut()
                .map_or(ptr::null_mut(), SockAddr::as_mut_ptr);
            // SAFETY: id is live; the sockaddrs are valid for the call (librdmacm copies them).
            if unsafe { ffi::rdma_resolve_addr(t.id, srcp, dst_sa.as_mut_ptr(), ms) } != 0 {
                return Err(FabricError::Io {
                    op: "rdma_resolve_addr",
                    source: os_err(errno()),
                });
            }
            match t.wait(ev::RDMA_CM_EVENT_ADDR_RESOLVED, per) {
                Waited::Done => break,
                Waited::Failed(st) if retryable(st) && attempt < dev.cfg.resolve_attempts => {}
                Waited::Failed(st) => return Err(failure("RDMA address resolution", st, total_ms)),
                Waited::TimedOut => {
                    return Err(FabricError::Timeout {
                        op: "RDMA address resolution",
                        ms: total_ms,
                    });
                }
            }
        }
        attempt = 0;
        loop {
            attempt += 1;
            // SAFETY: id is live and its address is resolved.
            if unsafe { ffi::rdma_resolve_route(t.id, ms) } != 0 {
                return Err(FabricError::Io {
                    op: "rdma_resolve_route",
                    source: os_err(errno()),
                });
            }
            match t.wait(ev::RDMA_CM_EVENT_ROUTE_RESOLVED, per) {
                Waited::Done => return Ok(t),
                Waited::Failed(st) if retryable(st) && attempt < dev.cfg.resolve_attempts => {}
                Waited::Failed(st) => return Err(failure("RDMA route resolution", st, total_ms)),
                Waited::TimedOut => {
                    return Err(FabricError::Timeout {
                        op: "RDMA route resolution",
                        ms: total_ms,
                    });
                }
            }
        }
    }

    /// Waits for the next event of the private channel, bounded by `per` plus a second.
    fn wait(&self, want: ffi::rdma_cm_event_type::Type, per: Duration) -> Waited {
        let deadline = Instant::now() + per + Duration::from_secs(1);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Waited::TimedOut;
            }
            let mut p = libc::pollfd {
                // SAFETY: ch is live while self is.
                fd: unsafe { (*self.ch).fd },
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = i32::try_from(left.as_millis().max(1)).unwrap_or(i32::MAX);
            // SAFETY: one valid pollfd.
            if unsafe { libc::poll(&raw mut p, 1, ms) } <= 0 {
                continue;
            }
            let mut e = ptr::null_mut();
            // SAFETY: ch is live; the channel is readable, so this does not block for long.
            if unsafe { ffi::rdma_get_cm_event(self.ch, &raw mut e) } != 0 {
                continue;
            }
            // SAFETY: e is a live event until acked below.
            let (kind, status) = unsafe { ((*e).event, (*e).status) };
            // SAFETY: e came from rdma_get_cm_event and is acked once.
            unsafe { ffi::rdma_ack_cm_event(e) };
            return if kind == want && status == 0 {
                Waited::Done
            } else {
                Waited::Failed(if status != 0 { status } else { -libc::EPROTO })
            };
        }
    }

    /// Moves the id to `ch` and hands it over; the private channel is destroyed.
    pub(crate) fn migrate(mut self, ch: *mut ffi::rdma_event_channel) -> Result<IdPtr> {
        // SAFETY: id is live, all its events on the private channel were acked, ch is live.
        if unsafe { ffi::rdma_migrate_id(self.id, ch) } != 0 {
            return Err(FabricError::last_os("rdma_migrate_id"));
        }
        let id = self.id;
        self.id = ptr::null_mut();
        Ok(IdPtr(id))
    }
}

fn retryable(status: i32) -> bool {
    status == -libc::ETIMEDOUT || status == -libc::ENODATA
}

fn failure(op: &'static str, status: i32, total_ms: u64) -> FabricError {
    let e = if status < 0 { -status } else { libc::EIO };
    match e {
        libc::ETIMEDOUT => FabricError::Timeout { op, ms: total_ms },
        libc::ENODEV | libc::EADDRNOTAVAIL => FabricError::Io {
            op: if op.starts_with("RDMA address") {
                "RDMA address resolution (the route to the destination does not go through \
                 an RDMA device: check the destination address and the routing table)"
            } else {
                "RDMA route resolution (no RDMA path to the destination)"
            },
            source: os_err(e),
        },
        _ => FabricError::Io {
            op,
            source: os_err(e),
        },
    }
}
