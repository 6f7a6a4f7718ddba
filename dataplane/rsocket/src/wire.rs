//! librdmacm rsocket wire formats (see `rsocket.c` of rdma-core, described in
//! `shared/reference/rsocket.md` section 1).
//!
//! * [`ConnData`]: the 40-byte connection private data, big-endian.
//! * [`RsSge`] (16 bytes: addr, key, length) and [`RsIomap`] (24 bytes: offset + SGE): RDMA-
//!   written into the peer's target buffer **in the reader's native byte order**, so the
//!   writer byte-swaps when the two hosts differ.
//! * [`RsMsg`]: the 32-bit immediate: 3-bit [`RsOp`], 29-bit data.
//! * [`DsUdpHeader`] (16/28 bytes, on the UDP socket) and [`DsHeader`] (8/24 bytes, on UD
//!   queue pairs): the datagram rsocket headers.

use core::ops::Range;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use dp_wire::enum_with_unknown;
use dp_wire::{Error, Result};

type Field = Range<usize>;

// ------------------------------------------------------------------------------------------
// Constants
// ------------------------------------------------------------------------------------------

/// The only connection-data version.
pub const RS_CONN_VERSION: u8 = 1;
/// Flag: the sender of the connection data is big-endian.
pub const RS_CONN_FLAG_NET: u8 = 1;
/// Flag: the sender exposes an iomap table after its target SGL.
pub const RS_CONN_FLAG_IOMAP: u8 = 2;
/// Entries in the target SGL.
pub const RS_SGL_SIZE: u32 = 2;
/// Tag of every UDP-path datagram header.
pub const DS_UDP_TAG: u32 = 0x5555_5555;
/// UDP header length for IPv4.
pub const DS_UDP_IPV4_HDR_LEN: u8 = 16;
/// UDP header length for IPv6.
pub const DS_UDP_IPV6_HDR_LEN: u8 = 28;
/// UD header length for IPv4.
pub const DS_IPV4_HDR_LEN: u8 = 8;
/// UD header length for IPv6.
pub const DS_IPV6_HDR_LEN: u8 = 24;

/// Encodes a size into rsocket's 8-bit scaled form: 0..=128 literally, larger values as
/// `0x80 | (v >> 8)` (multiples of 256 up to 32512).
pub const fn scale_encode(v: u32) -> u8 {
    if v <= 128 {
        v as u8
    } else {
        let s = v >> 8;
        if s > 0x7F { 0xFF } else { 0x80 | s as u8 }
    }
}

/// Decodes [`scale_encode`]: like librdmacm's `rs_scale_to_value`, any byte up to 128 is
/// literal (so `0x80` is 128, not 0), larger ones are `(e & 0x7F) << 8`.
pub const fn scale_decode(e: u8) -> u32 {
    if e <= 128 {
        e as u32
    } else {
        ((e & 0x7F) as u32) << 8
    }
}

/// Rounds `v` to the nearest value the scaled encoding can carry (as `RDMA_IOMAPSIZE` does).
pub const fn scale_round(v: u32) -> u32 {
    scale_decode(scale_encode(v))
}

// ------------------------------------------------------------------------------------------
// Immediate messages
// ------------------------------------------------------------------------------------------

enum_with_unknown! {
    /// The 3-bit operation of an immediate message.
    pub enum RsOp(u32) {
        /// Bytes written into the current target buffer.
        Data = 0,
        /// Reserved ("more data").
        RsvdDataMore = 1,
        /// Local tag for plain writes (never on the wire).
        Write = 2,
        /// Reserved ("direct receive, more").
        RsvdDraMore = 3,
        /// Credit update: the new absolute credit limit.
        Sgl = 4,
        /// Reserved.
        Rsvd = 5,
        /// An iomap entry was written (data = its index).
        IomapSgl = 6,
        /// Control message (data = [`RsCtrl`]).
        Ctrl = 7,
    }
}

enum_with_unknown! {
    /// Control codes carried by [`RsOp::Ctrl`].
    pub enum RsCtrl(u32) {
        /// The peer closed both directions.
        Disconnect = 0,
        /// Keepalive (a local tag only: keepalives carry no immediate).
        Keepalive = 1,
        /// The peer stopped sending (half close).
        Shutdown = 2,
    }
}

/// A 32-bit immediate: `op << 29 | data`. Posted in network byte order by the provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RsMsg(pub u32);

impl RsMsg {
    /// Mask of the data field.
    pub const DATA_MASK: u32 = 0x1FFF_FFFF;

    /// Builds a message; data beyond 29 bits is truncated, as librdmacm does.
    pub const fn new(op: u32, data: u32) -> Self {
        Self((op << 29) | (data & Self::DATA_MASK))
    }

    /// Builds a message from a named op.
    pub fn with(op: RsOp, data: u32) -> Self {
        Self::new(u32::from(op), data)
    }

    /// The operation.
    pub fn op(self) -> RsOp {
        RsOp::from(self.0 >> 29)
    }

    /// The 29-bit data.
    pub const fn data(self) -> u32 {
        self.0 & Self::DATA_MASK
    }
}

// ------------------------------------------------------------------------------------------
// SGE and iomap entries
// ------------------------------------------------------------------------------------------

/// `struct rs_sge`: a remote buffer (address, rkey, length). Also the target-SGL
/// descriptor, whose `length` counts entries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RsSge {
    /// Remote virtual address.
    pub addr: u64,
    /// Remote key.
    pub key: u32,
    /// Bytes (or entries).
    pub length: u32,
}

impl RsSge {
    /// Encoded length.
    pub const LEN: usize = 16;

    /// Reads an entry stored in `big_endian` order; `None` if `b` is short.
    pub fn read(b: &[u8], big_endian: bool) -> Option<Self> {
        let b: &[u8; 16] = b.get(..16)?.try_into().ok()?;
        let (a, k, l) = (
            <[u8; 8]>::try_from(&b[0..8]).ok()?,
            <[u8; 4]>::try_from(&b[8..12]).ok()?,
            <[u8; 4]>::try_from(&b[12..16]).ok()?,
        );
        Some(if big_endian {
            Self {
                addr: u64::from_be_bytes(a),
                key: u32::from_be_bytes(k),
                length: u32::from_be_bytes(l),
            }
        } else {
            Self {
                addr: u64::from_le_bytes(a),
                key: u32::from_le_bytes(k),
                length: u32::from_le_bytes(l),
            }
        })
    }

    /// Writes the entry in `big_endian` order into `b[..16]`.
    ///
    /// # Panics
    /// If `b` is shorter than 16 bytes (callers size it with [`RsSge::LEN`]).
    pub fn write(&self, b: &mut [u8], big_endian: bool) {
        if big_endian {
            b[0..8].copy_from_slice(&self.addr.to_be_bytes());
            b[8..12].copy_from_slice(&self.key.to_be_bytes());
            b[12..16].copy_from_slice(&self.length.to_be_bytes());
        } else {
            b[0..8].copy_from_slice(&self.addr.to_le_bytes());
            b[8..12].copy_from_slice(&self.key.to_le_bytes());
            b[12..16].copy_from_slice(&self.length.to_le_bytes());
        }
    }

    /// The 16 bytes, in `big_endian` order.
    pub fn to_bytes(&self, big_endian: bool) -> [u8; 16] {
        let mut b = [0u8; 16];
        self.write(&mut b, big_endian);
        b
    }
}

/// `struct rs_iomap`: an application offset and the remote buffer it maps to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RsIomap {
    /// Application-visible offset.
    pub offset: u64,
    /// The buffer.
    pub sge: RsSge,
}

impl RsIomap {
    /// Encoded length.
    pub const LEN: usize = 24;

    /// Reads an entry stored in `big_endian` order.
    pub fn read(b: &[u8], big_endian: bool) -> Option<Self> {
        let o = <[u8; 8]>::try_from(b.get(0..8)?).ok()?;
        Some(Self {
            offset: if big_endian {
                u64::from_be_bytes(o)
            } else {
                u64::from_le_bytes(o)
            },
            sge: RsSge::read(b.get(8..24)?, big_endian)?,
        })
    }

    /// The 24 bytes, in `big_endian` order.
    pub fn to_bytes(&self, big_endian: bool) -> [u8; 24] {
        let mut b = [0u8; 24];
        if big_endian {
            b[0..8].copy_from_slice(&self.offset.to_be_bytes());
        } else {
            b[0..8].copy_from_slice(&self.offset.to_le_bytes());
        }
        self.sge.write(&mut b[8..24], big_endian);
        b
    }
}

/// True if this host is big-endian.
pub const HOST_BIG_ENDIAN: bool = cfg!(target_endian = "big");

// ------------------------------------------------------------------------------------------
// Connection data
// ------------------------------------------------------------------------------------------

mod conn_field {
    use super::Field;
    pub(super) const VERSION: usize = 0;
    pub(super) const FLAGS: usize = 1;
    pub(super) const CREDITS: Field = 2..4;
    pub(super) const RESERVED: Field = 4..7;
    pub(super) const IOMAP_SIZE: usize = 7;
    pub(super) const TARGET_SGL: Field = 8..24;
    pub(super) const DATA_BUF: Field = 24..40;
}

/// A typed view of `struct rs_conn_data` (40 bytes, big-endian).
#[derive(Debug, Clone)]
pub struct ConnData<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ConnData<T> {
    /// Length of the structure.
    pub const LEN: usize = 40;

    /// Wraps without checking.
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    /// Wraps after [`check_len`](Self::check_len).
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks the buffer holds all 40 bytes.
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < Self::LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    /// `version`.
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[conn_field::VERSION]
    }
    /// `flags`.
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[conn_field::FLAGS]
    }
    /// `credits` (the sender's receive-queue size).
    pub fn credits(&self) -> u16 {
        let b = &self.buffer.as_ref()[conn_field::CREDITS];
        u16::from_be_bytes([b[0], b[1]])
    }
    /// `target_iomap_size`, scaled.
    pub fn iomap_size_raw(&self) -> u8 {
        self.buffer.as_ref()[conn_field::IOMAP_SIZE]
    }
    /// `target_sgl`.
    pub fn target_sgl(&self) -> RsSge {
        RsSge::read(&self.buffer.as_ref()[conn_field::TARGET_SGL], true).unwrap_or_default()
    }
    /// `data_buf`.
    pub fn data_buf(&self) -> RsSge {
        RsSge::read(&self.buffer.as_ref()[conn_field::DATA_BUF], true).unwrap_or_default()
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ConnData<T> {
    fn b(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }
    /// Sets `version`.
    pub fn set_version(&mut self, v: u8) {
        self.b()[conn_field::VERSION] = v;
    }
    /// Sets `flags`.
    pub fn set_flags(&mut self, v: u8) {
        self.b()[conn_field::FLAGS] = v;
    }
    /// Sets `credits`.
    pub fn set_credits(&mut self, v: u16) {
        self.b()[conn_field::CREDITS].copy_from_slice(&v.to_be_bytes());
    }
    /// Zeroes the reserved bytes.
    pub fn clear_reserved(&mut self) {
        self.b()[conn_field::RESERVED].fill(0);
    }
    /// Sets `target_iomap_size` (already scaled).
    pub fn set_iomap_size_raw(&mut self, v: u8) {
        self.b()[conn_field::IOMAP_SIZE] = v;
    }
    /// Sets `target_sgl`.
    pub fn set_target_sgl(&mut self, s: &RsSge) {
        s.write(&mut self.b()[conn_field::TARGET_SGL], true);
    }
    /// Sets `data_buf`.
    pub fn set_data_buf(&mut self, s: &RsSge) {
        s.write(&mut self.b()[conn_field::DATA_BUF], true);
    }
}

/// The meaning of a connection-data block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnDataRepr {
    /// The sender is big-endian (`RS_CONN_FLAG_NET`).
    pub big_endian: bool,
    /// The sender exposes an iomap table (`RS_CONN_FLAG_IOMAP`).
    pub iomap: bool,
    /// Initial credits granted (the sender's receive-queue size).
    pub credits: u16,
    /// Iomap table entries (decoded from the scaled byte).
    pub iomap_size: u32,
    /// Where the peer RDMA-writes our credit SGEs: address, rkey, and `length` = entries.
    pub target_sgl: RsSge,
    /// The first half of the sender's receive buffer.
    pub data_buf: RsSge,
}

/// The largest credit count a peer may announce: librdmacm clamps its receive queue to
/// `RS_QP_MAX_SIZE` (0xFFFE), and 16-bit credit arithmetic needs a count below 2^16.
pub const MAX_CONN_CREDITS: u16 = 0xFFFE;

/// The largest receive-buffer half a peer may announce: librdmacm's buffer sizes are C
/// `int`s (so a half is below 2^30), and ours are capped to match.
pub const MAX_RBUF_HALF: u32 = 1 << 30;

/// The largest iomap table the scaled 8-bit encoding can describe.
pub const MAX_IOMAP_SIZE: u32 = scale_decode(0xFF);

/// Why connection data is unusable (see [`ConnDataRepr::validate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BadConnData {
    /// No initial credits: the peer could never be sent anything.
    NoCredits,
    /// More credits than a receive queue can have ([`MAX_CONN_CREDITS`]).
    TooManyCredits,
    /// A target SGL with other than [`RS_SGL_SIZE`] entries.
    TargetSglEntries,
    /// A target list (SGEs and iomap table) whose addresses wrap past 2^64.
    TargetListWraps,
    /// An empty receive-buffer half.
    EmptyReceiveBuffer,
    /// A receive-buffer half beyond [`MAX_RBUF_HALF`].
    ReceiveBufferTooLarge,
    /// A receive-buffer half whose addresses wrap past 2^64.
    ReceiveBufferWraps,
    /// An iomap table beyond what the encoding carries ([`MAX_IOMAP_SIZE`]).
    IomapTooLarge,
}

impl BadConnData {
    /// A static description.
    pub const fn reason(self) -> &'static str {
        match self {
            Self::NoCredits => "connection data grants no credits",
            Self::TooManyCredits => "connection data grants more credits than a queue holds",
            Self::TargetSglEntries => "connection data target SGL does not have 2 entries",
            Self::TargetListWraps => "connection data target list wraps the address space",
            Self::EmptyReceiveBuffer => "connection data receive buffer is empty",
            Self::ReceiveBufferTooLarge => "connection data receive buffer is too large",
            Self::ReceiveBufferWraps => "connection data receive buffer wraps the address space",
            Self::IomapTooLarge => "connection data iomap table is too large",
        }
    }
}

impl core::fmt::Display for BadConnData {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.reason())
    }
}

impl ConnDataRepr {
    /// Parses; rejects versions other than 1 ([`Error::Version`]) and anything
    /// [`validate`](Self::validate) refuses ([`Error::Malformed`]).
    pub fn parse<T: AsRef<[u8]>>(p: &ConnData<T>) -> Result<Self> {
        p.check_len()?;
        if p.version() != RS_CONN_VERSION {
            return Err(Error::Version);
        }
        let target_sgl = p.target_sgl();
        let flags = p.flags();
        let r = Self {
            big_endian: flags & RS_CONN_FLAG_NET != 0,
            iomap: flags & RS_CONN_FLAG_IOMAP != 0,
            credits: p.credits(),
            iomap_size: if flags & RS_CONN_FLAG_IOMAP != 0 {
                scale_decode(p.iomap_size_raw())
            } else {
                0
            },
            target_sgl,
            data_buf: p.data_buf(),
        };
        r.validate().map_err(|_| Error::Malformed)?;
        Ok(r)
    }

    /// Checks that every field is within what a librdmacm peer can send: credits in
    /// `1..=`[`MAX_CONN_CREDITS`], a target SGL of [`RS_SGL_SIZE`] entries, a receive half
    /// in `1..=`[`MAX_RBUF_HALF`] bytes, an iomap table of at most [`MAX_IOMAP_SIZE`]
    /// entries, and no region (target list with its iomap table, receive half) that wraps
    /// the 64-bit address space.
    ///
    /// # Errors
    /// The first field found unusable.
    pub fn validate(&self) -> core::result::Result<(), BadConnData> {
        if self.credits == 0 {
            return Err(BadConnData::NoCredits);
        }
        if self.credits > MAX_CONN_CREDITS {
            return Err(BadConnData::TooManyCredits);
        }
        if self.target_sgl.length != RS_SGL_SIZE {
            return Err(BadConnData::TargetSglEntries);
        }
        if self.iomap_size > MAX_IOMAP_SIZE {
            return Err(BadConnData::IomapTooLarge);
        }
        let target_len = u64::from(RS_SGL_SIZE) * RsSge::LEN as u64
            + u64::from(self.iomap_size) * RsIomap::LEN as u64;
        if self.target_sgl.addr.checked_add(target_len).is_none() {
            return Err(BadConnData::TargetListWraps);
        }
        if self.data_buf.length == 0 {
            return Err(BadConnData::EmptyReceiveBuffer);
        }
        if self.data_buf.length > MAX_RBUF_HALF {
            return Err(BadConnData::ReceiveBufferTooLarge);
        }
        if self
            .data_buf
            .addr
            .checked_add(u64::from(self.data_buf.length))
            .is_none()
        {
            return Err(BadConnData::ReceiveBufferWraps);
        }
        Ok(())
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        ConnData::<&[u8]>::LEN
    }

    /// Writes the 40 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut ConnData<T>) {
        p.set_version(RS_CONN_VERSION);
        let mut flags = 0;
        if self.big_endian {
            flags |= RS_CONN_FLAG_NET;
        }
        if self.iomap {
            flags |= RS_CONN_FLAG_IOMAP;
        }
        p.set_flags(flags);
        p.set_credits(self.credits);
        p.clear_reserved();
        p.set_iomap_size_raw(scale_encode(self.iomap_size));
        p.set_target_sgl(&self.target_sgl);
        p.set_data_buf(&self.data_buf);
    }

    /// The 40 bytes.
    pub fn to_bytes(&self) -> [u8; 40] {
        let mut b = [0u8; 40];
        self.emit(&mut ConnData::new_unchecked(&mut b[..]));
        b
    }
}

// ------------------------------------------------------------------------------------------
// Datagram headers
// ------------------------------------------------------------------------------------------

/// `struct ds_udp_header`: prefixed to data sent on the UDP socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DsUdpHeader {
    /// [`RsOp::Data`] (payload follows) or [`RsOp::Ctrl`] (header-only reply).
    pub op: RsOp,
    /// The sender's UD queue pair number (24 bits).
    pub qpn: u32,
    /// The sender's source address.
    pub addr: IpAddr,
}

impl DsUdpHeader {
    /// Encoded length: 16 (IPv4) or 28 (IPv6).
    pub const fn buffer_len(&self) -> usize {
        match self.addr {
            IpAddr::V4(_) => DS_UDP_IPV4_HDR_LEN as usize,
            IpAddr::V6(_) => DS_UDP_IPV6_HDR_LEN as usize,
        }
    }

    /// Parses and validates: tag, version/length consistency. `expect_v6` is the family of
    /// the address `recvfrom` returned: the version must match it, as librdmacm requires.
    pub fn parse(b: &[u8], expect_v6: bool) -> Result<(Self, usize)> {
        if b.len() < DS_UDP_IPV4_HDR_LEN as usize {
            return Err(Error::Truncated);
        }
        let tag = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        if tag != DS_UDP_TAG {
            return Err(Error::Malformed);
        }
        let (version, op, len) = (b[4], b[5], b[6]);
        let qpn = u32::from_be_bytes([b[8], b[9], b[10], b[11]]) & 0x00FF_FFFF;
        let addr = match (version, len, expect_v6) {
            (4, DS_UDP_IPV4_HDR_LEN, false) => {
                IpAddr::V4(Ipv4Addr::new(b[12], b[13], b[14], b[15]))
            }
            (6, DS_UDP_IPV6_HDR_LEN, true) => {
                let a: [u8; 16] = b
                    .get(12..28)
                    .ok_or(Error::Truncated)?
                    .try_into()
                    .map_err(|_| Error::Truncated)?;
                IpAddr::V6(Ipv6Addr::from(a))
            }
            _ => return Err(Error::Malformed),
        };
        Ok((
            Self {
                op: RsOp::from(u32::from(op)),
                qpn,
                addr,
            },
            usize::from(len),
        ))
    }

    /// Writes the header into `b[..buffer_len()]`.
    pub fn emit(&self, b: &mut [u8]) {
        b[0..4].copy_from_slice(&DS_UDP_TAG.to_be_bytes());
        b[5] = u32::from(self.op) as u8;
        b[7] = 0;
        b[8..12].copy_from_slice(&(self.qpn & 0x00FF_FFFF).to_be_bytes());
        match self.addr {
            IpAddr::V4(a) => {
                b[4] = 4;
                b[6] = DS_UDP_IPV4_HDR_LEN;
                b[12..16].copy_from_slice(&a.octets());
            }
            IpAddr::V6(a) => {
                b[4] = 6;
                b[6] = DS_UDP_IPV6_HDR_LEN;
                b[12..28].copy_from_slice(&a.octets());
            }
        }
    }
}

/// `struct ds_header`: prefixed to data sent over a UD queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DsHeader {
    /// The sender's UDP port.
    pub port: u16,
    /// The sender's address.
    pub addr: IpAddr,
    /// IPv6 flow information (0 for IPv4).
    pub flowinfo: u32,
}

impl DsHeader {
    /// Encoded length: 8 (IPv4) or 24 (IPv6).
    pub const fn buffer_len(&self) -> usize {
        match self.addr {
            IpAddr::V4(_) => DS_IPV4_HDR_LEN as usize,
            IpAddr::V6(_) => DS_IPV6_HDR_LEN as usize,
        }
    }

    /// Parses; returns the header and its length.
    pub fn parse(b: &[u8]) -> Result<(Self, usize)> {
        if b.len() < DS_IPV4_HDR_LEN as usize {
            return Err(Error::Truncated);
        }
        let (version, len) = (b[0], b[1]);
        let port = u16::from_be_bytes([b[2], b[3]]);
        match (version, len) {
            (4, DS_IPV4_HDR_LEN) => Ok((
                Self {
                    port,
                    addr: IpAddr::V4(Ipv4Addr::new(b[4], b[5], b[6], b[7])),
                    flowinfo: 0,
                },
                DS_IPV4_HDR_LEN as usize,
            )),
            (6, DS_IPV6_HDR_LEN) => {
                let f: [u8; 4] = b
                    .get(4..8)
                    .ok_or(Error::Truncated)?
                    .try_into()
                    .map_err(|_| Error::Truncated)?;
                let a: [u8; 16] = b
                    .get(8..24)
                    .ok_or(Error::Truncated)?
                    .try_into()
                    .map_err(|_| Error::Truncated)?;
                Ok((
                    Self {
                        port,
                        addr: IpAddr::V6(Ipv6Addr::from(a)),
                        flowinfo: u32::from_be_bytes(f),
                    },
                    DS_IPV6_HDR_LEN as usize,
                ))
            }
            _ => Err(Error::Malformed),
        }
    }

    /// Writes the header into `b[..buffer_len()]`.
    pub fn emit(&self, b: &mut [u8]) {
        b[2..4].copy_from_slice(&self.port.to_be_bytes());
        match self.addr {
            IpAddr::V4(a) => {
                b[0] = 4;
                b[1] = DS_IPV4_HDR_LEN;
                b[4..8].copy_from_slice(&a.octets());
            }
            IpAddr::V6(a) => {
                b[0] = 6;
                b[1] = DS_IPV6_HDR_LEN;
                b[4..8].copy_from_slice(&self.flowinfo.to_be_bytes());
                b[8..24].copy_from_slice(&a.octets());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The layout of `rs_conn_data` byte by byte, as librdmacm's rs_format_conn_data writes
    /// it on a little-endian host with rq_size 384, iomap size 0.
    #[test]
    fn conn_data_bytes_match_reference_layout() {
        let r = ConnDataRepr {
            big_endian: false,
            iomap: true,
            credits: 384,
            iomap_size: 0,
            target_sgl: RsSge {
                addr: 0x0000_7f00_1122_3000,
                key: 0x0102_0304,
                length: 2,
            },
            data_buf: RsSge {
                addr: 0x0000_7f00_aabb_c000,
                key: 0x0a0b_0c0d,
                length: 65536,
            },
        };
        let b = r.to_bytes();
        let expect: [u8; 40] = [
            1, 2, 0x01, 0x80, 0, 0, 0,
            0, // version, flags IOMAP, credits BE 384, reserved, iomap 0
            0x00, 0x00, 0x7f, 0x00, 0x11, 0x22, 0x30, 0x00, // target_sgl.addr BE
            0x01, 0x02, 0x03, 0x04, // key
            0x00, 0x00, 0x00, 0x02, // length = 2 entries
            0x00, 0x00, 0x7f, 0x00, 0xaa, 0xbb, 0xc0, 0x00, // data_buf.addr
            0x0a, 0x0b, 0x0c, 0x0d, // key
            0x00, 0x01, 0x00, 0x00, // length = half of a 128 KiB rbuf
        ];
        assert_eq!(b, expect);
        assert_eq!(
            ConnDataRepr::parse(&ConnData::new_checked(&b[..]).unwrap()),
            Ok(r)
        );
    }

    #[test]
    fn conn_data_rejects_other_versions_and_short_buffers() {
        let mut b = ConnDataRepr {
            big_endian: true,
            iomap: false,
            credits: 16,
            iomap_size: 0,
            target_sgl: RsSge {
                addr: 1,
                key: 2,
                length: 2,
            },
            data_buf: RsSge::default(),
        }
        .to_bytes();
        assert_eq!(b[1], RS_CONN_FLAG_NET);
        b[0] = 2;
        assert_eq!(
            ConnDataRepr::parse(&ConnData::new_unchecked(&b[..])),
            Err(Error::Version)
        );
        assert_eq!(
            ConnData::new_checked(&b[..39]).map(|_| ()),
            Err(Error::Truncated)
        );
    }

    #[test]
    fn conn_data_parse_bounds_every_field() {
        let good = ConnDataRepr {
            big_endian: false,
            iomap: true,
            credits: 384,
            iomap_size: 32512,
            target_sgl: RsSge {
                addr: 0x7f00_0000_0000,
                key: 1,
                length: 2,
            },
            data_buf: RsSge {
                addr: 0x7f00_1000_0000,
                key: 2,
                length: MAX_RBUF_HALF,
            },
        };
        let parse =
            |r: &ConnDataRepr| ConnDataRepr::parse(&ConnData::new_unchecked(&r.to_bytes()[..]));
        assert_eq!(parse(&good), Ok(good));
        type Edit = fn(&mut ConnDataRepr);
        let cases: [(Edit, BadConnData); 8] = [
            (|r| r.credits = 0, BadConnData::NoCredits),
            (|r| r.credits = 0xFFFF, BadConnData::TooManyCredits),
            (|r| r.target_sgl.length = 3, BadConnData::TargetSglEntries),
            (
                |r| r.target_sgl.addr = u64::MAX - 31,
                BadConnData::TargetListWraps,
            ),
            (|r| r.data_buf.length = 0, BadConnData::EmptyReceiveBuffer),
            (
                |r| r.data_buf.length = MAX_RBUF_HALF + 1,
                BadConnData::ReceiveBufferTooLarge,
            ),
            (
                |r| r.data_buf.addr = u64::MAX - 5,
                BadConnData::ReceiveBufferWraps,
            ),
            (
                |r| r.iomap_size = MAX_IOMAP_SIZE + 1,
                BadConnData::IomapTooLarge,
            ),
        ];
        for (edit, why) in cases {
            let mut r = good;
            edit(&mut r);
            assert_eq!(r.validate(), Err(why), "{why}");
            if why != BadConnData::IomapTooLarge {
                // (The scaled byte cannot carry an oversized table.)
                assert_eq!(parse(&r), Err(Error::Malformed), "{why}");
            }
        }
        // A table that ends exactly at the top of the address space is fine.
        let mut r = good;
        r.iomap_size = 0;
        r.target_sgl.addr = u64::MAX - 32;
        assert_eq!(r.validate(), Ok(()));
    }

    #[test]
    fn iomap_size_scaling_matches_librdmacm() {
        for (v, e) in [
            (0, 0),
            (1, 1),
            (128, 128),
            (256, 0x81),
            (300, 0x81),
            (32512, 0xFF),
        ] {
            assert_eq!(scale_encode(v), e, "encode {v}");
        }
        assert_eq!(scale_round(200), 128);
        assert_eq!(scale_round(300), 256);
        assert_eq!(scale_decode(0xFF), 32512);
    }

    #[test]
    fn immediates_match_reference_layout() {
        assert_eq!(RsMsg::with(RsOp::Data, 4096).0, 0x0000_1000);
        assert_eq!(RsMsg::with(RsOp::Sgl, 384 + 10).0, 0x8000_018A);
        assert_eq!(RsMsg::with(RsOp::IomapSgl, 3).0, 0xC000_0003);
        assert_eq!(
            RsMsg::with(RsOp::Ctrl, u32::from(RsCtrl::Disconnect)).0,
            0xE000_0000
        );
        assert_eq!(
            RsMsg::with(RsOp::Ctrl, u32::from(RsCtrl::Shutdown)).0,
            0xE000_0002
        );
        assert_eq!(RsMsg(0xE000_0002).op(), RsOp::Ctrl);
        assert_eq!(RsCtrl::from(RsMsg(0xE000_0002).data()), RsCtrl::Shutdown);
        assert_eq!(RsMsg(0x3FFF_FFFF).op(), RsOp::RsvdDataMore);
        assert_eq!(RsMsg::new(0, 0xFFFF_FFFF).data(), RsMsg::DATA_MASK);
    }

    #[test]
    fn sge_and_iomap_native_and_swapped() {
        let s = RsSge {
            addr: 0x1122_3344_5566_7788,
            key: 0xAABB_CCDD,
            length: 0x10,
        };
        let le = s.to_bytes(false);
        assert_eq!(&le[..8], &0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(&le[8..12], &[0xDD, 0xCC, 0xBB, 0xAA]);
        let be = s.to_bytes(true);
        assert_eq!(&be[..8], &0x1122_3344_5566_7788u64.to_be_bytes());
        assert_eq!(RsSge::read(&be, true), Some(s));
        assert_eq!(RsSge::read(&le, false), Some(s));
        let m = RsIomap {
            offset: 4096,
            sge: s,
        };
        let b = m.to_bytes(true);
        assert_eq!(&b[..8], &4096u64.to_be_bytes());
        assert_eq!(RsIomap::read(&b, true), Some(m));
        assert_eq!(RsIomap::read(&b[..23], true), None);
    }

    #[test]
    fn datagram_headers_match_reference_layout() {
        let h = DsUdpHeader {
            op: RsOp::Data,
            qpn: 0x12_3456,
            addr: "10.1.2.3".parse().unwrap(),
        };
        let mut b = [0u8; 16];
        h.emit(&mut b);
        assert_eq!(
            b,
            [
                0x55, 0x55, 0x55, 0x55, 4, 0, 16, 0, 0, 0x12, 0x34, 0x56, 10, 1, 2, 3
            ]
        );
        assert_eq!(DsUdpHeader::parse(&b, false), Ok((h, 16)));
        assert_eq!(DsUdpHeader::parse(&b, true), Err(Error::Malformed));
        let c = DsUdpHeader {
            op: RsOp::Ctrl,
            qpn: 7,
            addr: "::1".parse().unwrap(),
        };
        let mut b6 = [0u8; 28];
        c.emit(&mut b6);
        assert_eq!(&b6[4..8], &[6, 7, 28, 0]);
        assert_eq!(DsUdpHeader::parse(&b6, true), Ok((c, 28)));

        let d = DsHeader {
            port: 7174,
            addr: "192.168.0.9".parse().unwrap(),
            flowinfo: 0,
        };
        let mut b = [0u8; 8];
        d.emit(&mut b);
        assert_eq!(b, [4, 8, 0x1C, 0x06, 192, 168, 0, 9]);
        assert_eq!(DsHeader::parse(&b), Ok((d, 8)));
        let d6 = DsHeader {
            port: 1,
            addr: "fe80::1".parse().unwrap(),
            flowinfo: 0x12345,
        };
        let mut b = [0u8; 24];
        d6.emit(&mut b);
        assert_eq!(&b[..8], &[6, 24, 0, 1, 0, 1, 0x23, 0x45]);
        assert_eq!(DsHeader::parse(&b), Ok((d6, 24)));
    }

    proptest! {
        #[test]
        fn parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64), v6 in any::<bool>()) {
            let _ = ConnData::new_checked(&bytes[..]).and_then(|p| ConnDataRepr::parse(&p));
            let _ = DsUdpHeader::parse(&bytes, v6);
            let _ = DsHeader::parse(&bytes);
            let _ = RsSge::read(&bytes, v6);
            let _ = RsIomap::read(&bytes, v6);
        }

        #[test]
        fn conn_data_roundtrip(credits in any::<u16>(), a in any::<u64>(), k in any::<u32>(), l in any::<u32>(), be in any::<bool>(), io in 0u32..=128) {
            let r = ConnDataRepr { big_endian: be, iomap: true, credits, iomap_size: io,
                target_sgl: RsSge { addr: a, key: k, length: 2 }, data_buf: RsSge { addr: !a, key: !k, length: l } };
            let parsed = ConnDataRepr::parse(&ConnData::new_unchecked(&r.to_bytes()[..]));
            match r.validate() {
                Ok(()) => prop_assert_eq!(parsed, Ok(r)),
                Err(_) => prop_assert_eq!(parsed, Err(Error::Malformed)),
            }
        }

        #[test]
        fn valid_conn_data_roundtrips(credits in 1..=MAX_CONN_CREDITS, a in 0..=u64::MAX / 2, k in any::<u32>(), l in 1..=MAX_RBUF_HALF, be in any::<bool>(), io in 0u32..=128) {
            let r = ConnDataRepr { big_endian: be, iomap: true, credits, iomap_size: io,
                target_sgl: RsSge { addr: a, key: k, length: 2 }, data_buf: RsSge { addr: a + 4096, key: !k, length: l } };
            prop_assert_eq!(ConnDataRepr::parse(&ConnData::new_unchecked(&r.to_bytes()[..])), Ok(r));
        }
    }
}
