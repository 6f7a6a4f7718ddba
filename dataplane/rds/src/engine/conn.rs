//! Connections (`struct rds_connection`): one per (local address, peer address, transport,
//! TOS), made on first use and kept, each with one path or (multipath transports) eight.

use super::config::{TransportKind, TransportSpec};
use super::cong::MapIdx;
use crate::addr::Addr;
use crate::path::{Path, PathId};
use crate::wire::MPATH_WORKERS;

/// A connection's identity (`rds_conn_lookup`'s key, less the namespace).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnKey {
    /// Our address.
    pub laddr: Addr,
    /// The peer's address.
    pub faddr: Addr,
    /// The transport.
    pub transport: TransportKind,
    /// Type of service.
    pub tos: u8,
}

/// One connection.
#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) key: ConnKey,
    pub(crate) spec: TransportSpec,
    pub(crate) paths: Vec<Path>,
    /// Negotiated paths (`c_npaths`): 0 until a probe answer on a multipath transport.
    pub(crate) npaths: u8,
    /// A probe ping is outstanding (`c_ping_triggered`).
    pub(crate) ping_triggered: bool,
    /// The peer's generation number (0: unknown).
    pub(crate) peer_gen: u32,
    /// The peer's last probe carried SPORT_IDX: its dialler's source ports name their path.
    pub(crate) peer_sport_idx: bool,
    /// A congestion-map update is pending (`c_map_queued`).
    pub(crate) map_queued: bool,
    pub(crate) lcong: MapIdx,
    pub(crate) fcong: MapIdx,
    /// Multipath catch-up: paths above 0 stay quiet until path 0 has transmitted every
    /// message queued before this sequence number (`c_cp0_mprds_catchup_tx_seq`).
    pub(crate) catchup_seq: Option<u64>,
}

impl Conn {
    pub(crate) fn new(
        idx: u32,
        key: ConnKey,
        spec: TransportSpec,
        lcong: MapIdx,
        fcong: MapIdx,
    ) -> Self {
        let n = if spec.multipath { MPATH_WORKERS } else { 1 };
        let paths = (0..n)
            .map(|i| {
                Path::new(
                    PathId {
                        conn: idx,
                        index: i as u8,
                    },
                    spec.path,
                    key.laddr,
                    key.faddr,
                )
            })
            .collect();
        Self {
            key,
            spec,
            paths,
            npaths: if spec.multipath { 0 } else { 1 },
            ping_triggered: false,
            peer_gen: 0,
            peer_sport_idx: false,
            map_queued: false,
            lcong,
            fcong,
            catchup_seq: None,
        }
    }
}

/// `jhash_1word` of the Linux kernel (`include/linux/jhash.h`).
pub fn jhash_1word(a: u32, initval: u32) -> u32 {
    const JHASH_INITVAL: u32 = 0xdead_beef;
    let iv = initval.wrapping_add(JHASH_INITVAL).wrapping_add(1 << 2);
    let (mut a, mut b, mut c) = (a.wrapping_add(iv), iv, iv);
    // __jhash_final
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(14));
    a ^= c;
    a = a.wrapping_sub(c.rotate_left(11));
    b ^= a;
    b = b.wrapping_sub(a.rotate_left(25));
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(16));
    a ^= c;
    a = a.wrapping_sub(c.rotate_left(4));
    b ^= a;
    b = b.wrapping_sub(a.rotate_left(14));
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(24));
    c
}

/// `RDS_MPATH_HASH(rs, n)`: the path of a socket bound to `port` among `n` (a power of 2).
pub fn mpath_hash(port: u16, initval: u32, n: usize) -> usize {
    (jhash_1word(u32::from(port), initval) as usize) & (n - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_jhash_1word_matches_the_kernel() {
        // Reference values from include/linux/jhash.h's jhash_1word, compiled as C.
        assert_eq!(jhash_1word(0, 0), 0x049396b8);
        assert_eq!(jhash_1word(4000, 0x1234_5678), 0x586e0665);
        assert_eq!(jhash_1word(65535, 7), 0x18438933);
        assert_ne!(jhash_1word(4000, 1), jhash_1word(4001, 1));
        for port in [0u16, 1, 4000, 65535] {
            assert!(mpath_hash(port, 7, 8) < 8);
            assert_eq!(mpath_hash(port, 7, 1), 0);
        }
    }
}
