//! The fabric provider a client/server benchmark runs on (`--provider`), and opening its
//! device: shared by the fabric tests and `rstream`.

use clap::ValueEnum;
use dataplane::fabric::FabricError;

use crate::PerfError;

/// Which provider carries the test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProviderKind {
    /// Software RDMA through shared memory (one host).
    Shm,
    /// Real RDMA hardware through rdma-core (feature `verbs`).
    Verbs,
}

impl ProviderKind {
    /// The `--provider` value.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Shm => "shm",
            Self::Verbs => "verbs",
        }
    }
}

/// Maps a device-open failure: no device or a provider not built in is a usage problem
/// (status 2, the message says how to get one); anything else is a fabric failure.
pub(crate) fn open_err(e: FabricError) -> PerfError {
    use FabricError as F;
    match e {
        F::NoDevice { .. } | F::ProviderNotBuilt { .. } => PerfError::Unavailable(e.to_string()),
        e => PerfError::Fabric(e.to_string()),
    }
}

/// Opens the verbs device named by `--device` (or the first one).
#[cfg(feature = "verbs")]
pub(crate) fn open_verbs(
    device: Option<&str>,
) -> Result<dataplane::fabric::verbs::VerbsDevice, PerfError> {
    dataplane::fabric::verbs::VerbsDevice::open(device).map_err(open_err)
}

/// Without the `verbs` feature: the error that says how to get it.
#[cfg(not(feature = "verbs"))]
pub(crate) fn open_verbs(_device: Option<&str>) -> Result<std::convert::Infallible, PerfError> {
    Err(open_err(FabricError::ProviderNotBuilt {
        provider: "verbs",
        feature: "verbs",
    }))
}

/// The address a verbs `--pair` server binds and the client connects to: the device's first
/// IPv4 address (RDMA CM cannot route loopback to a device).
#[cfg(feature = "verbs")]
pub(crate) fn verbs_pair_ip(
    dev: &dataplane::fabric::verbs::VerbsDevice,
) -> Result<std::net::IpAddr, PerfError> {
    dev.ip_addrs()
        .map_err(|e| PerfError::Fabric(e.to_string()))?
        .into_iter()
        .find(std::net::IpAddr::is_ipv4)
        .ok_or_else(|| {
            PerfError::Unavailable(format!(
                "RDMA device {} has no IPv4 address: give its netdev one (ip addr add ...), \
                 or run --server and --client by hand",
                dev.name()
            ))
        })
}
