//! RDS wire formats (Linux `net/rds`, described in `shared/reference/rds.md` sections 1, 2.8
//! and 3.1), as checked views and validated representations (the `dp-wire` contract).
//!
//! * [`header`]: the 48-byte [`Header`] every frame starts with, its [`HeaderRepr`], the
//!   [`Flags`], and the RFC 1071 header [`checksum`].
//! * [`exthdr`]: the extension headers packed into the header's last 16 bytes: a parser
//!   that skips what it does not know exactly as the kernel does, and a writer that packs
//!   several.
//! * [`cong`]: the 8 KiB congestion bitmap ([`CongMap`]), one bit per port.
//! * [`ib`]: RDS-IB's RDMA CM private data (`rds_ib_connect_private`, 32 bytes for IPv4, 56
//!   for IPv6) and its protocol-version negotiation.
//!
//! Every parser here takes hostile bytes: none panics, whatever the input, and each is a
//! fuzz target (`fuzz/fuzz_targets/rds_*.rs`).

pub mod cong;
pub mod exthdr;
pub mod header;
pub mod ib;

pub use cong::CongMap;
pub use exthdr::{ExtHeader, ExtIter, ExtType, ExtWriter};
pub use header::{Flags, Header, HeaderFault, HeaderRepr, checksum};
pub use ib::{IbConnPriv, IbConnPrivRepr, IbVersion};

/// Bytes in an RDS header (`sizeof(struct rds_header)`).
pub const HEADER_LEN: usize = 48;
/// Bytes of extension-header space at the end of the header (`RDS_HEADER_EXT_SPACE`).
pub const EXT_SPACE: usize = 16;
/// Fragment size (`RDS_FRAG_SIZE`): on message transports every fragment carries at most
/// this many payload bytes behind its own copy of the header.
pub const FRAG_SIZE: usize = 1 << FRAG_SHIFT;
/// `log2(FRAG_SIZE)` (`RDS_FRAG_SHIFT`).
pub const FRAG_SHIFT: u32 = 12;
/// Largest message payload, and largest RDMA transfer (`RDS_MAX_MSG_SIZE`, 1 MiB).
pub const MAX_MSG_SIZE: usize = 1 << 20;
/// Bytes of a congestion bitmap (`RDS_CONG_MAP_BYTES`): one bit per 16-bit port.
pub const CONG_MAP_BYTES: usize = 65536 / 8;
/// The reserved source port of the multipath handshake probe (`RDS_FLAG_PROBE_PORT`). Not
/// a flag bit despite its name: binding it fails with `EINVAL`, and the random port
/// allocator skips it.
pub const PROBE_PORT: u16 = 1;
/// Most paths a multipath connection uses (`RDS_MPATH_WORKERS`).
pub const MPATH_WORKERS: usize = 8;
/// Most credits one header can grant (`RDS_MAX_ADV_CREDIT`: `h_credit` is a `u8`).
pub const MAX_ADV_CREDIT: u32 = 255;
/// TCP port of RDS-TCP (`RDS_TCP_PORT`, IANA).
pub const TCP_PORT: u16 = 16385;
/// RDMA CM port of RDS-IB over IPv4 (`RDS_PORT`).
pub const IB_PORT_V4: u16 = 18634;
/// RDMA CM port of RDS-IB over IPv6 (`RDS_CM_PORT`).
pub const IB_PORT_V6: u16 = 16385;

/// Number of wire fragments a message of `len` payload bytes takes on a message transport:
/// `max(1, ceil(len / 4096))` (a zero-length message is one header-only fragment).
pub const fn frag_count(len: usize) -> usize {
    if len == 0 { 1 } else { len.div_ceil(FRAG_SIZE) }
}

/// True if (`sport`, `dport`) is a multipath handshake probe ping (`1 -> 0`) or probe pong
/// (`0 -> 1`) (`RDS_HS_PROBE`).
pub const fn is_hs_probe(sport: u16, dport: u16) -> bool {
    (sport == PROBE_PORT && dport == 0) || (sport == 0 && dport == PROBE_PORT)
}

#[cfg(test)]
mod tests;
