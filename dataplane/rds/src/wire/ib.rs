//! RDS-IB's RDMA CM private data (`struct rds_ib_connect_private` and
//! `rds6_ib_connect_private`) and the protocol-version negotiation of `ib_cm.c`.
//!
//! Natural C alignment, all multi-byte fields big-endian:
//!
//! | IPv4 | IPv6 | bytes | field |
//! |---|---|---|---|
//! | 0 | 0 | 4 / 16 | `dp_saddr` (the sender's address) |
//! | 4 | 16 | 4 / 16 | `dp_daddr` |
//! | 8 | 32 | 1 | `dp_protocol_major` |
//! | 9 | 33 | 1 | `dp_protocol_minor` |
//! | 10 | 34 | 2 | `dp_protocol_minor_mask` (minor versions supported, `0x0003`) |
//! | 12 | 36 | 1 | `dp_tos` |
//! | 13 | 37 | 1 | reserved |
//! | 14 | 38 | 2 | reserved |
//! | 16 | 40 | 8 | `dp_ack_seq`: the last sequence the sender received, applied as an ack |
//! | 24 | 48 | 4 | `dp_credit`: initial flow-control credits, non-zero enables flow control |
//! | 28 | 52 | 4 | tail padding |
//!
//! 32 bytes for IPv4, 56 for IPv6. The active side proposes 3.1 with minor mask 3; the
//! passive side answers 4.x from the common minor mask if the proposal's major is 4,
//! accepts 3.1 as the compatibility version, and rejects anything else
//! (`RDS_RDMA_REJ_INCOMPAT`). Private data that is absent or has major 0 counts as 4.0 on
//! the passive side (an old peer, "3.0 or 2.0, we can't tell").

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Private-data bytes for IPv4 (`sizeof(struct rds_ib_connect_private)`).
pub const PRIV_LEN_V4: usize = 32;
/// Private-data bytes for IPv6 (`sizeof(struct rds6_ib_connect_private)`).
pub const PRIV_LEN_V6: usize = 56;
/// Minor versions this implementation supports (`RDS_IB_SUPPORTED_PROTOCOLS`).
pub const SUPPORTED_MINOR_MASK: u16 = 0x0003;
/// The reject reason of an incompatible version (`RDS_RDMA_REJ_INCOMPAT`), sent as the
/// consumer-defined reject's private data.
pub const REJ_INCOMPAT: i32 = 1;

/// An RDS protocol version, `major << 8 | minor`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IbVersion(pub u16);

impl IbVersion {
    /// 3.0 (`RDS_PROTOCOL_3_0`).
    pub const V3_0: Self = Self(0x0300);
    /// 3.1 (`RDS_PROTOCOL_3_1`): what the active side proposes (`RDS_PROTOCOL_VERSION`) and
    /// the compatibility version (`RDS_PROTOCOL_COMPAT_VERSION`).
    pub const V3_1: Self = Self(0x0301);
    /// 4.0 (`RDS_PROTOCOL_4_0`).
    pub const V4_0: Self = Self(0x0400);
    /// 4.1 (`RDS_PROTOCOL_4_1`).
    pub const V4_1: Self = Self(0x0401);
    /// The version the active side proposes.
    pub const PROPOSED: Self = Self::V3_1;

    /// `RDS_PROTOCOL(major, minor)`.
    pub const fn new(major: u8, minor: u8) -> Self {
        Self(((major as u16) << 8) | minor as u16)
    }
    /// The major number.
    pub const fn major(self) -> u8 {
        (self.0 >> 8) as u8
    }
    /// The minor number.
    pub const fn minor(self) -> u8 {
        self.0 as u8
    }
}

/// The peer's version is not one we speak: reject with [`REJ_INCOMPAT`] (passive side) or
/// drop the connection (active side).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IncompatibleVersion {
    /// What the peer sent (major, minor); (0, 0) when it sent no private data.
    pub peer: IbVersion,
}

impl core::fmt::Display for IncompatibleVersion {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "RDS protocol version {}.{} is not supported (3.1 and 4.x are)",
            self.peer.major(),
            self.peer.minor()
        )
    }
}

impl std::error::Error for IncompatibleVersion {}

mod field {
    /// Offsets of the common part, relative to its start (8 for IPv4, 32 for IPv6).
    pub const MAJOR: usize = 0;
    pub const MINOR: usize = 1;
    pub const MASK: usize = 2;
    pub const TOS: usize = 4;
    pub const ACK_SEQ: usize = 8;
    pub const CREDIT: usize = 16;
}

/// A checked view of RDS-IB private data.
#[derive(Debug, Clone, Copy)]
pub struct IbConnPriv<T: AsRef<[u8]>> {
    buffer: T,
    v6: bool,
}

impl<T: AsRef<[u8]>> IbConnPriv<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T, v6: bool) -> Self {
        Self { buffer, v6 }
    }

    /// Wraps a buffer after [`check_len`](Self::check_len).
    ///
    /// # Errors
    ///
    /// [`dp_wire::Error::Truncated`] below 32 (IPv4) or 56 (IPv6) bytes.
    pub fn new_checked(buffer: T, v6: bool) -> dp_wire::Result<Self> {
        let p = Self::new_unchecked(buffer, v6);
        p.check_len()?;
        Ok(p)
    }

    /// Checks the length; after this no accessor panics.
    ///
    /// # Errors
    ///
    /// [`dp_wire::Error::Truncated`] below the layout's size.
    pub fn check_len(&self) -> dp_wire::Result<()> {
        if self.buffer.as_ref().len() < Self::size(self.v6) {
            Err(dp_wire::Error::Truncated)
        } else {
            Ok(())
        }
    }

    /// Layout size for the address family.
    pub const fn size(v6: bool) -> usize {
        if v6 { PRIV_LEN_V6 } else { PRIV_LEN_V4 }
    }

    const fn cmn(&self) -> usize {
        if self.v6 { 32 } else { 8 }
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// `dp_saddr`.
    pub fn saddr(&self) -> IpAddr {
        self.addr(0)
    }
    /// `dp_daddr`.
    pub fn daddr(&self) -> IpAddr {
        self.addr(if self.v6 { 16 } else { 4 })
    }
    fn addr(&self, at: usize) -> IpAddr {
        let b = self.b();
        if self.v6 {
            let mut a = [0u8; 16];
            a.copy_from_slice(&b[at..at + 16]);
            IpAddr::V6(Ipv6Addr::from(a))
        } else {
            IpAddr::V4(Ipv4Addr::new(b[at], b[at + 1], b[at + 2], b[at + 3]))
        }
    }
    /// `dp_protocol_major` and `_minor`.
    pub fn version(&self) -> IbVersion {
        let c = self.cmn();
        IbVersion::new(self.b()[c + field::MAJOR], self.b()[c + field::MINOR])
    }
    /// `dp_protocol_minor_mask`.
    pub fn minor_mask(&self) -> u16 {
        let c = self.cmn() + field::MASK;
        u16::from_be_bytes([self.b()[c], self.b()[c + 1]])
    }
    /// `dp_tos`.
    pub fn tos(&self) -> u8 {
        self.b()[self.cmn() + field::TOS]
    }
    /// `dp_ack_seq`.
    pub fn ack_seq(&self) -> u64 {
        let c = self.cmn() + field::ACK_SEQ;
        let mut a = [0u8; 8];
        a.copy_from_slice(&self.b()[c..c + 8]);
        u64::from_be_bytes(a)
    }
    /// `dp_credit`.
    pub fn credit(&self) -> u32 {
        let c = self.cmn() + field::CREDIT;
        let mut a = [0u8; 4];
        a.copy_from_slice(&self.b()[c..c + 4]);
        u32::from_be_bytes(a)
    }
}

/// The meaning of RDS-IB private data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IbConnPrivRepr {
    /// The sender's address.
    pub saddr: IpAddr,
    /// The receiver's address.
    pub daddr: IpAddr,
    /// Protocol version: proposed (request) or chosen (reply).
    pub version: IbVersion,
    /// Minor versions the sender supports.
    pub minor_mask: u16,
    /// Type of service of the connection.
    pub tos: u8,
    /// Last sequence number the sender received on this connection (0: none).
    pub ack_seq: u64,
    /// Initial credits granted; non-zero enables flow control.
    pub credit: u32,
}

impl IbConnPrivRepr {
    /// Parses private data of the given family.
    ///
    /// # Errors
    ///
    /// [`dp_wire::Error::Truncated`] if shorter than the layout (a peer's CM layer may pad
    /// it: longer is fine). [`dp_wire::Error::Malformed`] if the addresses are of the other
    /// family than `v6` says (an IPv4-mapped IPv6 address in the IPv6 layout).
    pub fn parse(bytes: &[u8], v6: bool) -> dp_wire::Result<Self> {
        let p = IbConnPriv::new_checked(bytes, v6)?;
        let (saddr, daddr) = (p.saddr(), p.daddr());
        if v6 && (is_v4_mapped(saddr) || is_v4_mapped(daddr)) {
            return Err(dp_wire::Error::Malformed);
        }
        Ok(Self {
            saddr,
            daddr,
            version: p.version(),
            minor_mask: p.minor_mask(),
            tos: p.tos(),
            ack_seq: p.ack_seq(),
            credit: p.credit(),
        })
    }

    /// True if the addresses are IPv6 (the 56-byte layout).
    pub fn is_v6(&self) -> bool {
        self.saddr.is_ipv6()
    }

    /// Bytes [`emit`](Self::emit) writes: 32 or 56.
    pub fn buffer_len(&self) -> usize {
        IbConnPriv::<&[u8]>::size(self.is_v6())
    }

    /// Writes the private data (reserved and padding bytes zero).
    ///
    /// # Panics
    ///
    /// If `out` is shorter than [`buffer_len`](Self::buffer_len), or if the two addresses
    /// are of different families (caller bugs).
    pub fn emit(&self, out: &mut [u8]) {
        let n = self.buffer_len();
        let out = &mut out[..n];
        out.fill(0);
        let c = match (self.saddr, self.daddr) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                out[0..4].copy_from_slice(&s.octets());
                out[4..8].copy_from_slice(&d.octets());
                8
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                out[0..16].copy_from_slice(&s.octets());
                out[16..32].copy_from_slice(&d.octets());
                32
            }
            _ => panic!("RDS-IB private data needs two addresses of one family"),
        };
        out[c + field::MAJOR] = self.version.major();
        out[c + field::MINOR] = self.version.minor();
        out[c + field::MASK..c + field::MASK + 2].copy_from_slice(&self.minor_mask.to_be_bytes());
        out[c + field::TOS] = self.tos;
        out[c + field::ACK_SEQ..c + field::ACK_SEQ + 8]
            .copy_from_slice(&self.ack_seq.to_be_bytes());
        out[c + field::CREDIT..c + field::CREDIT + 4].copy_from_slice(&self.credit.to_be_bytes());
    }

    /// The private data as a fixed buffer and its length.
    pub fn to_bytes(&self) -> ([u8; PRIV_LEN_V6], usize) {
        let mut b = [0u8; PRIV_LEN_V6];
        self.emit(&mut b);
        (b, self.buffer_len())
    }
}

fn is_v4_mapped(a: IpAddr) -> bool {
    matches!(a, IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some())
}

/// The passive side's choice (`rds_ib_protocol_compatible`): from the request's private
/// data `bytes` (possibly padded by the CM), the version to run.
///
/// # Errors
///
/// [`IncompatibleVersion`] when there is no private data at all, or the proposal is
/// neither major 4 with a common minor nor 3.1.
pub fn negotiate_passive(bytes: &[u8], v6: bool) -> Result<IbVersion, IncompatibleVersion> {
    if bytes.is_empty() {
        return Err(IncompatibleVersion { peer: IbVersion(0) });
    }
    if bytes.len() < IbConnPriv::<&[u8]>::size(v6) {
        return Ok(IbVersion::V4_0);
    }
    let p = IbConnPriv::new_unchecked(bytes, v6);
    let v = p.version();
    if v.major() == 0 {
        return Ok(IbVersion::V4_0);
    }
    let mut common = p.minor_mask() & SUPPORTED_MINOR_MASK;
    if v.major() == 4 && common != 0 {
        let mut version = IbVersion::V4_0.0;
        loop {
            common >>= 1;
            if common == 0 {
                break;
            }
            version += 1;
        }
        Ok(IbVersion(version))
    } else if v == IbVersion::V3_1 {
        Ok(IbVersion::V3_1)
    } else {
        Err(IncompatibleVersion { peer: v })
    }
}

/// The active side's check of the reply (`rds_ib_cm_connect_complete`): the version the
/// reply names (or `current` if the reply has no usable private data), refused below 3.1.
///
/// # Errors
///
/// [`IncompatibleVersion`] if the resulting version is older than 3.1: drop the connection.
pub fn check_reply(
    bytes: &[u8],
    v6: bool,
    current: IbVersion,
) -> Result<IbVersion, IncompatibleVersion> {
    let mut version = current;
    if bytes.len() >= IbConnPriv::<&[u8]>::size(v6) {
        let v = IbConnPriv::new_unchecked(bytes, v6).version();
        if v.major() != 0 {
            version = v;
        }
    }
    if version < IbVersion::V3_1 {
        return Err(IncompatibleVersion { peer: version });
    }
    Ok(version)
}
