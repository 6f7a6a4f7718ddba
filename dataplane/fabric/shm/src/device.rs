//! The shm device: a context id in the rendezvous directory, the control service thread,
//! and the caches of peer segments this process has mapped.

use std::fs::{self, File};
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use crate::cm::ShmCm;
use crate::core::{DevCore, MAX_CTX, ShmStats};
use crate::cq::ShmCq;
use crate::layout::{DEFAULT_KEY_SLOTS, UD_MTU};
use crate::msg::Msg;
use crate::pd::ShmPd;
use crate::service::{Registry, Service, Watch, wait_readable};
use crate::ud::{ShmUdDest, ShmUdQp, answer_resolve};
use crate::{Shm, ShmConfig, unix};
use dp_fabric::error::{FabricError, Result};
use dp_fabric::traits::{Device, QpInit};
use dp_fabric::types::DeviceAttr;

/// An opened shm device: this process's endpoint in a rendezvous directory.
///
/// Opening one claims a context id (a lock file in `<dir>/ctx/`, released by the kernel
/// if the process dies), listens on `<dir>/ctx/<id>.sock` for datagram address
/// resolution, and starts one control thread that blocks in `poll(2)` on every control
/// socket of the device. That thread never touches the data path.
#[derive(Clone)]
pub struct ShmDevice {
    pub(crate) inner: Arc<DevCore>,
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
            max_sge: crate::MAX_SGE as u32,
            max_cqe: 1 << 16,
            max_inline_data: crate::MAX_INLINE as u32,
            max_msg_size: 1 << 31,
            max_send_size: u64::from(cfg.bounce_bytes),
            mtu: UD_MTU as u32,
            max_req_private_data: 196,
            max_rep_private_data: 196,
            max_rej_private_data: 148,
            // A window is an entry of the domain's key table, which every queue pair of
            // the domain checks (module `pd`).
            mw_domain_wide: true,
        };
        let service = Service::new().map_err(|e| FabricError::Io {
            op: "creating the control service",
            source: e,
        })?;
        let inner = Arc::new(DevCore::new(
            cfg,
            attr,
            ctx_id,
            dir,
            ctx_lock,
            ctx_sock_path,
            service,
        ));
        let ctx_fd = ctx_sock.as_raw_fd();
        inner.service.registry().add(
            ctx_fd,
            Arc::new(CtxSock {
                sock: ctx_sock,
                dev: Arc::downgrade(&inner),
            }),
        );
        inner
            .service
            .start(format!("dp-shm-svc-{}", inner.ctx_id))
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

    /// A protection domain with room for `slots` registrations (1 to 4096). The default
    /// ([`Device::alloc_pd`]) has room for 256 and costs 16 KiB; each slot costs 64 bytes
    /// of shared memory.
    ///
    /// # Errors
    /// `slots` out of range; creating the key table's segment.
    pub fn alloc_pd_with_slots(&self, slots: usize) -> Result<ShmPd> {
        ShmPd::new(&self.inner, slots)
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
        ShmPd::new(&self.inner, DEFAULT_KEY_SLOTS)
    }

    fn create_cq(&self, depth: u32) -> Result<ShmCq> {
        ShmCq::new(&self.inner, depth)
    }

    fn create_cm_channel(&self) -> Result<ShmCm> {
        ShmCm::new(&self.inner)
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

/// The context socket: datagram senders connect to it to resolve our UD queue pairs.
struct CtxSock {
    sock: OwnedFd,
    dev: Weak<DevCore>,
}

impl Watch for CtxSock {
    fn ready(&self, _reg: &Registry, _fd: RawFd, buf: &mut [u8]) {
        let Some(dev) = self.dev.upgrade() else {
            return;
        };
        while let Ok(Some(c)) = unix::accept(self.sock.as_raw_fd()) {
            if !wait_readable(c.as_raw_fd(), 1000) {
                continue;
            }
            let mut fds = Vec::new();
            if let Ok(Some(n)) = unix::recv(c.as_raw_fd(), buf, &mut fds) {
                match Msg::decode(&buf[..n]) {
                    Ok(Msg::UdResolve { qpn }) if fds.is_empty() => answer_resolve(&dev, &c, qpn),
                    _ => dev.malformed(),
                }
            }
        }
    }
}
