//! Extension headers in the last 16 bytes of the RDS header (`rds_message_next_extension`,
//! `rds_message_add_extension`).
//!
//! The area is a sequence of `[type: u8][payload]`, packed from byte 0, ended by type 0
//! (`RDS_EXTHDR_NONE`) or by the end of the 16 bytes. There is no length byte: the type
//! implies the payload length:
//!
//! | type | name | payload |
//! |---|---|---|
//! | 0 | `NONE` | end |
//! | 1 | `VERSION` | be32 protocol version (historical) |
//! | 2 | `RDMA` | be32 R_Key of the RDMA operation that preceded this message |
//! | 3 | `RDMA_DEST` | be32 R_Key, be32 offset the receiver may RDMA to or from |
//! | 4 | `RDMA_BYTES` | be32 byte count, u8 direction, 3 pad (2026 mainline) |
//! | 5 | `NPATHS` | be16 paths the sender supports (multipath probe) |
//! | 6 | `GEN_NUM` | be32 sender's generation number (multipath probe) |
//! | 7 | `CAP_BITS` | be32 capability bits (Oracle UEK) |
//! | 8 | `SPORT_IDX` | one dummy byte: "my TCP source port encodes the path index" (2025) |
//!
//! Parsing follows the kernel: stop at type 0, at a type of 16 or more, or where a payload
//! would run past byte 16; a type below 16 with no entry (9..=15) has no payload and is
//! skipped one byte at a time. Linux 6.1's table knows types 1, 2, 3, 5 and 6 only, so it
//! would read the payload bytes of a newer kernel's 4, 7 or 8 as further types; this parser
//! uses the newer lengths, which is what a newer peer means (a deviation from 6.1 in how
//! much of a newer header is understood, never in what an older one means).
//!
//! Writing packs several extensions back to back over a zeroed area (the 2026 kernel's
//! behaviour; for most of RDS's history the kernel refused a second extension, so a
//! receiver must accept any subset, which this parser does).

use dp_wire::enum_with_unknown;

use super::EXT_SPACE;

enum_with_unknown! {
    /// Extension type codes (`RDS_EXTHDR_*`); types at or above [`EXT_TYPE_MAX`] end a parse.
    pub enum ExtType(u8) {
        /// `RDS_EXTHDR_NONE`: end of the extensions.
        None = 0,
        /// `RDS_EXTHDR_VERSION`.
        Version = 1,
        /// `RDS_EXTHDR_RDMA`.
        Rdma = 2,
        /// `RDS_EXTHDR_RDMA_DEST`.
        RdmaDest = 3,
        /// `RDS_EXTHDR_RDMA_BYTES`.
        RdmaBytes = 4,
        /// `RDS_EXTHDR_NPATHS`.
        NPaths = 5,
        /// `RDS_EXTHDR_GEN_NUM`.
        GenNum = 6,
        /// `RDS_EXTHDR_CAP_BITS` (UEK).
        CapBits = 7,
        /// `RDS_EXTHDR_SPORT_IDX`.
        SportIdx = 8,
    }
}

/// `__RDS_EXTHDR_MAX`: a type byte at or above it ends the parse.
pub const EXT_TYPE_MAX: u8 = 16;

impl ExtType {
    /// Payload bytes the type implies (0 for `None` and for unknown types).
    pub const fn payload_len(self) -> usize {
        match self {
            Self::Version | Self::Rdma | Self::GenNum | Self::CapBits => 4,
            Self::RdmaDest | Self::RdmaBytes => 8,
            Self::NPaths => 2,
            Self::SportIdx => 1,
            Self::None | Self::Unknown(_) => 0,
        }
    }
}

/// One extension header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtHeader {
    /// `VERSION`: a protocol version.
    Version(u32),
    /// `RDMA`: the R_Key of the RDMA operation that preceded this message.
    Rdma {
        /// The remote key.
        rkey: u32,
    },
    /// `RDMA_DEST`: a memory region the receiver may RDMA to or from.
    RdmaDest {
        /// The remote key.
        rkey: u32,
        /// Offset into the region.
        offset: u32,
    },
    /// `RDMA_BYTES`: bytes an RDMA operation moved, and which way.
    RdmaBytes {
        /// Byte count.
        bytes: u32,
        /// `RDS_FLAG_RDMA_WR_BYTES` (1) or `RDS_FLAG_RDMA_RD_BYTES` (2).
        dir: u8,
    },
    /// `NPATHS`: paths the sender supports.
    NPaths(u16),
    /// `GEN_NUM`: the sender's generation number.
    GenNum(u32),
    /// `CAP_BITS` (UEK): capability bits.
    CapBits(u32),
    /// `SPORT_IDX`: the sender encodes the path index in its TCP source port.
    SportIdx,
    /// A type below 16 with no known payload (skipped, zero-length).
    Unknown(u8),
}

impl ExtHeader {
    /// The type.
    pub const fn ty(&self) -> ExtType {
        match self {
            Self::Version(_) => ExtType::Version,
            Self::Rdma { .. } => ExtType::Rdma,
            Self::RdmaDest { .. } => ExtType::RdmaDest,
            Self::RdmaBytes { .. } => ExtType::RdmaBytes,
            Self::NPaths(_) => ExtType::NPaths,
            Self::GenNum(_) => ExtType::GenNum,
            Self::CapBits(_) => ExtType::CapBits,
            Self::SportIdx => ExtType::SportIdx,
            Self::Unknown(t) => ExtType::Unknown(*t),
        }
    }

    /// Bytes this extension takes in the area (type byte + payload).
    pub const fn wire_len(&self) -> usize {
        1 + self.ty().payload_len()
    }

    fn decode(ty: ExtType, p: &[u8]) -> Self {
        let u32_at = |i: usize| u32::from_be_bytes([p[i], p[i + 1], p[i + 2], p[i + 3]]);
        match ty {
            ExtType::Version => Self::Version(u32_at(0)),
            ExtType::Rdma => Self::Rdma { rkey: u32_at(0) },
            ExtType::RdmaDest => Self::RdmaDest {
                rkey: u32_at(0),
                offset: u32_at(4),
            },
            ExtType::RdmaBytes => Self::RdmaBytes {
                bytes: u32_at(0),
                dir: p[4],
            },
            ExtType::NPaths => Self::NPaths(u16::from_be_bytes([p[0], p[1]])),
            ExtType::GenNum => Self::GenNum(u32_at(0)),
            ExtType::CapBits => Self::CapBits(u32_at(0)),
            ExtType::SportIdx => Self::SportIdx,
            ExtType::None => Self::Unknown(0),
            ExtType::Unknown(t) => Self::Unknown(t),
        }
    }

    fn encode(&self, out: &mut [u8]) {
        out[0] = self.ty().into();
        let p = &mut out[1..];
        match *self {
            Self::Version(v) | Self::Rdma { rkey: v } | Self::GenNum(v) | Self::CapBits(v) => {
                p[..4].copy_from_slice(&v.to_be_bytes());
            }
            Self::RdmaDest { rkey, offset } => {
                p[..4].copy_from_slice(&rkey.to_be_bytes());
                p[4..8].copy_from_slice(&offset.to_be_bytes());
            }
            Self::RdmaBytes { bytes, dir } => {
                p[..4].copy_from_slice(&bytes.to_be_bytes());
                p[4] = dir;
                p[5..8].fill(0);
            }
            Self::NPaths(n) => p[..2].copy_from_slice(&n.to_be_bytes()),
            Self::SportIdx => p[0] = 0,
            Self::Unknown(_) => {}
        }
    }
}

/// Why an [`ExtIter`] stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtEnd {
    /// Not stopped yet.
    Running,
    /// A `NONE` terminator, or exactly the end of the area.
    Clean,
    /// A type of 16 or more (`__RDS_EXTHDR_MAX`).
    BadType(u8),
    /// A payload that would run past byte 16.
    Overrun(u8),
}

/// Iterates the extension headers of a 16-byte area, the way the kernel does. Never
/// panics; [`ExtIter::end`] says why it stopped.
#[derive(Clone, Debug)]
pub struct ExtIter<'a> {
    area: &'a [u8; EXT_SPACE],
    pos: usize,
    end: ExtEnd,
}

impl<'a> ExtIter<'a> {
    /// An iterator over `area`.
    pub fn new(area: &'a [u8; EXT_SPACE]) -> Self {
        Self {
            area,
            pos: 0,
            end: ExtEnd::Running,
        }
    }

    /// Why the iteration stopped ([`ExtEnd::Running`] until it has).
    pub fn end(&self) -> ExtEnd {
        self.end
    }
}

impl Iterator for ExtIter<'_> {
    type Item = ExtHeader;

    fn next(&mut self) -> Option<ExtHeader> {
        if self.end != ExtEnd::Running {
            return None;
        }
        if self.pos >= EXT_SPACE {
            self.end = ExtEnd::Clean;
            return None;
        }
        let raw = self.area[self.pos];
        let ty = ExtType::from(raw);
        if ty == ExtType::None {
            self.end = ExtEnd::Clean;
            return None;
        }
        if raw >= EXT_TYPE_MAX {
            self.end = ExtEnd::BadType(raw);
            return None;
        }
        let start = self.pos + 1;
        let len = ty.payload_len();
        if start + len > EXT_SPACE {
            self.end = ExtEnd::Overrun(raw);
            return None;
        }
        self.pos = start + len;
        Some(ExtHeader::decode(ty, &self.area[start..start + len]))
    }
}

/// The area has no room for another extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtFull;

/// Packs extension headers into a zeroed 16-byte area, back to back; the byte after the
/// last one stays 0 (the `NONE` terminator) when there is room for it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExtWriter {
    area: [u8; EXT_SPACE],
    pos: usize,
}

impl ExtWriter {
    /// An empty area.
    pub const fn new() -> Self {
        Self {
            area: [0; EXT_SPACE],
            pos: 0,
        }
    }

    /// Appends `ext`.
    ///
    /// # Errors
    ///
    /// [`ExtFull`] if it does not fit in what is left of the 16 bytes (nothing is written).
    pub fn push(&mut self, ext: ExtHeader) -> Result<(), ExtFull> {
        let n = ext.wire_len();
        let raw = u8::from(ext.ty());
        if raw == 0 || raw >= EXT_TYPE_MAX || self.pos + n > EXT_SPACE {
            return Err(ExtFull);
        }
        ext.encode(&mut self.area[self.pos..self.pos + n]);
        self.pos += n;
        Ok(())
    }

    /// Bytes used.
    pub fn len(&self) -> usize {
        self.pos
    }

    /// True if nothing was pushed.
    pub fn is_empty(&self) -> bool {
        self.pos == 0
    }

    /// The area.
    pub fn finish(self) -> [u8; EXT_SPACE] {
        self.area
    }
}
