//! IO messages: the RTRS header the client RDMA-writes into a server chunk behind its user
//! message (`rtrs_msg_rdma_write`, `rtrs_msg_rdma_read`), and the message-type enum all
//! service and IO messages start with.
//!
//! Chunk layout of a WRITE: `[0, data_len)` data, `[data_len, +usr_len)` user message, then
//! the 4-byte [`RdmaWrite`]. Of a READ: `[0, data_len)` left for the server to fill, the user
//! message, then [`RdmaRead`] with its descriptor. The immediate's offset points at the
//! header, so `data_len = off - usr_len`.

use dp_wire::enum_with_unknown;

use super::{Bad, MSG_NEED_INVAL_F, Result, le16, le32, le64, need};

enum_with_unknown! {
    /// `enum rtrs_msg_types`: the `le16` every service and IO message starts with.
    pub enum MsgType(u16) {
        /// `RTRS_MSG_INFO_REQ`.
        InfoReq = 0,
        /// `RTRS_MSG_INFO_RSP`.
        InfoRsp = 1,
        /// `RTRS_MSG_WRITE`.
        Write = 2,
        /// `RTRS_MSG_READ`.
        Read = 3,
        /// `RTRS_MSG_RKEY_RSP`.
        RkeyRsp = 4,
    }
}

/// `struct rtrs_sg_desc`: a remote buffer (address, rkey, length), 16 bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SgDesc {
    /// Address in the owner's address space (the iova of its registration).
    pub addr: u64,
    /// Remote key.
    pub key: u32,
    /// Bytes.
    pub len: u32,
}

impl SgDesc {
    /// Encoded length.
    pub const LEN: usize = 16;

    /// Reads an entry; `None` if `b` is shorter than 16 bytes.
    pub fn read(b: &[u8]) -> Option<Self> {
        if b.len() < Self::LEN {
            return None;
        }
        Some(Self {
            addr: le64(b, 0),
            key: le32(b, 8),
            len: le32(b, 12),
        })
    }

    /// The 16 bytes.
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..12].copy_from_slice(&self.key.to_le_bytes());
        b[12..16].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// The address one past the last byte; `None` if the region wraps 2^64.
    pub fn end(&self) -> Option<u64> {
        self.addr.checked_add(u64::from(self.len))
    }
}

/// A typed view of `rtrs_msg_rdma_write` (4 bytes): `type` le16 @0, `usr_len` le16 @2.
#[derive(Debug, Clone)]
pub struct RdmaWrite<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> RdmaWrite<T> {
    /// Length of the structure.
    pub const LEN: usize = 4;

    /// Wraps without checking.
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    /// Wraps after [`check_len`](Self::check_len).
    ///
    /// # Errors
    /// [`Bad::Truncated`].
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks the buffer holds all 4 bytes.
    ///
    /// # Errors
    /// [`Bad::Truncated`].
    pub fn check_len(&self) -> Result<()> {
        need(self.buffer.as_ref(), Self::LEN)
    }

    /// `type`.
    pub fn msg_type(&self) -> MsgType {
        MsgType::from(le16(self.buffer.as_ref(), 0))
    }
    /// `usr_len`.
    pub fn usr_len(&self) -> u16 {
        le16(self.buffer.as_ref(), 2)
    }
}

/// The meaning of a write header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RdmaWriteRepr {
    /// Bytes of user message in front of the header.
    pub usr_len: u16,
}

impl RdmaWriteRepr {
    /// Parses (type `WRITE`).
    ///
    /// # Errors
    /// [`Bad::Truncated`], [`Bad::MsgType`].
    pub fn parse<T: AsRef<[u8]>>(p: &RdmaWrite<T>) -> Result<Self> {
        p.check_len()?;
        if p.msg_type() != MsgType::Write {
            return Err(Bad::MsgType);
        }
        Ok(Self {
            usr_len: p.usr_len(),
        })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        RdmaWrite::<&[u8]>::LEN
    }

    /// Writes the 4 bytes into `b[..4]`.
    ///
    /// # Panics
    /// If `b` is shorter than 4 bytes.
    pub fn emit(&self, b: &mut [u8]) {
        b[0..2].copy_from_slice(&u16::from(MsgType::Write).to_le_bytes());
        b[2..4].copy_from_slice(&self.usr_len.to_le_bytes());
    }
}

/// A typed view of `rtrs_msg_rdma_read`: `type` le16 @0, `usr_len` @2, `flags` @4, `sg_cnt`
/// @6, then `sg_cnt` [`SgDesc`]s.
#[derive(Debug, Clone)]
pub struct RdmaRead<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> RdmaRead<T> {
    /// Bytes before the descriptors.
    pub const FIXED_LEN: usize = 8;

    /// Bytes of a header with `sg_cnt` descriptors.
    pub const fn hdr_len(sg_cnt: usize) -> usize {
        Self::FIXED_LEN + SgDesc::LEN * sg_cnt
    }

    /// Wraps without checking.
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    /// Wraps after [`check_len`](Self::check_len).
    ///
    /// # Errors
    /// [`Bad::Truncated`].
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks the buffer holds the fixed part and the descriptors `sg_cnt` announces.
    ///
    /// # Errors
    /// [`Bad::Truncated`].
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        need(b, Self::FIXED_LEN)?;
        need(b, Self::hdr_len(le16(b, 6) as usize))
    }

    /// `type`.
    pub fn msg_type(&self) -> MsgType {
        MsgType::from(le16(self.buffer.as_ref(), 0))
    }
    /// `usr_len`.
    pub fn usr_len(&self) -> u16 {
        le16(self.buffer.as_ref(), 2)
    }
    /// `flags`.
    pub fn flags(&self) -> u16 {
        le16(self.buffer.as_ref(), 4)
    }
    /// `sg_cnt`.
    pub fn sg_cnt(&self) -> u16 {
        le16(self.buffer.as_ref(), 6)
    }
    /// Descriptor `i`, if present.
    pub fn desc(&self, i: usize) -> Option<SgDesc> {
        if i >= self.sg_cnt() as usize {
            return None;
        }
        SgDesc::read(self.buffer.as_ref().get(Self::hdr_len(i)..)?)
    }
}

/// The meaning of a read header. The current Linux client sends 0 or 1 descriptors (one
/// fast-registered region covers the whole buffer) and the server refuses anything else, so
/// that is all this carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RdmaReadRepr {
    /// Bytes of user message in front of the header.
    pub usr_len: u16,
    /// `RTRS_MSG_NEED_INVAL_F`: answer with SEND_WITH_INV of `desc.key`.
    pub need_inval: bool,
    /// Where the server writes the data; `None` for a read that moves no data (RNBD's
    /// `SESS_INFO`/`OPEN` always carry one; a zero-length read carries none).
    pub desc: Option<SgDesc>,
}

impl RdmaReadRepr {
    /// Parses (type `READ`, `sg_cnt` 0 or 1, a descriptor length in `1..=max_len`).
    ///
    /// # Errors
    /// [`Bad::Truncated`], [`Bad::MsgType`], [`Bad::ReadSgCount`], [`Bad::ReadLen`].
    pub fn parse<T: AsRef<[u8]>>(p: &RdmaRead<T>, max_len: u32) -> Result<Self> {
        need(p.buffer.as_ref(), RdmaRead::<&[u8]>::FIXED_LEN)?;
        if p.msg_type() != MsgType::Read {
            return Err(Bad::MsgType);
        }
        if p.sg_cnt() > 1 {
            return Err(Bad::ReadSgCount);
        }
        p.check_len()?;
        let desc = p.desc(0);
        if let Some(d) = desc
            && (d.len == 0 || d.len > max_len)
        {
            return Err(Bad::ReadLen);
        }
        Ok(Self {
            usr_len: p.usr_len(),
            need_inval: p.flags() & MSG_NEED_INVAL_F != 0,
            desc,
        })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        RdmaRead::<&[u8]>::hdr_len(if self.desc.is_some() { 1 } else { 0 })
    }

    /// Writes [`buffer_len`](Self::buffer_len) bytes into `b`. As Linux does, `need_inval`
    /// is only sent with a descriptor.
    ///
    /// # Panics
    /// If `b` is shorter than `buffer_len()`.
    pub fn emit(&self, b: &mut [u8]) {
        b[0..2].copy_from_slice(&u16::from(MsgType::Read).to_le_bytes());
        b[2..4].copy_from_slice(&self.usr_len.to_le_bytes());
        let (flags, cnt) = match self.desc {
            Some(_) if self.need_inval => (MSG_NEED_INVAL_F, 1u16),
            Some(_) => (0, 1),
            None => (0, 0),
        };
        b[4..6].copy_from_slice(&flags.to_le_bytes());
        b[6..8].copy_from_slice(&cnt.to_le_bytes());
        if let Some(d) = self.desc {
            b[8..24].copy_from_slice(&d.to_bytes());
        }
    }
}

/// Checks the user message in front of a header at `off` fits: `usr_len <= off`
/// (`process_read`, `process_write`), and returns `data_len = off - usr_len`.
///
/// # Errors
/// [`Bad::UsrLen`].
pub const fn data_len(off: u32, usr_len: u16) -> Result<u32> {
    if usr_len as u32 > off {
        Err(Bad::UsrLen)
    } else {
        Ok(off - usr_len as u32)
    }
}
