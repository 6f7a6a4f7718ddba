//! Connection management through librdmacm.
//!
//! A [`VerbsCm`] owns one non-blocking `rdma_event_channel` and its listening ids; every
//! connection's id lives on that channel too (the active side migrates its id there after
//! resolving, the passive side's ids are born there as children of a listener). Each id's
//! `context` holds the [`ConnId`] (or, tagged, the [`ListenId`]) the events name.
//!
//! The channel's connection table (it lives with the channel itself in `chan`, which queue
//! pairs keep alive) maps a `ConnId` to its id, queue-pair tracking state and addresses. A
//! queue pair removes its entry before destroying its id, under the same lock event
//! handling and `disconnect` use, so neither ever touches a destroyed id. Events are
//! acknowledged right after they are translated, so `rdma_destroy_id` (which waits for the
//! acknowledgement of every event it has delivered) never waits on us.
//!
//! Event mapping:
//!
//! | librdmacm | here |
//! |---|---|
//! | `CONNECT_REQUEST` | [`CmEvent::ConnectRequest`] |
//! | `ESTABLISHED` | [`CmEvent::Established`] (active side: the REP's private data) |
//! | `REJECTED`, consumer reason (28) | [`CmEvent::Rejected`] with the REJ's private data |
//! | `REJECTED`, invalid service ID (8) | [`CmEvent::Unreachable`] `NoListener` |
//! | `REJECTED`, other reasons; `CONNECT_ERROR` | [`CmEvent::Unreachable`] `Protocol` |
//! | `UNREACHABLE`, `ADDR_ERROR`, `ROUTE_ERROR` | [`CmEvent::Unreachable`] `Timeout` |
//! | `DISCONNECTED` | [`CmEvent::Disconnected`] (and `rdma_disconnect`, which answers the DREQ) |
//! | `DEVICE_REMOVAL` | [`CmEvent::DeviceRemoval`], once per channel |
//!
//! A local [`disconnect`](CmChannel::disconnect) is reported as `Disconnected` at once (from
//! a local queue; waiting for the peer's DREP would tie this side's event to the peer's
//! event loop), and later CM events of that connection are dropped. Every ending puts the
//! queue pair in the error state.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_sys as ffi;
use rdma_sys::rdma_cm_event_type as ev;

use crate::chan::{ChanInner, ConnEntry, Phase};
use crate::dev::{DevInner, lock};
use crate::pdata::{self, Wire};
use crate::qp::{VerbsQp, check_objects};
use crate::resolve::TempId;
use crate::sys::{self, IdPtr, SockAddr, errno, os_err};
use crate::{PrivateDataFormat, Verbs};
use dp_fabric::error::{FabricError, Result};
use dp_fabric::traits::{
    CmChannel, CmEvent, ConnId, ConnRequest, ListenId, PrepareQp, PrivateData, QpInit,
    UnreachableReason,
};
use dp_fabric::types::QpState;

/// Marks a listener's id context.
const LISTEN_TAG: u64 = 1 << 62;
/// `IB_CM_REJ_INVALID_SERVICE_ID`: nothing listens on the service (port).
const REJ_INVALID_SERVICE_ID: i32 = 8;
/// `IB_CM_REJ_CONSUMER_DEFINED`: the peer application rejected (`rdma_reject`).
const REJ_CONSUMER_DEFINED: i32 = 28;
/// Infinite retries (`rnr_retry_count`), 7 transport retries.
const RETRY_INFINITE: u8 = 7;
/// Let librdmacm pick the largest depth both sides support.
const RDMA_MAX_DEPTH: u8 = 0xFF;
/// RNR NAK timer code for 0.64 ms (the IB encoding; 0 would be 655 ms).
const MIN_RNR_TIMER: u8 = 12;

/// Moves a queue pair to the error state (flushing what is outstanding).
///
/// # Safety
/// `id` must be live, with a live QP or none.
unsafe fn qp_to_error(id: IdPtr) {
    // SAFETY: caller's guarantee.
    let qp = unsafe { (*id.0).qp };
    if qp.is_null() {
        return;
    }
    // SAFETY: plain data; only qp_state is read for this mask.
    let mut attr: ffi::ibv_qp_attr = unsafe { core::mem::zeroed() };
    attr.qp_state = ffi::ibv_qp_state::IBV_QPS_ERR;
    // SAFETY: qp is live; moving to ERR is valid from every state.
    unsafe {
        ffi::ibv_modify_qp(
            qp,
            &raw mut attr,
            ffi::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
        )
    };
}

/// Shortens the RNR NAK timer of a connected queue pair. The RDMA CM brings RC queue pairs
/// up with `min_rnr_timer = 0`, which tells a sender that finds no receive posted here to
/// wait 655 ms before retrying; a polled dataplane reposts receives within microseconds.
/// Allowed in RTS (RTS to RTS); a device that refuses keeps the CM's value.
///
/// # Safety
/// `id` must be live, with a live QP or none.
unsafe fn shorten_rnr_timer(id: IdPtr) {
    // SAFETY: caller's guarantee.
    let qp = unsafe { (*id.0).qp };
    if qp.is_null() {
        return;
    }
    // SAFETY: plain data; only min_rnr_timer is read for this mask.
    let mut attr: ffi::ibv_qp_attr = unsafe { core::mem::zeroed() };
    attr.min_rnr_timer = MIN_RNR_TIMER;
    // SAFETY: qp is live and in RTS.
    unsafe {
        ffi::ibv_modify_qp(
            qp,
            &raw mut attr,
            ffi::ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER.0 as i32,
        )
    };
}

/// The private data an event carries.
///
/// # Safety
/// `e` must be a live, unacknowledged connection event.
unsafe fn event_pdata<'a>(e: *const ffi::rdma_cm_event) -> &'a [u8] {
    // SAFETY: for connection events the union holds the connection parameters.
    let p = unsafe { (*e).param.conn };
    if p.private_data.is_null() || p.private_data_len == 0 {
        return &[];
    }
    // SAFETY: librdmacm copied private_data_len bytes into the event, which lives until it
    // is acknowledged (after the caller copied what it needs).
    unsafe {
        core::slice::from_raw_parts(p.private_data.cast::<u8>(), usize::from(p.private_data_len))
    }
}

/// The connection parameters for `rdma_connect`/`rdma_accept`.
fn conn_param(wire: &Wire) -> ffi::rdma_conn_param {
    let b = wire.as_bytes();
    ffi::rdma_conn_param {
        private_data: if b.is_empty() {
            ptr::null()
        } else {
            b.as_ptr().cast()
        },
        private_data_len: b.len() as u8,
        responder_resources: RDMA_MAX_DEPTH,
        initiator_depth: RDMA_MAX_DEPTH,
        flow_control: 1,
        retry_count: RETRY_INFINITE,
        rnr_retry_count: RETRY_INFINITE,
        srq: 0,
        qp_num: 0,
    }
}

fn unspecified() -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)
}

/// An incoming connection request of the verbs provider. Dropping it unanswered rejects it.
pub struct VerbsConnRequest {
    id: Option<IdPtr>,
    chan: Arc<ChanInner>,
    listener: ListenId,
    pdata: PrivateData,
    src: SocketAddr,
    dst: SocketAddr,
}

impl core::fmt::Debug for VerbsConnRequest {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("VerbsConnRequest")
            .field("listener", &self.listener)
            .field("from", &self.src)
            .field("to", &self.dst)
            .field("private_data", &self.pdata)
            .finish()
    }
}

impl Drop for VerbsConnRequest {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            // SAFETY: the child id is live and unanswered; its CONNECT_REQUEST event was
            // acknowledged; it is rejected and destroyed once.
            unsafe {
                ffi::rdma_reject(id.0, ptr::null(), 0);
                ffi::rdma_destroy_id(id.0);
            }
        }
    }
}

impl ConnRequest for VerbsConnRequest {
    fn private_data(&self) -> &[u8] {
        self.pdata.as_bytes()
    }
    fn peer_addr(&self) -> SocketAddr {
        self.src
    }
    fn local_addr(&self) -> SocketAddr {
        self.dst
    }
}

/// A listening id.
struct Listener {
    id: IdPtr,
    addr: SocketAddr,
}

/// A connection-manager event channel of the verbs provider.
///
/// Besides the librdmacm channel it holds a queue of events this side generates itself (a
/// local `disconnect` is reported at once, not when the peer's DREP arrives), signalled
/// through an eventfd. [`event_fd`](CmChannel::event_fd) is an epoll descriptor over both,
/// readable while either has something.
pub struct VerbsCm {
    inner: Arc<ChanInner>,
    listeners: HashMap<ListenId, Listener>,
    removal_reported: bool,
    local: VecDeque<CmEvent<Verbs>>,
    efd: OwnedFd,
    epfd: OwnedFd,
}

impl core::fmt::Debug for VerbsCm {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("VerbsCm")
            .field("device", &self.inner.dev.name())
            .field("listeners", &self.listeners.len())
            .field("conns", &lock(&self.inner.conns).len())
            .finish()
    }
}

impl Drop for VerbsCm {
    fn drop(&mut self) {
        for (_, l) in self.listeners.drain() {
            // SAFETY: the listener id is live, its events were acknowledged, destroyed once.
            unsafe { ffi::rdma_destroy_id(l.id.0) };
        }
    }
}

impl VerbsCm {
    pub(crate) fn new(dev: &Arc<DevInner>) -> Result<Self> {
        let inner = ChanInner::new(dev)?;
        let chfd = inner.fd();
        // SAFETY: eventfd(2) with valid flags; the result is checked.
        let fd = unsafe {
            libc::eventfd(
                0,
                libc::EFD_CLOEXEC | libc::EFD_NONBLOCK | libc::EFD_SEMAPHORE,
            )
        };
        if fd < 0 {
            return Err(FabricError::last_os("eventfd for a CM channel"));
        }
        // SAFETY: fd is a fresh descriptor we own.
        let efd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: epoll_create1(2) with a valid flag; the result is checked.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(FabricError::last_os("epoll_create1 for a CM channel"));
        }
        // SAFETY: fd is a fresh descriptor we own.
        let epfd = unsafe { OwnedFd::from_raw_fd(fd) };
        for watched in [chfd, efd.as_raw_fd()] {
            let mut e = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: watched as u64,
            };
            // SAFETY: both descriptors are live; e is a valid event description.
            if unsafe {
                libc::epoll_ctl(epfd.as_raw_fd(), libc::EPOLL_CTL_ADD, watched, &raw mut e)
            } != 0
            {
                return Err(FabricError::last_os("epoll_ctl for a CM channel"));
            }
        }
        Ok(Self {
            inner,
            listeners: HashMap::new(),
            removal_reported: false,
            local: VecDeque::new(),
            efd,
            epfd,
        })
    }

    /// Queues an event generated on this side.
    fn push_local(&mut self, e: CmEvent<Verbs>) {
        self.local.push_back(e);
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a live u64 to our eventfd (cannot overflow in practice).
        unsafe { libc::write(self.efd.as_raw_fd(), (&raw const one).cast(), 8) };
    }

    /// Takes the next locally generated event.
    fn pop_local(&mut self) -> Option<CmEvent<Verbs>> {
        let e = self.local.pop_front()?;
        let mut v: u64 = 0;
        // SAFETY: reading 8 bytes into a live u64 from our (semaphore, non-blocking) eventfd.
        unsafe { libc::read(self.efd.as_raw_fd(), (&raw mut v).cast(), 8) };
        Some(e)
    }

    fn format(&self) -> PrivateDataFormat {
        self.inner.dev.cfg.private_data
    }

    /// Translates one event (still unacknowledged). A connection request that nobody
    /// listens for any more is put in `discard`, to be rejected after the acknowledgement.
    ///
    /// # Safety
    /// `e` must be a live, unacknowledged event of this channel.
    unsafe fn translate(
        &mut self,
        e: *mut ffi::rdma_cm_event,
        discard: &mut Option<VerbsConnRequest>,
    ) -> Option<CmEvent<Verbs>> {
        // SAFETY: caller's guarantee: the event and its ids are live until acknowledged.
        let (kind, status, id, listen_id) =
            unsafe { ((*e).event, (*e).status, (*e).id, (*e).listen_id) };
        // SAFETY: as above; the context is an integer we stored.
        let ctx = |i: *mut ffi::rdma_cm_id| unsafe { (*i).context as usize as u64 };
        match kind {
            ev::RDMA_CM_EVENT_CONNECT_REQUEST => {
                let listener = ListenId(ctx(listen_id) & !LISTEN_TAG);
                // SAFETY: the child id is live (it is ours from now on).
                let (local, peer) = unsafe { sys::id_addrs(id) };
                // SAFETY: a live connection event.
                let raw = unsafe { event_pdata(e) };
                let req = VerbsConnRequest {
                    id: Some(IdPtr(id)),
                    chan: self.inner.clone(),
                    listener,
                    pdata: pdata::decode(self.format(), raw),
                    src: peer.unwrap_or_else(unspecified),
                    dst: local.unwrap_or_else(unspecified),
                };
                if ctx(listen_id) & LISTEN_TAG == 0 || !self.listeners.contains_key(&listener) {
                    *discard = Some(req);
                    return None;
                }
                Some(CmEvent::ConnectRequest {
                    listener,
                    request: req,
                })
            }
            ev::RDMA_CM_EVENT_DEVICE_REMOVAL => {
                for c in lock(&self.inner.conns).values() {
                    c.track.set_state(QpState::Error);
                }
                if self.removal_reported {
                    return None;
                }
                self.removal_reported = true;
                Some(CmEvent::DeviceRemoval)
            }
            ev::RDMA_CM_EVENT_ESTABLISHED
            | ev::RDMA_CM_EVENT_REJECTED
            | ev::RDMA_CM_EVENT_UNREACHABLE
            | ev::RDMA_CM_EVENT_CONNECT_ERROR
            | ev::RDMA_CM_EVENT_ADDR_ERROR
            | ev::RDMA_CM_EVENT_ROUTE_ERROR
            | ev::RDMA_CM_EVENT_DISCONNECTED => {
                let conn = ConnId(ctx(id));
                let fmt = self.format();
                let mut conns = lock(&self.inner.conns);
                // Unknown: a listener's id, or a connection whose queue pair is gone.
                let c = conns.get_mut(&conn)?;
                // SAFETY: the entry's id is live while it is in the table (we hold the lock),
                // and the event is live.
                unsafe { conn_event(c, conn, kind, status, e, fmt) }
            }
            // TIMEWAIT_EXIT, ADDR_CHANGE, multicast and resolution events need no action.
            _ => None,
        }
    }
}

/// Handles an event of an established or connecting connection.
///
/// # Safety
/// `c.id` must be live (the caller holds the table lock) and `e` a live event.
unsafe fn conn_event(
    c: &mut ConnEntry,
    conn: ConnId,
    kind: ffi::rdma_cm_event_type::Type,
    status: i32,
    e: *mut ffi::rdma_cm_event,
    fmt: PrivateDataFormat,
) -> Option<CmEvent<Verbs>> {
    match kind {
        ev::RDMA_CM_EVENT_ESTABLISHED => {
            if c.local_disconnect {
                // Disconnected (and reported) while connecting: now that the connection is
                // up on the peer's side, a DREQ can tell it.
                // SAFETY: the id is live (caller).
                unsafe { ffi::rdma_disconnect(c.id.0) };
                return None;
            }
            if c.phase != Phase::Connecting {
                return None;
            }
            c.phase = Phase::Established;
            c.track.set_state(QpState::Rts);
            // SAFETY: the id is live (caller) and its QP is in RTS.
            unsafe { shorten_rnr_timer(c.id) };
            let private_data = if c.active {
                // SAFETY: a live connection event.
                pdata::decode(fmt, unsafe { event_pdata(e) })
            } else {
                PrivateData::EMPTY
            };
            Some(CmEvent::Established { conn, private_data })
        }
        ev::RDMA_CM_EVENT_DISCONNECTED => {
            if c.phase == Phase::Ended {
                return None;
            }
            c.phase = Phase::Ended;
            c.track.set_state(QpState::Error);
            // Moves the QP to error and answers the peer's DREQ (or is a no-op after our own).
            // SAFETY: the id is live (caller).
            unsafe { ffi::rdma_disconnect(c.id.0) };
            Some(CmEvent::Disconnected { conn })
        }
        _ => {
            if c.phase == Phase::Ended {
                return None;
            }
            c.phase = Phase::Ended;
            c.track.set_state(QpState::Error);
            // SAFETY: the id is live (caller).
            unsafe { qp_to_error(c.id) };
            let reason = match kind {
                ev::RDMA_CM_EVENT_REJECTED if status == REJ_CONSUMER_DEFINED => {
                    return Some(CmEvent::Rejected {
                        conn,
                        // SAFETY: a live connection event.
                        private_data: pdata::decode(fmt, unsafe { event_pdata(e) }),
                    });
                }
                ev::RDMA_CM_EVENT_REJECTED
                    if status == REJ_INVALID_SERVICE_ID || status == -libc::ECONNREFUSED =>
                {
                    UnreachableReason::NoListener
                }
                ev::RDMA_CM_EVENT_REJECTED | ev::RDMA_CM_EVENT_CONNECT_ERROR => {
                    UnreachableReason::Protocol
                }
                _ => UnreachableReason::Timeout,
            };
            Some(CmEvent::Unreachable { conn, reason })
        }
    }
}

impl CmChannel for VerbsCm {
    type P = Verbs;

    fn listen(&mut self, addr: SocketAddr, backlog: u32) -> Result<ListenId> {
        let lid = ListenId(self.inner.dev.next_id());
        let mut id = ptr::null_mut();
        // SAFETY: the channel is live; id receives the new id; the context is an integer.
        let rc = unsafe {
            ffi::rdma_create_id(
                self.inner.ch,
                &raw mut id,
                (lid.0 | LISTEN_TAG) as usize as *mut libc::c_void,
                ffi::rdma_port_space::RDMA_PS_TCP,
            )
        };
        if rc != 0 {
            return Err(FabricError::last_os("rdma_create_id"));
        }
        let destroy = |id| {
            // SAFETY: the id was created above, has no events, and is destroyed once.
            unsafe { ffi::rdma_destroy_id(id) };
        };
        let mut sa = SockAddr::new(addr);
        // SAFETY: id is live; sa is a valid sockaddr for the call.
        if unsafe { ffi::rdma_bind_addr(id, sa.as_mut_ptr()) } != 0 {
            let e = errno();
            destroy(id);
            return Err(match e {
                libc::EADDRINUSE => FabricError::AddrInUse { addr },
                _ => FabricError::InvalidArgument {
                    what: "listen address",
                    why: format!("cannot bind an RDMA listener to {addr}: {}", os_err(e)),
                },
            });
        }
        // SAFETY: id is live; verbs is set when the address belongs to an RDMA device.
        let verbs = unsafe { (*id).verbs };
        if !verbs.is_null() && verbs != self.inner.dev.ctx {
            // SAFETY: verbs is one of librdmacm's live contexts.
            let other = unsafe { sys::c_string(ffi::ibv_get_device_name((*verbs).device)) };
            destroy(id);
            return Err(FabricError::InvalidArgument {
                what: "listen address",
                why: format!(
                    "{} belongs to RDMA device {other}, not {}: listen on a {other} device handle",
                    addr.ip(),
                    self.inner.dev.name()
                ),
            });
        }
        // SAFETY: id is bound.
        if unsafe { ffi::rdma_listen(id, i32::try_from(backlog).unwrap_or(i32::MAX)) } != 0 {
            let e = errno();
            destroy(id);
            return Err(match e {
                libc::EADDRINUSE => FabricError::AddrInUse { addr },
                _ => FabricError::Io {
                    op: "rdma_listen",
                    source: os_err(e),
                },
            });
        }
        // SAFETY: id is live and bound.
        let bound = unsafe { sys::id_addrs(id) }.0.unwrap_or(addr);
        self.listeners.insert(
            lid,
            Listener {
                id: IdPtr(id),
                addr: bound,
            },
        );
        Ok(lid)
    }

    fn stop_listen(&mut self, id: ListenId) -> Result<()> {
        let l = self
            .listeners
            .remove(&id)
            .ok_or(FabricError::BadState("no such listener on this channel"))?;
        // SAFETY: the listener id is live, its events were acknowledged, destroyed once.
        unsafe { ffi::rdma_destroy_id(l.id.0) };
        Ok(())
    }

    fn listen_addr(&self, id: ListenId) -> Option<SocketAddr> {
        self.listeners.get(&id).map(|l| l.addr)
    }

    fn connect_prepared(
        &mut self,
        dst: SocketAddr,
        init: &QpInit<'_, Verbs>,
        private_data: &[u8],
        prepare: &mut PrepareQp<'_, Verbs>,
    ) -> Result<(ConnId, VerbsQp)> {
        let dev = &self.inner.dev;
        let wire = pdata::encode(
            self.format(),
            private_data,
            dev.attr.max_req_private_data,
            "REQ",
        )?;
        check_objects(dev.ctx, init)?;
        let conn = ConnId(dev.next_id());
        let tmp = TempId::resolve(dev, ffi::rdma_port_space::RDMA_PS_TCP, None, dst, conn.0)?;
        check_objects(tmp.verbs(), init)?;
        let id = tmp.migrate(self.inner.ch)?;
        let mut qp = match VerbsQp::create(&self.inner, id, init, conn) {
            Ok(q) => q,
            Err(e) => {
                // SAFETY: the id is live, has no QP and no unacknowledged events.
                unsafe { ffi::rdma_destroy_id(id.0) };
                return Err(e);
            }
        };
        // From here the queue pair owns the id; dropping it on an error cleans up.
        prepare(&mut qp)?;
        // SAFETY: the id is live.
        let (local, _) = unsafe { sys::id_addrs(id.0) };
        self.inner.insert(
            conn,
            ConnEntry {
                id,
                track: qp.track.clone(),
                active: true,
                local: local.unwrap_or_else(unspecified),
                peer: dst,
                phase: Phase::Connecting,
                local_disconnect: false,
            },
        );
        let mut param = conn_param(&wire);
        // SAFETY: the id is resolved and has its QP; param (and the private data it points
        // to, in `wire`) is valid for the call, which copies it.
        if unsafe { ffi::rdma_connect(id.0, &raw mut param) } != 0 {
            return Err(FabricError::last_os("rdma_connect"));
        }
        qp.track.set_state(QpState::Rtr);
        Ok((conn, qp))
    }

    fn accept_prepared(
        &mut self,
        mut request: VerbsConnRequest,
        init: &QpInit<'_, Verbs>,
        private_data: &[u8],
        prepare: &mut PrepareQp<'_, Verbs>,
    ) -> Result<(ConnId, VerbsQp)> {
        let dev = &self.inner.dev;
        let wire = pdata::encode(
            self.format(),
            private_data,
            dev.attr.max_rep_private_data,
            "REP",
        )?;
        let id = request
            .id
            .take()
            .ok_or(FabricError::BadState("connection request already answered"))?;
        // Until the queue pair owns the id, an error hands it back to the request, whose
        // Drop rejects it.
        if !Arc::ptr_eq(&request.chan, &self.inner) {
            // SAFETY: the id is live; its only event was acknowledged.
            if unsafe { ffi::rdma_migrate_id(id.0, self.inner.ch) } != 0 {
                request.id = Some(id);
                return Err(FabricError::last_os("rdma_migrate_id"));
            }
        }
        // SAFETY: the id is live; verbs is the device the request came in on.
        if let Err(e) = check_objects(unsafe { (*id.0).verbs }, init) {
            request.id = Some(id);
            return Err(e);
        }
        let conn = ConnId(dev.next_id());
        // SAFETY: the id is live; context is ours to set.
        unsafe { (*id.0).context = conn.0 as usize as *mut libc::c_void };
        let mut qp = match VerbsQp::create(&self.inner, id, init, conn) {
            Ok(q) => q,
            Err(e) => {
                request.id = Some(id);
                return Err(e);
            }
        };
        // Receives go in before the reply (the QP is in INIT, where posting receives is
        // allowed): the peer may send the moment it has the reply.
        if let Err(e) = prepare(&mut qp) {
            // SAFETY: the id is live and unanswered; the queue pair (which owns the id
            // now) destroys it when dropped.
            unsafe { ffi::rdma_reject(id.0, ptr::null(), 0) };
            return Err(e);
        }
        self.inner.insert(
            conn,
            ConnEntry {
                id,
                track: qp.track.clone(),
                active: false,
                local: request.dst,
                peer: request.src,
                phase: Phase::Connecting,
                local_disconnect: false,
            },
        );
        let mut param = conn_param(&wire);
        // SAFETY: the id has its QP; param and its private data are valid for the call.
        if unsafe { ffi::rdma_accept(id.0, &raw mut param) } != 0 {
            return Err(FabricError::last_os("rdma_accept"));
        }
        // On IB and RoCE, rdma_accept moves the queue pair through RTR to RTS before the
        // REP leaves, so the passive side may send at once (rsocket servers do, with their
        // first credit update); the RTU later only produces the Established event.
        qp.track.set_state(QpState::Rts);
        Ok((conn, qp))
    }

    fn reject(&mut self, mut request: VerbsConnRequest, private_data: &[u8]) -> Result<()> {
        let dev = &self.inner.dev;
        let wire = pdata::encode(
            self.format(),
            private_data,
            dev.attr.max_rej_private_data,
            "REJ",
        )?;
        let id = request
            .id
            .take()
            .ok_or(FabricError::BadState("connection request already answered"))?;
        let b = wire.as_bytes();
        // SAFETY: the child id is live and unanswered; the data is valid for the call.
        let rc = unsafe {
            ffi::rdma_reject(
                id.0,
                if b.is_empty() {
                    ptr::null()
                } else {
                    b.as_ptr().cast()
                },
                b.len() as u8,
            )
        };
        let e = errno();
        // SAFETY: the REJ has been sent (or could not be); the id is destroyed once.
        unsafe { ffi::rdma_destroy_id(id.0) };
        if rc != 0 {
            return Err(FabricError::Io {
                op: "rdma_reject",
                source: os_err(e),
            });
        }
        Ok(())
    }

    fn disconnect(&mut self, conn: ConnId) -> Result<()> {
        let report = {
            let mut conns = lock(&self.inner.conns);
            let c = conns
                .get_mut(&conn)
                .ok_or(FabricError::BadState("no such connection on this channel"))?;
            c.local_disconnect = true;
            c.track.set_state(QpState::Error);
            // Moves the QP to error and sends a DREQ (once the connection is up; while it is
            // being set up, the DREQ goes out when ESTABLISHED arrives). The peer reports
            // Disconnected when the DREQ arrives; this side reports it now.
            // SAFETY: the id is live while its entry is in the table (we hold the lock).
            unsafe {
                ffi::rdma_disconnect(c.id.0);
                qp_to_error(c.id);
            }
            let report = c.phase != Phase::Ended;
            c.phase = Phase::Ended;
            report
        };
        if report {
            self.push_local(CmEvent::Disconnected { conn });
        }
        Ok(())
    }

    fn conn_addrs(&self, conn: ConnId) -> Option<(SocketAddr, SocketAddr)> {
        lock(&self.inner.conns)
            .get(&conn)
            .map(|c| (c.local, c.peer))
    }

    fn poll_event(&mut self) -> Option<CmEvent<Verbs>> {
        if let Some(e) = self.pop_local() {
            return Some(e);
        }
        loop {
            let mut e = ptr::null_mut();
            // SAFETY: the channel is live and non-blocking: this fails with EAGAIN when no
            // event is pending.
            if unsafe { ffi::rdma_get_cm_event(self.inner.ch, &raw mut e) } != 0 {
                return None;
            }
            let mut discard = None;
            // SAFETY: e is a live event of this channel, acknowledged right after.
            let out = unsafe { self.translate(e, &mut discard) };
            // SAFETY: e came from rdma_get_cm_event and is acknowledged once.
            unsafe { ffi::rdma_ack_cm_event(e) };
            drop(discard);
            if out.is_some() {
                return out;
            }
        }
    }

    fn wait_event(&mut self, timeout: Option<Duration>) -> Option<CmEvent<Verbs>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(e) = self.poll_event() {
                return Some(e);
            }
            let ms = match deadline {
                None => -1,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    i32::try_from(left.as_millis().max(1)).unwrap_or(i32::MAX)
                }
            };
            let mut p = libc::pollfd {
                fd: self.event_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&raw mut p, 1, ms) };
        }
    }

    fn event_fd(&self) -> RawFd {
        self.epfd.as_raw_fd()
    }
}
