//! The state of one opened device that every object of the provider shares.
//!
//! [`DevCore`] knows nothing of the objects built on it (protection domains, queues,
//! connections): it hands out identifiers, creates and maps segments, caches the peer
//! segments several objects share, counts, and owns the control [`Service`] thread. The
//! objects hold an `Arc<DevCore>`, so the device lives until the last of them is gone.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use mempool::memory::Region;

use crate::ShmConfig;
use crate::layout::{Doorbell, SegKind};
use crate::seg::{map_segment, new_segment};
use crate::service::Service;
use crate::unix;
use crate::util::lock;
use dp_fabric::error::{FabricError, Result};
use dp_fabric::types::DeviceAttr;

/// Largest context id; QPNs are `ctx_id << 12 | index`, 24 bits in all.
pub(crate) const MAX_CTX: u32 = 4095;
/// Queue pairs per context.
pub(crate) const MAX_QP_INDEX: u32 = 4095;

/// Counters of the device, readable at any time.
#[derive(Debug, Default)]
pub struct ShmStats {
    /// Malformed or unexpected control messages from peers (each dropped the connection).
    pub malformed_cm_msgs: AtomicU64,
    /// Protocol violations a peer made through shared memory (an inbound message with
    /// impossible lengths or positions, a message beyond its credits, a datagram without
    /// a claimed receive): each failed the receive and moved the queue pair to the error
    /// state.
    pub peer_violations: AtomicU64,
    /// Connections lost because the peer process died (hang-up without a disconnect).
    pub peer_deaths: AtomicU64,
    /// Datagrams dropped (no receive posted, queue full, wrong Q_Key or dead queue pair).
    pub ud_dropped: AtomicU64,
    /// Times a SEND or WRITE with immediate waited because the peer had no receive posted.
    pub rnr_waits: AtomicU64,
}

/// What a datagram sender needs to reach one of our UD queue pairs: the answer to a
/// resolve request on the context socket.
pub(crate) struct UdExport {
    pub qkey: u32,
    /// The queue pair's slot in its receive completion queue's doorbell.
    pub recv_slot: u32,
    /// The datagram slot queue.
    pub seg: Arc<Region>,
    /// The receive completion queue's doorbell.
    pub db_seg: Arc<Region>,
}

/// Shared state of an opened device.
pub(crate) struct DevCore {
    pub cfg: ShmConfig,
    pub attr: DeviceAttr,
    pub ctx_id: u32,
    pub dir: PathBuf,
    pub _ctx_lock: File,
    pub ctx_sock_path: PathBuf,
    next_id: AtomicU64,
    qp_index: Mutex<Vec<bool>>,
    /// Our UD queue pairs, by QPN, as resolve requests see them.
    pub ud_exports: Mutex<HashMap<u32, UdExport>>,
    remote_doorbells: Mutex<HashMap<(u32, u64), Weak<Region>>>,
    pub service: Service,
    pub stats: ShmStats,
}

impl DevCore {
    pub(crate) fn new(
        cfg: ShmConfig,
        attr: DeviceAttr,
        ctx_id: u32,
        dir: PathBuf,
        ctx_lock: File,
        ctx_sock_path: PathBuf,
        service: Service,
    ) -> Self {
        Self {
            cfg,
            attr,
            ctx_id,
            dir,
            _ctx_lock: ctx_lock,
            ctx_sock_path,
            next_id: AtomicU64::new(1),
            qp_index: Mutex::new(vec![false; MAX_QP_INDEX as usize + 1]),
            ud_exports: Mutex::new(HashMap::new()),
            remote_doorbells: Mutex::new(HashMap::new()),
            service,
            stats: ShmStats::default(),
        }
    }

    /// A fresh id for protection domains, completion queues, listeners and connections.
    pub(crate) fn next_id(&self) -> u64 {
        // Relaxed: only uniqueness matters.
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Allocates a queue pair number.
    pub(crate) fn alloc_qpn(&self) -> Result<u32> {
        let mut used = lock(&self.qp_index);
        let idx = used
            .iter()
            .enumerate()
            .skip(1)
            .find(|(_, u)| !**u)
            .map(|(i, _)| i)
            .ok_or(FabricError::Exhausted {
                what: "queue pairs on this shm device",
                limit: u64::from(MAX_QP_INDEX),
                hint: "destroy idle queue pairs or open another device",
            })?;
        used[idx] = true;
        Ok((self.ctx_id << 12) | idx as u32)
    }

    /// Releases a queue pair number.
    pub(crate) fn free_qpn(&self, qpn: u32) {
        let idx = (qpn & 0xFFF) as usize;
        if let Some(u) = lock(&self.qp_index).get_mut(idx) {
            *u = false;
        }
    }

    /// Creates a zero-filled shareable segment of `len` bytes.
    pub(crate) fn new_segment(&self, what: &str, len: usize) -> Result<Arc<Region>> {
        new_segment(self.ctx_id, what, len)
    }

    /// Counts a malformed control message.
    pub(crate) fn malformed(&self) {
        // Relaxed: statistics.
        self.stats.malformed_cm_msgs.fetch_add(1, Ordering::Relaxed);
    }

    /// Maps (or reuses) a peer's completion-queue doorbell.
    pub(crate) fn map_doorbell(
        &self,
        ctx: u32,
        cq_id: u64,
        fd: OwnedFd,
        len: u64,
    ) -> Result<Arc<Region>> {
        let mut m = lock(&self.remote_doorbells);
        if let Some(r) = m.get(&(ctx, cq_id)).and_then(Weak::upgrade) {
            return Ok(r);
        }
        let r = map_segment(fd, len, 4096, "peer-doorbell")?;
        if r.len() < size_of::<Doorbell>() {
            return Err(FabricError::Protocol("peer doorbell segment too small"));
        }
        // SAFETY: the mapping is at least one Doorbell long and page aligned.
        let d = unsafe { &*r.as_ptr().cast::<Doorbell>() };
        d.hdr
            .check(SegKind::Doorbell, r.len())
            .map_err(FabricError::Protocol)?;
        m.retain(|_, w| w.strong_count() > 0);
        m.insert((ctx, cq_id), Arc::downgrade(&r));
        Ok(r)
    }
}

impl Drop for DevCore {
    fn drop(&mut self) {
        self.service.shutdown();
        unix::unlink(&self.ctx_sock_path);
    }
}
