//! `kind = "rds_sender"` and `kind = "rds_receiver"`: messages as RDS datagrams between
//! stages, possibly in different processes.
//!
//! Each RDS stage is an RDS node of its own ([`RdsNode`]: an engine owning the IP address of
//! the stage's `bind`, with the fabric transport on the configured provider), driven from the
//! stage's poll on its lcore: one [`RdsNode::poll`] per call, then the socket calls, then
//! [`RdsNode::flush`] so that what was sent leaves in the same iteration. The node's memory
//! (fragments, message records) is allocated once when the stage is built.
//!
//! One message is one datagram: the 40-byte header and the payload, the frame of
//! [`crate::msg`]. When its input ends, a sender sends one end-of-stream datagram
//! ([`END_OF_STREAM`], shorter than any frame so it cannot be mistaken for one) and finishes
//! once every byte it sent has been acknowledged; a receiver with `senders = N` finishes after
//! N of them. Datagrams that are neither are a peer's bytes that failed the frame check: they
//! are dropped and counted (`dropped`), never trusted.
//!
//! `info.rs` answers `dpctl rds-info` from the stage's lcore, through the stage's `InfoSlot`
//! (`stage/info.rs`).

mod info;
mod receiver;
mod sender;

use std::net::{IpAddr, SocketAddr};

use dataplane::fabric::Provider;
use dataplane::rds::fabric::{FabricConfig, FabricTransport};
use dataplane::rds::node::RdsNode;
use dataplane::rds::{RdsConfig, RdsEngine, TransportSpec};

pub use receiver::RdsReceiver;
pub use sender::RdsSender;

use super::env::FabricDev;
use crate::error::RunError;

/// The datagram a sender sends after its last message.
pub const END_OF_STREAM: &[u8; 8] = b"DPCTLEOS";

/// Message payload memory of a node: 4 KiB fragments, 32 MiB.
const FRAGS: u32 = 8192;

/// An RDS node owning `ip`, with the fabric transport on `fabric`; `sock_buf` is the largest
/// socket buffer its sockets may set.
pub(super) fn node(
    fabric: &FabricDev,
    stage: &str,
    ip: IpAddr,
    sock_buf: u32,
) -> Result<RdsNode, RunError> {
    let fail = |what: &str, e: String| RunError::Rds {
        stage: stage.to_owned(),
        message: format!("{what}: {e}"),
    };
    let mut cfg = RdsConfig {
        name: format!("dpctl-rds-{stage}"),
        transports: vec![TransportSpec::ib()],
        // Nodes that talk must not share a seed: mix in the address and the process.
        seed: seed(ip),
        max_sockets: 16,
        msgs: FRAGS * 2,
        wmem_max: sock_buf,
        rmem_max: sock_buf,
        ..RdsConfig::default()
    };
    cfg.frags.count = FRAGS;
    cfg.frags.rx_reserve = FRAGS / 8;
    let mut engine =
        RdsEngine::new(cfg).map_err(|e| fail("creating the RDS engine", e.to_string()))?;
    engine.add_local_addr(ip);
    match fabric {
        FabricDev::Shm(d) => attach::<dataplane::fabric::shm::Shm>(engine, d.clone()),
        #[cfg(feature = "verbs")]
        FabricDev::Verbs(d) => attach::<dataplane::fabric::verbs::Verbs>(engine, d.clone()),
    }
    .map_err(|e| fail("attaching the fabric transport", e))
}

fn attach<P: Provider>(engine: RdsEngine, dev: P::Device) -> Result<RdsNode, String> {
    let fcfg = FabricConfig {
        recv_depth: 1024,
        ..FabricConfig::default()
    };
    let t = FabricTransport::<P>::new(dev, &engine, fcfg).map_err(|e| e.to_string())?;
    let mut n = RdsNode::new(engine);
    n.add_transport(Box::new(t)).map_err(|e| e.to_string())?;
    Ok(n)
}

/// Opens the stage's one RDS socket on `node` and binds it to `bind`.
fn bind_socket(
    node: &mut RdsNode,
    stage: &str,
    bind: SocketAddr,
) -> Result<dataplane::rds::RdsSocket, RunError> {
    let fail = |e: dataplane::rds::RdsError| RunError::Rds {
        stage: stage.to_owned(),
        message: format!("binding an RDS socket to {bind}: {e}"),
    };
    let e = node.engine_mut();
    let sock = e.socket().map_err(fail)?;
    e.bind(sock, bind).map_err(fail)?;
    Ok(sock)
}

fn seed(ip: IpAddr) -> u64 {
    let a = match ip {
        IpAddr::V4(v) => u64::from(u32::from(v)),
        IpAddr::V6(v) => {
            let x = u128::from(v);
            (x as u64) ^ ((x >> 64) as u64)
        }
    };
    let t = lcore::time::MonotonicClock::read_nanos();
    (a.rotate_left(17) ^ u64::from(std::process::id()) ^ t).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}
