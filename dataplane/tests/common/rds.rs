//! The set-up of the RDS tests over the fabric transport on the shm provider
//! (`rds_fabric`, `rds_rdma`): nodes (engines with their own addresses) in one process,
//! meeting through a shm device directory per test.
//!
//! Each test file owns a [`Lab`]: a name prefix and a `10.<subnet>.0.0/24` of its own, so
//! test binaries running at the same time share no directory, region name or address.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use dataplane::fabric::shm::{Shm, ShmConfig, ShmDevice};
use dataplane::rds::fabric::{FabricConfig, FabricTransport};
use dataplane::rds::node::{BlockingNode, RdsNode};
use dataplane::rds::{RdsConfig, RdsEngine, RdsSocket, TransportSpec};
use lcore::PollMode;
use mempool::memory::Region;

/// One test file's names and addresses.
pub struct Lab {
    /// Names the directories (`dp-<prefix>-<pid>-<tag>`), the engines (`<prefix>-<addr>`)
    /// and the progress threads (`<prefix>`).
    prefix: &'static str,
    /// The addresses are `10.<subnet>.0.<last>`.
    subnet: u8,
}

impl Lab {
    /// A lab naming everything after `prefix`, with addresses in `10.<subnet>.0.0/24`.
    pub const fn new(prefix: &'static str, subnet: u8) -> Self {
        Self { prefix, subnet }
    }

    /// The shm device directory of the test `tag` (created; the nodes of one test meet
    /// there).
    pub fn dir(&self, tag: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("dp-{}-{}-{tag}", self.prefix, std::process::id()));
        let _ = std::fs::create_dir_all(&d);
        d
    }

    /// The address `10.<subnet>.0.<last>`.
    pub fn ip(&self, last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, self.subnet, 0, last))
    }

    /// An engine serving `addr` on the IB transport, with send and receive buffers that
    /// may grow to 16 MiB.
    pub fn engine(&self, addr: IpAddr, seed: u64) -> RdsEngine {
        let cfg = RdsConfig {
            name: format!("{}-{addr}", self.prefix),
            transports: vec![TransportSpec::ib()],
            seed,
            wmem_max: 16 << 20,
            rmem_max: 16 << 20,
            ..RdsConfig::default()
        };
        let mut e = RdsEngine::new(cfg).expect("engine");
        e.add_local_addr(addr);
        e
    }

    /// A node on the default fabric configuration, driven by a progress thread in hybrid
    /// mode.
    pub fn node(&self, dir: &Path, addr: IpAddr, seed: u64) -> BlockingNode {
        self.node_with(dir, addr, seed, FabricConfig::default())
    }

    /// [`Lab::node`] on the fabric configuration `fcfg`.
    pub fn node_with(
        &self,
        dir: &Path,
        addr: IpAddr,
        seed: u64,
        fcfg: FabricConfig,
    ) -> BlockingNode {
        self.spawn(self.build(dir, addr, seed, fcfg, None))
    }

    /// [`Lab::node`] with the RDMA window `window` exposed.
    pub fn node_with_window(
        &self,
        dir: &Path,
        addr: IpAddr,
        seed: u64,
        window: Arc<Region>,
    ) -> BlockingNode {
        let n = self.build(dir, addr, seed, FabricConfig::default(), Some(window));
        self.spawn(n)
    }

    /// A node on the default fabric configuration polled by hand (no progress thread), so
    /// a test decides what it sees when.
    pub fn manual_node(&self, dir: &Path, addr: IpAddr, seed: u64) -> RdsNode {
        self.build(dir, addr, seed, FabricConfig::default(), None)
    }

    fn build(
        &self,
        dir: &Path,
        addr: IpAddr,
        seed: u64,
        fcfg: FabricConfig,
        window: Option<Arc<Region>>,
    ) -> RdsNode {
        let mut e = self.engine(addr, seed);
        let mut t = FabricTransport::<Shm>::new(device(dir), &e, fcfg).expect("transport");
        if let Some(w) = window {
            t.expose_window(&mut e, w).expect("window exposed");
        }
        let mut n = RdsNode::new(e);
        n.add_transport(Box::new(t)).expect("transport added");
        n
    }

    fn spawn(&self, n: RdsNode) -> BlockingNode {
        BlockingNode::spawn(n, PollMode::hybrid_default(), self.prefix).expect("progress thread")
    }
}

/// The shm device meeting in `dir`.
pub fn device(dir: &Path) -> ShmDevice {
    ShmDevice::open(ShmConfig {
        dir: Some(dir.to_path_buf()),
        ..ShmConfig::default()
    })
    .expect("shm device")
}

/// A socket of `n` bound to `at`, with room for a 1 MiB message (RDS counts half of
/// SO_SNDBUF, as Linux does).
pub fn sock(n: &BlockingNode, at: SocketAddr) -> RdsSocket {
    n.with(|n, now| {
        let e = n.engine_mut();
        let s = e.socket().expect("socket");
        e.bind(s, at).expect("bind");
        e.set_sndbuf(now, s, 4 << 20).expect("SO_SNDBUF");
        e.set_rcvbuf(now, s, 4 << 20).expect("SO_RCVBUF");
        s
    })
}
