//! Device discovery and the opened device: [`VerbsDevice`], the public handle over the shared
//! per-device state (`dev`), and the factory of every object of the provider (protection
//! domains, completion queues, CM channels, datagram queue pairs and destinations).

use std::net::IpAddr;
use std::sync::Arc;

use crate::cm::VerbsCm;
use crate::cq::VerbsCq;
use crate::dev::{DevInner, ibv_device_names};
use crate::pd::VerbsPd;
use crate::sys;
use crate::ud::{VerbsUdDest, VerbsUdQp};
use crate::{Verbs, VerbsConfig};
use dp_fabric::error::{FabricError, Result};
use dp_fabric::traits::{Device, QpInit};
use dp_fabric::types::DeviceAttr;

/// An opened RDMA device.
///
/// Opening claims nothing: it looks the device up among librdmacm's contexts, queries its
/// limits, and probes the largest inline payload a queue pair may ask for (libibverbs
/// reports that only per queue pair). Handles are cheap to clone.
#[derive(Clone)]
pub struct VerbsDevice {
    pub(crate) inner: Arc<DevInner>,
}

impl core::fmt::Debug for VerbsDevice {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("VerbsDevice")
            .field("name", &self.inner.attr.name)
            .field("port", &self.inner.port)
            .finish()
    }
}

/// Names of the RDMA devices libibverbs sees (`ibv_get_device_list`).
///
/// # Errors
/// [`FabricError::NoDevice`] if there is none.
pub fn devices() -> Result<Vec<String>> {
    let names = ibv_device_names();
    if names.is_empty() {
        return Err(FabricError::NoDevice { name: None });
    }
    Ok(names)
}

impl VerbsDevice {
    /// Opens the device named `name` (as `ibv_devices` lists it), or the first one.
    ///
    /// # Errors
    /// [`FabricError::NoDevice`] if there is no RDMA device or none with that name;
    /// [`FabricError::Io`] if the device exists but librdmacm cannot use it (the
    /// `rdma_ucm` module is not loaded) or cannot be queried.
    pub fn open(name: Option<&str>) -> Result<Self> {
        Self::open_with(name, VerbsConfig::default())
    }

    /// Opens a device with explicit options.
    ///
    /// # Errors
    /// As [`VerbsDevice::open`], and [`FabricError::InvalidArgument`] for a zero
    /// `resolve_attempts` or `resolve_timeout`.
    pub fn open_with(name: Option<&str>, cfg: VerbsConfig) -> Result<Self> {
        if cfg.resolve_attempts == 0 || cfg.resolve_timeout.is_zero() {
            return Err(FabricError::InvalidArgument {
                what: "VerbsConfig",
                why: "resolve_attempts and resolve_timeout must be non-zero".into(),
            });
        }
        let inner = DevInner::open(name, cfg)?;
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// The device name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// The port the attributes describe (the first active port).
    pub fn port(&self) -> u8 {
        self.inner.port
    }

    /// The options the device was opened with.
    pub fn config(&self) -> &VerbsConfig {
        &self.inner.cfg
    }

    /// The IP addresses of the device's GID table, IPv4 first (on RoCE, the addresses of
    /// the network device it is bound to). Link-local IPv6 addresses are left out.
    ///
    /// # Errors
    /// If the GID table cannot be read.
    pub fn ip_addrs(&self) -> Result<Vec<IpAddr>> {
        let mut v4 = Vec::new();
        let mut v6 = Vec::new();
        for e in self.inner.gids()? {
            match sys::gid_ip(&e.gid) {
                Some(ip @ IpAddr::V4(_)) if !v4.contains(&ip) => v4.push(ip),
                Some(IpAddr::V6(ip))
                    if !ip.is_unicast_link_local() && !v6.contains(&IpAddr::V6(ip)) =>
                {
                    v6.push(IpAddr::V6(ip));
                }
                _ => {}
            }
        }
        v4.extend(v6);
        Ok(v4)
    }
}

impl Device for VerbsDevice {
    type P = Verbs;

    fn attr(&self) -> &DeviceAttr {
        &self.inner.attr
    }

    fn alloc_pd(&self) -> Result<VerbsPd> {
        VerbsPd::new(&self.inner)
    }

    fn create_cq(&self, depth: u32) -> Result<VerbsCq> {
        VerbsCq::new(&self.inner, depth)
    }

    fn create_cm_channel(&self) -> Result<VerbsCm> {
        VerbsCm::new(&self.inner)
    }

    fn create_ud_qp(
        &self,
        init: &QpInit<'_, Verbs>,
        local: IpAddr,
        qkey: u32,
    ) -> Result<VerbsUdQp> {
        VerbsUdQp::new(&self.inner, init, local, qkey)
    }

    fn resolve_ud_dest(
        &self,
        pd: &VerbsPd,
        local: IpAddr,
        remote: IpAddr,
        remote_qpn: u32,
        qkey: u32,
    ) -> Result<VerbsUdDest> {
        VerbsUdDest::resolve(&self.inner, pd, local, remote, remote_qpn, qkey)
    }
}
