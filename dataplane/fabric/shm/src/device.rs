//! The shm device: a context id in the rendezvous directory, the control service thread,
//! and the caches of peer segments this process has mapped.

use std::collections::HashMap;
use std::fs::{self, File};
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use mempool::memory::{Region, RegionConfig};

use crate::cq::ShmCq;
use crate::layout::{Doorbell, UD_MTU};
use crate::pd::{RemotePd, ShmPd};
use crate::service::Service;
use crate::ud::{ShmUdDest, ShmUdQp};
use crate::{Shm, ShmConfig, unix};
use dp_fabric::error::{FabricError, Result};
use dp_fabric::traits::{Device, QpInit};
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
    /// Connections lost because the peer process died (hang-up without a disconnect).
    pub peer_deaths: AtomicU64,
    /// Datagrams dropped (no receive posted, queue full, wrong Q_Key or dead queue pair).
    pub ud_dropped: AtomicU64,
    /// Times a SEND or WRITE with immediate waited because the peer had no receive posted.
    pub rnr_waits: AtomicU64,
}

/// Locks a mutex, ignoring poisoning (every critical section here leaves the data
/// consistent before anything that could panic).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) struct DevInner {
    pub cfg: ShmConfig,
    pub attr: DeviceAttr,
    pub ctx_id: u32,
    pub dir: PathBuf,
    _ctx_lock: File,
    pub ctx_sock_path: PathBuf,
    next_id: AtomicU64,
    qp_index: Mutex<Vec<bool>>,
    pub ud_qps: Mutex<HashMap<u32, Weak<super::ud::UdCore>>>,
    pub remote_pds: Mutex<HashMap<(u32, u64), Weak<RemotePd>>>,
    pub remote_doorbells: Mutex<HashMap<(u32, u64), Weak<Region>>>,
    pub service: Service,
    pub stats: ShmStats,
}

impl DevInner {
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
        let name = format!("shm-{}-{what}", self.ctx_id);
        let r = Region::new(
            &RegionConfig::new(name, len)
                .shareable(true)
                .no_huge()
                .quiet(),
        )
        .map_err(|e| FabricError::Io {
            op: "creating a shared segment",
            source: std::io::Error::other(e),
        })?;
        Ok(Arc::new(r))
    }

    /// Maps a peer's segment.
    pub(crate) fn map_segment(
        &self,
        fd: OwnedFd,
        len: u64,
        page: u64,
        what: &str,
    ) -> Result<Arc<Region>> {
        let len = usize::try_from(len).map_err(|_| FabricError::Protocol("segment too large"))?;
        let page = usize::try_from(page).map_err(|_| FabricError::Protocol("bad page size"))?;
        let r = Region::from_shared_quiet(fd, len, page, what).map_err(|e| FabricError::Io {
            op: "mapping a peer segment",
            source: std::io::Error::other(e),
        })?;
        Ok(Arc::new(r))
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
        let r = self.map_segment(fd, len, 4096, "peer-doorbell")?;
        if r.len() < size_of::<Doorbell>() {
            return Err(FabricError::Protocol("peer doorbell segment too small"));
        }
        // SAFETY: the mapping is at least one Doorbell long and page aligned.
        let d = unsafe { &*r.as_ptr().cast::<Doorbell>() };
        d.hdr
            .check(super::layout::SegKind::Doorbell, r.len())
            .map_err(FabricError::Protocol)?;
        m.retain(|_, w| w.strong_count() > 0);
        m.insert((ctx, cq_id), Arc::downgrade(&r));
        Ok(r)
    }
}

impl Drop for DevInner {
    fn drop(&mut self) {
        self.service.shutdown();
        unix::unlink(&self.ctx_sock_path);
    }
}

/// An opened shm device: this process's endpoint in a rendezvous directory.
///
/// Opening one claims a context id (a lock file in `<dir>/ctx/`, released by the kernel
/// if the process dies), listens on `<dir>/ctx/<id>.sock` for datagram address
/// resolution, and starts one control thread that blocks in `poll(2)` on every control
/// socket of the device. That thread never touches the data path.
#[derive(Clone)]
pub struct ShmDevice {
    pub(crate) inner: Arc<DevInner>,
}

impl core::fmt::Debug for ShmDevice {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ShmDevice")
            .field("ctx_id", &self.inner.ctx_id)
            .field("dir", &self.inner.dir)
            .finish()
    }
}

/// The default rendezvous directory: `$DP_SHM_DIR`, else `$XDG_RUNTIME_DIR/dataplane`,
/// else `/tmp/dataplane-<uid>`.
pub fn default_rendezvous_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("DP_SHM_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
        return Path::new(&d).join("dataplane");
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    PathBuf::from(format!("/tmp/dataplane-{uid}"))
}

fn make_dirs(dir: &Path) -> Result<()> {
    for d in [dir.to_path_buf(), dir.join("ctx"), dir.join("listen")] {
        match fs::DirBuilder::new().recursive(true).mode(0o700).create(&d) {
            Ok(()) => {}
            Err(e) => {
                return Err(FabricError::Io {
                    op: "creating the shm rendezvous directory",
                    source: e,
                });
            }
        }
    }
    let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o700));
    Ok(())
}

fn claim_ctx(dir: &Path) -> Result<(u32, File)> {
    for id in 1..=MAX_CTX {
        let p = dir.join("ctx").join(format!("{id}.lock"));
        let f = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&p)
            .map_err(|e| FabricError::Io {
                op: "creating a context lock file",
                source: e,
            })?;
        // SAFETY: flock on a descriptor we own; no pointers.
        let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if r == 0 {
            return Ok((id, f));
        }
    }
    Err(FabricError::Exhausted {
        what: "shm device contexts in the rendezvous directory",
        limit: u64::from(MAX_CTX),
        hint: "close unused devices, or use another rendezvous directory",
    })
}

impl ShmDevice {
    /// Opens a device in the configured rendezvous directory.
    pub fn open(cfg: ShmConfig) -> Result<Self> {
        if cfg.bounce_bytes < 4096 || cfg.bounce_bytes > 1 << 30 {
            return Err(FabricError::InvalidArgument {
                what: "bounce_bytes",
                why: format!("{} is outside 4096..=1 GiB", cfg.bounce_bytes),
            });
        }
        let dir = cfg.dir.clone().unwrap_or_else(default_rendezvous_dir);
        make_dirs(&dir)?;
        let (ctx_id, ctx_lock) = claim_ctx(&dir)?;
        let ctx_sock_path = dir.join("ctx").join(format!("{ctx_id}.sock"));
        unix::unlink(&ctx_sock_path);
        let ctx_sock = unix::listen(&ctx_sock_path, 64).map_err(|e| FabricError::Io {
            op: "listening on the context socket",
            source: e,
        })?;
        let attr = DeviceAttr {
            name: cfg.name.clone(),
            provider: "shm",
            max_qp_wr: 16384,
            max_sge: super::MAX_SGE as u32,
            max_cqe: 1 << 16,
            max_inline_data: super::MAX_INLINE as u32,
            max_msg_size: 1 << 31,
            max_send_size: u64::from(cfg.bounce_bytes),
            mtu: UD_MTU as u32,
            max_req_private_data: 196,
            max_rep_private_data: 196,
            max_rej_private_data: 148,
        };
        let service = Service::new().map_err(|e| FabricError::Io {
            op: "creating the control service",
            source: e,
        })?;
        let inner = Arc::new(DevInner {
            cfg,
            attr,
            ctx_id,
            dir,
            _ctx_lock: ctx_lock,
            ctx_sock_path,
            next_id: AtomicU64::new(1),
            qp_index: Mutex::new(vec![false; MAX_QP_INDEX as usize + 1]),
            ud_qps: Mutex::new(HashMap::new()),
            remote_pds: Mutex::new(HashMap::new()),
            remote_doorbells: Mutex::new(HashMap::new()),
            service,
            stats: ShmStats::default(),
        });
        inner
            .service
            .start(&inner, ctx_sock)
            .map_err(|e| FabricError::Io {
                op: "starting the control service thread",
                source: e,
            })?;
        Ok(Self { inner })
    }

    /// Opens a device with the default configuration.
    pub fn open_default() -> Result<Self> {
        Self::open(ShmConfig::default())
    }

    /// The context id claimed in the rendezvous directory.
    pub fn ctx_id(&self) -> u32 {
        self.inner.ctx_id
    }

    /// The rendezvous directory.
    pub fn rendezvous_dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Device counters.
    pub fn stats(&self) -> &ShmStats {
        &self.inner.stats
    }
}

impl Device for ShmDevice {
    type P = Shm;

    fn attr(&self) -> &DeviceAttr {
        &self.inner.attr
    }

    fn alloc_pd(&self) -> Result<ShmPd> {
        ShmPd::new(&self.inner)
    }

    fn create_cq(&self, depth: u32) -> Result<ShmCq> {
        ShmCq::new(&self.inner, depth)
    }

    fn create_cm_channel(&self) -> Result<super::cm::ShmCm> {
        super::cm::ShmCm::new(&self.inner)
    }

    fn create_ud_qp(&self, init: &QpInit<'_, Shm>, local: IpAddr, qkey: u32) -> Result<ShmUdQp> {
        ShmUdQp::new(&self.inner, init, local, qkey)
    }

    fn resolve_ud_dest(
        &self,
        _pd: &ShmPd,
        _local: IpAddr,
        remote: IpAddr,
        remote_qpn: u32,
        qkey: u32,
    ) -> Result<ShmUdDest> {
        ShmUdDest::resolve(&self.inner, remote, remote_qpn, qkey)
    }
}
