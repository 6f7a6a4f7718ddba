//! RNBD messages (Linux `drivers/block/rnbd/rnbd-proto.h`, protocol 2.x; described in
//! `shared/reference/rtrs.md` section 9). All integers are little-endian; every message
//! starts with a 4-byte header (`le16 type`, `le16` padding).
//!
//! | message | bytes | carried as |
//! |---|---|---|
//! | [`SessInfo`] / [`SessInfoRsp`] | 36 | RTRS READ on the admin connection; the response is RDMA-written into the client's buffer |
//! | [`Open`] / [`OpenRsp`] | 264 / 56 | RTRS READ, likewise |
//! | [`Io`] | 32 (26 bytes of fields, padded as the kernel sends `sizeof`) | RTRS READ or WRITE on the IO connections |
//! | [`Close`] | 8 | RTRS WRITE without data |
//!
//! Parsing is [`Msg::parse`] (never panics; what the protocol forbids is an [`Error`]);
//! emitting is `emit` on each message into a buffer of exactly its `LEN` bytes. The `rw`
//! word of an IO keeps unknown operations and flag bits ([`Rw`]): the server decides how
//! to refuse them.

use dp_wire::enum_with_unknown;
use dp_wire::{Error, Result};

/// The protocol major version (only the major is exchanged).
pub const PROTO_VER_MAJOR: u8 = 2;
/// The protocol minor this implementation speaks: 2 adds `PREFLUSH` (minor 1) and `NOUNMAP`
/// (minor 2) to the IO flags of 6.1's minor 0.
pub const PROTO_VER_MINOR: u8 = 2;
/// The RTRS port RNBD listens on.
pub const RTRS_PORT: u16 = 1234;
/// Longest device name (`NAME_MAX`).
pub const DEV_NAME_MAX: usize = 255;
/// Bytes per sector.
pub const SECTOR: u64 = 512;

enum_with_unknown! {
    /// RNBD message types (`enum rnbd_msg_type`).
    pub enum MsgType(u16) {
        /// Client: which protocol version.
        SessInfo = 0,
        /// Server: the version it will speak.
        SessInfoRsp = 1,
        /// Client: open a device.
        Open = 2,
        /// Server: the device's id and geometry.
        OpenRsp = 3,
        /// Client: one block IO.
        Io = 4,
        /// Client: close a device.
        Close = 5,
    }
}

enum_with_unknown! {
    /// How a client opens a device (`enum rnbd_access_mode`).
    pub enum AccessMode(u8) {
        /// Read only: any number of readers.
        Ro = 0,
        /// Read-write: one writer at a time.
        Rw = 1,
        /// Read-write while migrating: at most two writers.
        Migration = 2,
    }
}

enum_with_unknown! {
    /// The operation in the low 8 bits of an IO's `rw` word.
    pub enum Op(u8) {
        /// Read `bi_size` bytes at `sector` into the client's buffer.
        Read = 0,
        /// Write the data that came with the request.
        Write = 1,
        /// Flush the device's write cache (no data).
        Flush = 2,
        /// Discard `bi_size` bytes (no data).
        Discard = 3,
        /// Securely erase `bi_size` bytes (no data).
        SecureErase = 4,
        /// Write zeroes over `bi_size` bytes (no data; was WRITE_SAME).
        WriteZeroes = 5,
    }
}

/// IO flag: synchronous request.
pub const F_SYNC: u32 = 1 << 8;
/// IO flag: force unit access (write through to stable media).
pub const F_FUA: u32 = 1 << 9;
/// IO flag: flush the cache before the request (protocol minor 1).
pub const F_PREFLUSH: u32 = 1 << 10;
/// IO flag: a write-zeroes that must not unmap (protocol minor 2).
pub const F_NOUNMAP: u32 = 1 << 11;
/// Every flag this implementation knows.
pub const F_ALL: u32 = F_SYNC | F_FUA | F_PREFLUSH | F_NOUNMAP;

/// An IO's `rw` word: operation (bits 0..8) and flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rw(pub u32);

impl Rw {
    /// `op | flags`.
    pub fn new(op: Op, flags: u32) -> Self {
        Self(u32::from(u8::from(op)) | (flags & !0xFF))
    }

    /// The operation (unknown values preserved).
    pub fn op(self) -> Op {
        Op::from(self.0 as u8)
    }

    /// The flag bits (the operation masked out).
    pub fn flags(self) -> u32 {
        self.0 & !0xFF
    }

    /// True if the operation is known and no unknown flag is set (`rnbd_flags_supported`,
    /// extended to the minor-2 flags).
    pub fn supported(self) -> bool {
        !matches!(self.op(), Op::Unknown(_)) && self.flags() & !F_ALL == 0
    }

    /// True for operations that carry no data (`bi_size` gives the length).
    pub fn dataless(self) -> bool {
        matches!(
            self.op(),
            Op::Flush | Op::Discard | Op::SecureErase | Op::WriteZeroes
        )
    }
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn put_hdr(out: &mut [u8], t: MsgType) {
    out[..2].copy_from_slice(&u16::from(t).to_le_bytes());
    out[2..4].fill(0);
}

/// `sess_info` and `sess_info_rsp`: the version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessInfo {
    /// Protocol major version.
    pub ver: u8,
}

/// The server's answer to [`SessInfo`]: the version both will speak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessInfoRsp {
    /// `min(client's, server's)`.
    pub ver: u8,
}

/// `open`: a device name and how to open it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Open<'a> {
    /// Access mode.
    pub access_mode: AccessMode,
    /// The name as the client wrote it (up to the first NUL; no NUL means all 255 bytes).
    pub dev_name: &'a [u8],
}

/// `open_rsp`: the device's id and geometry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenRsp {
    /// The id IOs name the device by.
    pub device_id: u32,
    /// Size in 512-byte sectors.
    pub nsectors: u64,
    /// Largest IO in sectors.
    pub max_hw_sectors: u32,
    /// Largest write-zeroes in sectors.
    pub max_write_zeroes_sectors: u32,
    /// Largest discard in sectors.
    pub max_discard_sectors: u32,
    /// Discard granularity in bytes.
    pub discard_granularity: u32,
    /// Discard alignment in bytes.
    pub discard_alignment: u32,
    /// Physical block size in bytes.
    pub physical_block_size: u16,
    /// Logical block size in bytes.
    pub logical_block_size: u16,
    /// Largest number of segments per IO.
    pub max_segments: u16,
    /// Whether secure discard is supported.
    pub secure_discard: u16,
    /// `RNBD_FUA` (1) | `RNBD_WRITEBACK` (2).
    pub cache_policy: u8,
}

/// Cache policy bit: the device honours FUA.
pub const CACHE_FUA: u8 = 1;
/// Cache policy bit: the device has a write-back cache (flush is meaningful).
pub const CACHE_WRITEBACK: u8 = 2;

/// `io`: one block IO.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Io {
    /// The device, as [`OpenRsp::device_id`] named it.
    pub device_id: u32,
    /// First sector.
    pub sector: u64,
    /// Operation and flags.
    pub rw: Rw,
    /// Bytes (for dataless operations, the extent; otherwise the data's length).
    pub bi_size: u32,
    /// IO priority (protocol 2 and up).
    pub prio: u16,
}

/// `close`: the device to close.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Close {
    /// The device.
    pub device_id: u32,
}

/// One parsed message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Msg<'a> {
    /// Client's version.
    SessInfo(SessInfo),
    /// Server's version.
    SessInfoRsp(SessInfoRsp),
    /// Open a device.
    Open(Open<'a>),
    /// A device opened.
    OpenRsp(OpenRsp),
    /// A block IO.
    Io(Io),
    /// Close a device.
    Close(Close),
}

impl SessInfo {
    /// Bytes on the wire.
    pub const LEN: usize = 36;

    /// Writes the message into `out` (exactly [`Self::LEN`] bytes).
    ///
    /// # Panics
    /// If `out` is not `LEN` bytes (a caller bug).
    pub fn emit(&self, out: &mut [u8]) {
        assert_eq!(out.len(), Self::LEN);
        out.fill(0);
        put_hdr(out, MsgType::SessInfo);
        out[4] = self.ver;
    }
}

impl SessInfoRsp {
    /// Bytes on the wire.
    pub const LEN: usize = 36;

    /// Writes the message into `out` (exactly [`Self::LEN`] bytes).
    ///
    /// # Panics
    /// If `out` is not `LEN` bytes.
    pub fn emit(&self, out: &mut [u8]) {
        assert_eq!(out.len(), Self::LEN);
        out.fill(0);
        put_hdr(out, MsgType::SessInfoRsp);
        out[4] = self.ver;
    }
}

impl Open<'_> {
    /// Bytes on the wire.
    pub const LEN: usize = 264;

    /// Writes the message into `out` (exactly [`Self::LEN`] bytes).
    ///
    /// # Panics
    /// If `out` is not `LEN` bytes or the name is longer than [`DEV_NAME_MAX`].
    pub fn emit(&self, out: &mut [u8]) {
        assert_eq!(out.len(), Self::LEN);
        assert!(self.dev_name.len() <= DEV_NAME_MAX, "device name too long");
        out.fill(0);
        put_hdr(out, MsgType::Open);
        out[4] = self.access_mode.into();
        out[6..6 + self.dev_name.len()].copy_from_slice(self.dev_name);
    }
}

impl OpenRsp {
    /// Bytes on the wire.
    pub const LEN: usize = 56;

    /// Writes the message into `out` (exactly [`Self::LEN`] bytes).
    ///
    /// # Panics
    /// If `out` is not `LEN` bytes.
    pub fn emit(&self, out: &mut [u8]) {
        assert_eq!(out.len(), Self::LEN);
        out.fill(0);
        put_hdr(out, MsgType::OpenRsp);
        out[4..8].copy_from_slice(&self.device_id.to_le_bytes());
        out[8..16].copy_from_slice(&self.nsectors.to_le_bytes());
        out[16..20].copy_from_slice(&self.max_hw_sectors.to_le_bytes());
        out[20..24].copy_from_slice(&self.max_write_zeroes_sectors.to_le_bytes());
        out[24..28].copy_from_slice(&self.max_discard_sectors.to_le_bytes());
        out[28..32].copy_from_slice(&self.discard_granularity.to_le_bytes());
        out[32..36].copy_from_slice(&self.discard_alignment.to_le_bytes());
        out[36..38].copy_from_slice(&self.physical_block_size.to_le_bytes());
        out[38..40].copy_from_slice(&self.logical_block_size.to_le_bytes());
        out[40..42].copy_from_slice(&self.max_segments.to_le_bytes());
        out[42..44].copy_from_slice(&self.secure_discard.to_le_bytes());
        out[45] = self.cache_policy;
    }
}

impl Io {
    /// Bytes on the wire: the kernel sends `sizeof(struct rnbd_msg_io)`, 26 bytes of
    /// fields padded to 32.
    pub const LEN: usize = 32;
    /// Bytes of fields; a message this long (without the padding) is accepted too.
    pub const MIN_LEN: usize = 26;

    /// Writes the message into `out` (exactly [`Self::LEN`] bytes).
    ///
    /// # Panics
    /// If `out` is not `LEN` bytes.
    pub fn emit(&self, out: &mut [u8]) {
        assert_eq!(out.len(), Self::LEN);
        out.fill(0);
        put_hdr(out, MsgType::Io);
        out[4..8].copy_from_slice(&self.device_id.to_le_bytes());
        out[8..16].copy_from_slice(&self.sector.to_le_bytes());
        out[16..20].copy_from_slice(&self.rw.0.to_le_bytes());
        out[20..24].copy_from_slice(&self.bi_size.to_le_bytes());
        out[24..26].copy_from_slice(&self.prio.to_le_bytes());
    }

    /// Byte offset of the first sector, if it does not overflow.
    pub fn offset(&self) -> Option<u64> {
        self.sector.checked_mul(SECTOR)
    }
}

impl Close {
    /// Bytes on the wire.
    pub const LEN: usize = 8;

    /// Writes the message into `out` (exactly [`Self::LEN`] bytes).
    ///
    /// # Panics
    /// If `out` is not `LEN` bytes.
    pub fn emit(&self, out: &mut [u8]) {
        assert_eq!(out.len(), Self::LEN);
        put_hdr(out, MsgType::Close);
        out[4..8].copy_from_slice(&self.device_id.to_le_bytes());
    }
}

impl<'a> Msg<'a> {
    /// Parses one message: the whole of `b` (the RTRS user message). Never panics.
    ///
    /// # Errors
    /// [`Error::Truncated`] if shorter than the message its type names, [`Error::Malformed`]
    /// for an unknown type or an access mode the protocol does not have.
    pub fn parse(b: &'a [u8]) -> Result<Self> {
        if b.len() < 4 {
            return Err(Error::Truncated);
        }
        let need = |n: usize| {
            if b.len() < n {
                Err(Error::Truncated)
            } else {
                Ok(())
            }
        };
        Ok(match MsgType::from(le16(b, 0)) {
            MsgType::SessInfo => {
                need(SessInfo::LEN)?;
                Msg::SessInfo(SessInfo { ver: b[4] })
            }
            MsgType::SessInfoRsp => {
                need(SessInfoRsp::LEN)?;
                Msg::SessInfoRsp(SessInfoRsp { ver: b[4] })
            }
            MsgType::Open => {
                need(Open::LEN)?;
                let access_mode = AccessMode::from(b[4]);
                if matches!(access_mode, AccessMode::Unknown(_)) {
                    return Err(Error::Malformed);
                }
                let raw = &b[6..6 + DEV_NAME_MAX];
                let end = raw.iter().position(|&c| c == 0).unwrap_or(raw.len());
                Msg::Open(Open {
                    access_mode,
                    dev_name: &raw[..end],
                })
            }
            MsgType::OpenRsp => {
                need(OpenRsp::LEN)?;
                Msg::OpenRsp(OpenRsp {
                    device_id: le32(b, 4),
                    nsectors: le64(b, 8),
                    max_hw_sectors: le32(b, 16),
                    max_write_zeroes_sectors: le32(b, 20),
                    max_discard_sectors: le32(b, 24),
                    discard_granularity: le32(b, 28),
                    discard_alignment: le32(b, 32),
                    physical_block_size: le16(b, 36),
                    logical_block_size: le16(b, 38),
                    max_segments: le16(b, 40),
                    secure_discard: le16(b, 42),
                    cache_policy: b[45],
                })
            }
            MsgType::Io => {
                need(Io::MIN_LEN)?;
                Msg::Io(Io {
                    device_id: le32(b, 4),
                    sector: le64(b, 8),
                    rw: Rw(le32(b, 16)),
                    bi_size: le32(b, 20),
                    prio: le16(b, 24),
                })
            }
            MsgType::Close => {
                need(Close::LEN)?;
                Msg::Close(Close {
                    device_id: le32(b, 4),
                })
            }
            MsgType::Unknown(_) => return Err(Error::Malformed),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The kernel's `rnbd_msg_io` for a 4 KiB write at sector 8 with FUA, as bytes.
    #[test]
    fn io_matches_the_kernel_layout() {
        let io = Io {
            device_id: 3,
            sector: 8,
            rw: Rw::new(Op::Write, F_FUA),
            bi_size: 4096,
            prio: 2,
        };
        let mut b = [0u8; Io::LEN];
        io.emit(&mut b);
        assert_eq!(
            b,
            [
                4, 0, 0, 0, // type IO, padding
                3, 0, 0, 0, // device_id
                8, 0, 0, 0, 0, 0, 0, 0, // sector
                1, 2, 0, 0, // rw = WRITE | FUA (0x201)
                0, 16, 0, 0, // bi_size 4096
                2, 0, // prio
                0, 0, 0, 0, 0, 0, // padding to sizeof
            ]
        );
        assert_eq!(Msg::parse(&b), Ok(Msg::Io(io)));
        assert_eq!(Msg::parse(&b[..Io::MIN_LEN]), Ok(Msg::Io(io)));
        assert_eq!(Msg::parse(&b[..Io::MIN_LEN - 1]), Err(Error::Truncated));
    }

    #[test]
    fn open_and_open_rsp_round_trip_at_the_kernel_offsets() {
        let name = b"ram0";
        let mut b = [0u8; Open::LEN];
        Open {
            access_mode: AccessMode::Migration,
            dev_name: name,
        }
        .emit(&mut b);
        assert_eq!((b[0], b[4], &b[6..10], b[10]), (2, 2, &name[..], 0));
        match Msg::parse(&b) {
            Ok(Msg::Open(o)) => assert_eq!(
                (o.access_mode, o.dev_name),
                (AccessMode::Migration, &name[..])
            ),
            other => panic!("{other:?}"),
        }
        b[4] = 7;
        assert_eq!(Msg::parse(&b), Err(Error::Malformed));

        let rsp = OpenRsp {
            device_id: 9,
            nsectors: 131_072,
            max_hw_sectors: 248,
            logical_block_size: 512,
            physical_block_size: 4096,
            max_segments: 29,
            cache_policy: CACHE_FUA | CACHE_WRITEBACK,
            ..OpenRsp::default()
        };
        let mut b = [0u8; OpenRsp::LEN];
        rsp.emit(&mut b);
        assert_eq!(&b[8..16], &131_072u64.to_le_bytes());
        assert_eq!((&b[36..40], b[45]), (&[0, 16, 0, 2][..], 3));
        assert_eq!(Msg::parse(&b), Ok(Msg::OpenRsp(rsp)));
    }

    #[test]
    fn a_name_without_a_nul_is_all_255_bytes() {
        let mut b = [0u8; Open::LEN];
        b[0] = 2;
        b[6..6 + DEV_NAME_MAX].fill(b'a');
        match Msg::parse(&b) {
            Ok(Msg::Open(o)) => assert_eq!(o.dev_name.len(), DEV_NAME_MAX),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn rw_keeps_unknown_operations_and_flags() {
        assert!(Rw::new(Op::Read, F_SYNC).supported());
        assert!(!Rw(0x0000_0006).supported());
        assert_eq!(Rw(6).op(), Op::Unknown(6));
        assert!(!Rw(0x1000 | 1).supported());
        assert!(Rw::new(Op::Discard, 0).dataless());
        assert!(!Rw::new(Op::Write, F_FUA).dataless());
    }

    #[test]
    fn sess_info_and_close_layouts() {
        let mut b = [0u8; SessInfo::LEN];
        SessInfo { ver: 2 }.emit(&mut b);
        assert_eq!((b[0], b[4]), (0, 2));
        assert_eq!(Msg::parse(&b), Ok(Msg::SessInfo(SessInfo { ver: 2 })));
        let mut c = [0u8; Close::LEN];
        Close {
            device_id: 0x0102_0304,
        }
        .emit(&mut c);
        assert_eq!(c, [5, 0, 0, 0, 4, 3, 2, 1]);
        assert_eq!(Msg::parse(&b[..35]), Err(Error::Truncated));
        assert_eq!(Msg::parse(&[9, 0, 0, 0]), Err(Error::Malformed));
    }

    proptest! {
        #[test]
        fn parse_never_panics(b in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = Msg::parse(&b);
        }

        #[test]
        fn parse_of_emit_is_identity(device_id: u32, sector: u64, rw: u32, bi_size: u32, prio: u16) {
            let io = Io { device_id, sector, rw: Rw(rw), bi_size, prio };
            let mut b = [0u8; Io::LEN];
            io.emit(&mut b);
            prop_assert_eq!(Msg::parse(&b), Ok(Msg::Io(io)));
        }
    }
}
