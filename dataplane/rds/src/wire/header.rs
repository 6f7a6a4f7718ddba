//! The 48-byte RDS header (`struct rds_header`), all multi-byte fields big-endian:
//!
//! | offset | bytes | field | meaning |
//! |---|---|---|---|
//! | 0 | 8 | `h_sequence` | per-path sequence number of the message (0 on ACK-only and congestion frames) |
//! | 8 | 8 | `h_ack` | piggybacked cumulative ack (message transports; 0 on TCP) |
//! | 16 | 4 | `h_len` | payload bytes of the whole message (not of this fragment) |
//! | 20 | 2 | `h_sport` | RDS source port |
//! | 22 | 2 | `h_dport` | RDS destination port |
//! | 24 | 1 | `h_flags` | [`Flags`] |
//! | 25 | 1 | `h_credit` | flow-control credits granted to the receiver of this frame |
//! | 26 | 4 | `h_padding` | zero |
//! | 30 | 2 | `h_csum` | RFC 1071 checksum of the 48 bytes, 0 = not checksummed |
//! | 32 | 16 | `h_exthdr` | extension headers ([`super::exthdr`]) |
//!
//! [`Header`] is the checked view (accessors never panic after [`Header::check_len`]),
//! [`HeaderRepr`] the validated meaning: [`HeaderRepr::parse`] refuses a header that is
//! short, fails its checksum, or announces more than 1 MiB of payload (the bound the Linux
//! TCP receiver lacked until 2026), and [`HeaderRepr::emit`] never panics on a 48-byte
//! buffer. Emitting into a reused buffer: wrap it with [`Header::new_unchecked`], never
//! `new_checked` (the `dp-wire` contract).

use core::ops::Range;

use super::{EXT_SPACE, HEADER_LEN, MAX_MSG_SIZE};

mod field {
    use core::ops::Range;
    pub const SEQUENCE: Range<usize> = 0..8;
    pub const ACK: Range<usize> = 8..16;
    pub const LEN: Range<usize> = 16..20;
    pub const SPORT: Range<usize> = 20..22;
    pub const DPORT: Range<usize> = 22..24;
    pub const FLAGS: usize = 24;
    pub const CREDIT: usize = 25;
    pub const PADDING: Range<usize> = 26..30;
    pub const CSUM: Range<usize> = 30..32;
    pub const EXT: Range<usize> = 32..48;
}

/// Header flag bits (`h_flags`). An open set: unknown bits are kept and reported by
/// [`Flags::unknown`], never refused by the parser (the kernel ignores them too).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Flags(pub u8);

impl Flags {
    /// `RDS_FLAG_CONG_BITMAP`: the payload is the sender's 8 KiB congestion bitmap. A
    /// receiver recognises a congestion frame only when the flags are exactly this value.
    pub const CONG_BITMAP: Self = Self(0x01);
    /// `RDS_FLAG_ACK_REQUIRED`: the receiver must acknowledge at once.
    pub const ACK_REQUIRED: Self = Self(0x02);
    /// `RDS_FLAG_RETRANSMITTED`: re-sent after a connection reset; the receiver drops it
    /// if its sequence number is old.
    pub const RETRANSMITTED: Self = Self(0x04);
    /// `RDS_FLAG_HB_PING` (Oracle UEK heartbeat only; not mainline).
    pub const HB_PING: Self = Self(0x08);
    /// `RDS_FLAG_HB_PONG` (Oracle UEK heartbeat only; not mainline).
    pub const HB_PONG: Self = Self(0x10);
    /// `RDS_FLAG_EXTHDR_EXTENSION` (2026 mainline: an `RDMA_BYTES` extension is present).
    pub const EXTHDR_EXTENSION: Self = Self(0x20);
    /// The bits Linux 6.1 interprets.
    pub const KNOWN: Self = Self(0x07);

    /// No bit set.
    pub const fn empty() -> Self {
        Self(0)
    }
    /// The raw byte.
    pub const fn bits(self) -> u8 {
        self.0
    }
    /// True if every bit of `other` is set.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
    /// `self | other`.
    #[must_use]
    pub const fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }
    /// `self & !other`.
    #[must_use]
    pub const fn without(self, other: Self) -> Self {
        Self(self.0 & !other.0)
    }
    /// The bits Linux 6.1 does not interpret (UEK heartbeat bits, newer bits, garbage).
    pub const fn unknown(self) -> u8 {
        self.0 & !Self::KNOWN.0
    }
    /// True if this is a congestion-map frame: flags exactly [`Flags::CONG_BITMAP`]
    /// (`rds_ib_process_recv` and `rds_tcp_data_recv` test with `==`, not a bit test).
    pub const fn is_cong_map(self) -> bool {
        self.0 == Self::CONG_BITMAP.0
    }
}

impl core::fmt::Debug for Flags {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Flags({:#04x}", self.0)?;
        for (bit, name) in [
            (0x01, " CONG_BITMAP"),
            (0x02, " ACK_REQUIRED"),
            (0x04, " RETRANSMITTED"),
        ] {
            if self.0 & bit != 0 {
                f.write_str(name)?;
            }
        }
        f.write_str(")")
    }
}

/// The RFC 1071 Internet checksum of `bytes` (big-endian 16-bit words; an odd last byte is
/// padded with zero): the one's complement of the one's-complement sum. Over a header whose
/// `h_csum` is zero this is the value to store; over a header holding a correct checksum it
/// is 0 (`ip_fast_csum` folding to 0, which `rds_message_verify_checksum` tests).
pub fn checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut chunks = bytes.chunks_exact(2);
    for w in &mut chunks {
        sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(*last) << 8;
    }
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

/// Why a received header was refused. Small and `Copy`; the path counts each kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderFault {
    /// Fewer than 48 bytes.
    Truncated,
    /// A non-zero `h_csum` that does not verify (`recv_drop_bad_checksum`).
    BadChecksum,
    /// `h_len` above 1 MiB: no honest sender makes such a message.
    LenTooLarge,
}

impl HeaderFault {
    /// A static description.
    pub const fn reason(self) -> &'static str {
        match self {
            Self::Truncated => "RDS header shorter than 48 bytes",
            Self::BadChecksum => "RDS header checksum does not verify",
            Self::LenTooLarge => "RDS header h_len above the 1 MiB message limit",
        }
    }
}

impl core::fmt::Display for HeaderFault {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.reason())
    }
}

impl From<HeaderFault> for dp_wire::Error {
    fn from(f: HeaderFault) -> Self {
        match f {
            HeaderFault::Truncated => Self::Truncated,
            HeaderFault::BadChecksum | HeaderFault::LenTooLarge => Self::Malformed,
        }
    }
}

/// A checked view of an RDS header in a buffer.
#[derive(Debug, Clone, Copy)]
pub struct Header<T: AsRef<[u8]>> {
    buffer: T,
}

fn be64(b: &[u8], r: Range<usize>) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[r]);
    u64::from_be_bytes(a)
}

fn be32(b: &[u8], r: Range<usize>) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[r]);
    u32::from_be_bytes(a)
}

fn be16(b: &[u8], r: Range<usize>) -> u16 {
    u16::from_be_bytes([b[r.start], b[r.start + 1]])
}

impl<T: AsRef<[u8]>> Header<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    /// Wraps a buffer after [`check_len`](Self::check_len).
    ///
    /// # Errors
    ///
    /// [`dp_wire::Error::Truncated`] if the buffer holds fewer than 48 bytes.
    pub fn new_checked(buffer: T) -> dp_wire::Result<Self> {
        let h = Self::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    /// Checks that every field is inside the buffer; after this no accessor panics.
    ///
    /// # Errors
    ///
    /// [`dp_wire::Error::Truncated`] if the buffer holds fewer than 48 bytes.
    pub fn check_len(&self) -> dp_wire::Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            Err(dp_wire::Error::Truncated)
        } else {
            Ok(())
        }
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// `h_sequence`.
    pub fn sequence(&self) -> u64 {
        be64(self.buffer.as_ref(), field::SEQUENCE)
    }
    /// `h_ack`.
    pub fn ack(&self) -> u64 {
        be64(self.buffer.as_ref(), field::ACK)
    }
    /// `h_len`.
    pub fn len(&self) -> u32 {
        be32(self.buffer.as_ref(), field::LEN)
    }
    /// True if `h_len` is 0.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// `h_sport`.
    pub fn sport(&self) -> u16 {
        be16(self.buffer.as_ref(), field::SPORT)
    }
    /// `h_dport`.
    pub fn dport(&self) -> u16 {
        be16(self.buffer.as_ref(), field::DPORT)
    }
    /// `h_flags`.
    pub fn flags(&self) -> Flags {
        Flags(self.buffer.as_ref()[field::FLAGS])
    }
    /// `h_credit`.
    pub fn credit(&self) -> u8 {
        self.buffer.as_ref()[field::CREDIT]
    }
    /// `h_padding`.
    pub fn padding(&self) -> [u8; 4] {
        let mut p = [0u8; 4];
        p.copy_from_slice(&self.buffer.as_ref()[field::PADDING]);
        p
    }
    /// `h_csum` as stored (big-endian on the wire).
    pub fn csum(&self) -> u16 {
        be16(self.buffer.as_ref(), field::CSUM)
    }
    /// The 16-byte extension area.
    pub fn ext_area(&self) -> [u8; EXT_SPACE] {
        let mut e = [0u8; EXT_SPACE];
        e.copy_from_slice(&self.buffer.as_ref()[field::EXT]);
        e
    }

    /// `rds_message_verify_checksum`: true if `h_csum` is 0 (not checksummed) or the
    /// checksum over all 48 bytes folds to zero.
    pub fn verify_checksum(&self) -> bool {
        self.csum() == 0 || checksum(&self.buffer.as_ref()[..HEADER_LEN]) == 0
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    /// Sets `h_sequence`.
    pub fn set_sequence(&mut self, v: u64) {
        self.buffer.as_mut()[field::SEQUENCE].copy_from_slice(&v.to_be_bytes());
    }
    /// Sets `h_ack`.
    pub fn set_ack(&mut self, v: u64) {
        self.buffer.as_mut()[field::ACK].copy_from_slice(&v.to_be_bytes());
    }
    /// Sets `h_len`.
    pub fn set_len(&mut self, v: u32) {
        self.buffer.as_mut()[field::LEN].copy_from_slice(&v.to_be_bytes());
    }
    /// Sets `h_sport`.
    pub fn set_sport(&mut self, v: u16) {
        self.buffer.as_mut()[field::SPORT].copy_from_slice(&v.to_be_bytes());
    }
    /// Sets `h_dport`.
    pub fn set_dport(&mut self, v: u16) {
        self.buffer.as_mut()[field::DPORT].copy_from_slice(&v.to_be_bytes());
    }
    /// Sets `h_flags`.
    pub fn set_flags(&mut self, v: Flags) {
        self.buffer.as_mut()[field::FLAGS] = v.0;
    }
    /// Sets `h_credit`.
    pub fn set_credit(&mut self, v: u8) {
        self.buffer.as_mut()[field::CREDIT] = v;
    }
    /// Zeroes `h_padding`.
    pub fn clear_padding(&mut self) {
        self.buffer.as_mut()[field::PADDING].fill(0);
    }
    /// Sets `h_csum` to a raw value.
    pub fn set_csum(&mut self, v: u16) {
        self.buffer.as_mut()[field::CSUM].copy_from_slice(&v.to_be_bytes());
    }
    /// Sets the extension area.
    pub fn set_ext_area(&mut self, ext: &[u8; EXT_SPACE]) {
        self.buffer.as_mut()[field::EXT].copy_from_slice(ext);
    }

    /// `rds_message_make_checksum`: zeroes `h_csum`, then stores the checksum of the 48
    /// bytes. Call it after every other field is final (the kernel re-does it when it
    /// writes `h_credit` into a fragment).
    pub fn fill_checksum(&mut self) {
        self.set_csum(0);
        let c = checksum(&self.buffer.as_ref()[..HEADER_LEN]);
        self.set_csum(c);
    }
}

/// The meaning of a header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeaderRepr {
    /// `h_sequence`.
    pub sequence: u64,
    /// `h_ack`.
    pub ack: u64,
    /// `h_len`: payload bytes of the whole message.
    pub len: u32,
    /// `h_sport`.
    pub sport: u16,
    /// `h_dport`.
    pub dport: u16,
    /// `h_flags`.
    pub flags: Flags,
    /// `h_credit`.
    pub credit: u8,
    /// The extension area, raw (iterate it with [`super::ExtIter`]).
    pub ext: [u8; EXT_SPACE],
}

impl HeaderRepr {
    /// Parses a received header.
    ///
    /// # Errors
    ///
    /// [`HeaderFault::Truncated`] below 48 bytes, [`HeaderFault::BadChecksum`] if a
    /// non-zero checksum does not verify, [`HeaderFault::LenTooLarge`] if `h_len` exceeds
    /// 1 MiB. The padding is not checked (the kernel ignores it).
    pub fn parse<T: AsRef<[u8]>>(h: &Header<T>) -> Result<Self, HeaderFault> {
        h.check_len().map_err(|_| HeaderFault::Truncated)?;
        if !h.verify_checksum() {
            return Err(HeaderFault::BadChecksum);
        }
        let len = h.len();
        if len as usize > MAX_MSG_SIZE {
            return Err(HeaderFault::LenTooLarge);
        }
        Ok(Self {
            sequence: h.sequence(),
            ack: h.ack(),
            len,
            sport: h.sport(),
            dport: h.dport(),
            flags: h.flags(),
            credit: h.credit(),
            ext: h.ext_area(),
        })
    }

    /// Parses the first 48 bytes of `bytes` (see [`parse`](Self::parse)).
    ///
    /// # Errors
    ///
    /// As [`parse`](Self::parse).
    pub fn parse_bytes(bytes: &[u8]) -> Result<Self, HeaderFault> {
        Self::parse(&Header::new_unchecked(bytes))
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header, with zero padding and, if `with_checksum`, a checksum (else
    /// `h_csum` = 0, as TCP sends it).
    ///
    /// # Panics
    ///
    /// Never, on a buffer of at least [`buffer_len`](Self::buffer_len) bytes; a shorter
    /// buffer is a caller bug and panics on the slice index.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Header<T>, with_checksum: bool) {
        h.set_sequence(self.sequence);
        h.set_ack(self.ack);
        h.set_len(self.len);
        h.set_sport(self.sport);
        h.set_dport(self.dport);
        h.set_flags(self.flags);
        h.set_credit(self.credit);
        h.clear_padding();
        h.set_ext_area(&self.ext);
        if with_checksum {
            h.fill_checksum();
        } else {
            h.set_csum(0);
        }
    }

    /// The header as 48 bytes (see [`emit`](Self::emit)).
    pub fn to_bytes(&self, with_checksum: bool) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        self.emit(&mut Header::new_unchecked(&mut b[..]), with_checksum);
        b
    }

    /// True for an ACK-only frame of a message transport: ports 0 and no payload in the
    /// frame (`rds_ib_process_recv` tests the frame's own byte count, not `h_len`).
    pub const fn is_ack_only(&self, frame_payload_len: usize) -> bool {
        self.sport == 0 && self.dport == 0 && frame_payload_len == 0
    }
}
