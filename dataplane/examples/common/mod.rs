//! What the callgrind drivers (`rds_oneway_cost`, `rds_pingpong_cost`) share: one RDS node
//! on the shm fabric transport, configured as `dp-perf`'s RDS nodes are.

use std::net::IpAddr;
use std::path::Path;

use dataplane::fabric::shm::{Shm, ShmConfig, ShmDevice};
use dataplane::rds::fabric::{FabricConfig, FabricTransport};
use dataplane::rds::node::RdsNode;
use dataplane::rds::{RdsConfig, RdsEngine, TransportSpec};

/// dp-perf's socket buffer limit (`wmem_max` and `rmem_max`).
pub const SOCK_BUF: u32 = 16 << 20;

/// A node at `addr` over an shm device meeting in `dir`, its engine seeded `seed`, with
/// `frags` message fragments and room for `max_sockets` sockets.
pub fn node(dir: &Path, addr: IpAddr, seed: u64, frags: u32, max_sockets: u32) -> RdsNode {
    let mut cfg = RdsConfig {
        name: format!("cost-{addr}"),
        transports: vec![TransportSpec::ib()],
        seed,
        max_sockets,
        msgs: frags * 2,
        wmem_max: SOCK_BUF,
        rmem_max: SOCK_BUF,
        ..RdsConfig::default()
    };
    cfg.frags.count = frags;
    cfg.frags.rx_reserve = frags / 8;
    let mut engine = RdsEngine::new(cfg).expect("engine");
    engine.add_local_addr(addr);
    let dev = ShmDevice::open(ShmConfig {
        dir: Some(dir.to_path_buf()),
        ..ShmConfig::default()
    })
    .expect("shm device");
    let fcfg = FabricConfig {
        recv_depth: 1024,
        ..FabricConfig::default()
    };
    let t = FabricTransport::<Shm>::new(dev, &engine, fcfg).expect("transport");
    let mut n = RdsNode::new(engine);
    n.add_transport(Box::new(t)).expect("transport added");
    n
}
