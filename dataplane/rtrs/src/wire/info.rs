//! Service messages, SENT on connection 0: `rtrs_msg_info_req` (the path's name),
//! `rtrs_msg_info_rsp` (the server's chunk table) and `rtrs_msg_rkey_rsp` (a chunk's new
//! rkey in `NEW_RKEY` mode), plus `rtrs_sg_desc`, the 16-byte buffer descriptor they and
//! read requests share.

use super::io::{MsgType, SgDesc};
use super::{Bad, Geometry, NAME_MAX, Result, le16, le32, need};

/// A path name: at most [`NAME_MAX`] bytes, no NUL, `/` or `.`, not empty (Linux rejects
/// `/` and `.` in `rtrs_clt_open` and `process_info_req`). Kept inline: no allocation.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PathName {
    bytes: [u8; NAME_MAX],
    len: u8,
}

impl PathName {
    /// Checks and copies `name`.
    ///
    /// # Errors
    /// [`Bad::PathName`] if it is empty, longer than 255 bytes, or holds NUL, `/` or `.`.
    pub fn new(name: &[u8]) -> Result<Self> {
        if name.is_empty()
            || name.len() > NAME_MAX
            || name.iter().any(|&c| c == 0 || c == b'/' || c == b'.')
        {
            return Err(Bad::PathName);
        }
        let mut bytes = [0u8; NAME_MAX];
        bytes[..name.len()].copy_from_slice(name);
        Ok(Self {
            bytes,
            len: name.len() as u8,
        })
    }

    /// The name.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

impl core::fmt::Debug for PathName {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "PathName({:?})",
            String::from_utf8_lossy(self.as_bytes())
        )
    }
}

/// A typed view of `rtrs_msg_info_req` (272 bytes): `type` le16 @0, `pathname[255]` @2,
/// `reserved[15]` @257.
#[derive(Debug, Clone)]
pub struct InfoReq<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> InfoReq<T> {
    /// Length of the structure.
    pub const LEN: usize = 272;

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

    /// Checks the buffer holds all 272 bytes.
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

    /// The 255 bytes of `pathname`.
    pub fn pathname_raw(&self) -> &[u8] {
        &self.buffer.as_ref()[2..2 + NAME_MAX]
    }
}

/// The meaning of an info request: the path's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InfoReqRepr {
    /// The name (up to the first NUL of the field).
    pub pathname: PathName,
}

impl InfoReqRepr {
    /// Parses: the type must be `INFO_REQ`, and the name (up to the first NUL, or all 255
    /// bytes) a valid [`PathName`].
    ///
    /// # Errors
    /// [`Bad::Truncated`], [`Bad::MsgType`], [`Bad::PathName`].
    pub fn parse<T: AsRef<[u8]>>(p: &InfoReq<T>) -> Result<Self> {
        p.check_len()?;
        if p.msg_type() != MsgType::InfoReq {
            return Err(Bad::MsgType);
        }
        let raw = p.pathname_raw();
        let n = raw.iter().position(|&c| c == 0).unwrap_or(raw.len());
        Ok(Self {
            pathname: PathName::new(&raw[..n])?,
        })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        InfoReq::<&[u8]>::LEN
    }

    /// Writes the 272 bytes (name NUL-padded, reserved bytes zero).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut InfoReq<T>) {
        let b = &mut p.buffer.as_mut()[..InfoReq::<&[u8]>::LEN];
        b.fill(0);
        b[0..2].copy_from_slice(&u16::from(MsgType::InfoReq).to_le_bytes());
        let name = self.pathname.as_bytes();
        b[2..2 + name.len()].copy_from_slice(name);
    }
}

/// A typed view of `rtrs_msg_info_rsp`: `type` le16 @0, `sg_cnt` le16 @2, `reserved[4]` @4,
/// then `sg_cnt` [`SgDesc`]s from byte 8.
#[derive(Debug, Clone)]
pub struct InfoRsp<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> InfoRsp<T> {
    /// Bytes before the descriptors.
    pub const HDR_LEN: usize = 8;

    /// Bytes of a response with `sg_cnt` descriptors.
    pub const fn len_for(sg_cnt: usize) -> usize {
        Self::HDR_LEN + SgDesc::LEN * sg_cnt
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

    /// Checks the buffer holds the header and all `sg_cnt` descriptors it announces.
    ///
    /// # Errors
    /// [`Bad::Truncated`].
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        need(b, Self::HDR_LEN)?;
        need(b, Self::len_for(le16(b, 2) as usize))
    }

    /// `type`.
    pub fn msg_type(&self) -> MsgType {
        MsgType::from(le16(self.buffer.as_ref(), 0))
    }

    /// `sg_cnt`.
    pub fn sg_cnt(&self) -> u16 {
        le16(self.buffer.as_ref(), 2)
    }

    /// Descriptor `i`; `None` past `sg_cnt` (or past the buffer, if unchecked).
    pub fn desc(&self, i: usize) -> Option<SgDesc> {
        if i >= self.sg_cnt() as usize {
            return None;
        }
        let at = Self::len_for(i);
        SgDesc::read(self.buffer.as_ref().get(at..)?)
    }

    /// The descriptors.
    pub fn descs(&self) -> impl Iterator<Item = SgDesc> + '_ {
        (0..self.sg_cnt() as usize).map_while(|i| self.desc(i))
    }

    /// Checks the chunk table against the negotiated geometry as `process_info_rsp` does, with
    /// 64-bit sums and an address-wrap check added, and fills `rbufs` with one
    /// (address, rkey) per chunk: descriptor `k` covers `len / chunk_size` consecutive chunks.
    ///
    /// The rules: the type is `INFO_RSP`; `sg_cnt` is not 0 and divides the queue depth;
    /// every length is a non-zero multiple of the chunk size and its region does not wrap;
    /// together they cover exactly `queue_depth` chunks.
    ///
    /// # Errors
    /// The first [`Bad`] found; `rbufs` is then unspecified.
    pub fn chunk_table(&self, g: &Geometry, rbufs: &mut [(u64, u32)]) -> Result<()> {
        self.check_len()?;
        if self.msg_type() != MsgType::InfoRsp {
            return Err(Bad::MsgType);
        }
        let qd = u32::from(g.queue_depth());
        let sg_cnt = u32::from(self.sg_cnt());
        if sg_cnt == 0 || qd % sg_cnt != 0 {
            return Err(Bad::SgCount);
        }
        if rbufs.len() < qd as usize {
            return Err(Bad::SgTotal);
        }
        let cs = u64::from(g.chunk_size());
        let mut i = 0usize;
        for d in self.descs() {
            let len = u64::from(d.len);
            if len == 0 || len % cs != 0 {
                return Err(Bad::SgLen);
            }
            if d.end().is_none() {
                return Err(Bad::SgWraps);
            }
            let n = (len / cs) as usize;
            if i + n > qd as usize {
                return Err(Bad::SgTotal);
            }
            for k in 0..n {
                rbufs[i + k] = (d.addr + k as u64 * cs, d.key);
            }
            i += n;
        }
        if i != qd as usize {
            return Err(Bad::SgTotal);
        }
        Ok(())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> InfoRsp<T> {
    /// Writes the header and `descs` (the buffer must hold [`InfoRsp::len_for`] bytes).
    ///
    /// # Panics
    /// If the buffer is shorter than `len_for(descs.len())` or there are more than 65535
    /// descriptors (callers size it and check the count).
    pub fn emit(&mut self, descs: &[SgDesc]) {
        let b = self.buffer.as_mut();
        b[0..2].copy_from_slice(&u16::from(MsgType::InfoRsp).to_le_bytes());
        let n = u16::try_from(descs.len()).expect("at most 65535 chunk descriptors");
        b[2..4].copy_from_slice(&n.to_le_bytes());
        b[4..8].fill(0);
        for (i, d) in descs.iter().enumerate() {
            let at = Self::len_for(i);
            b[at..at + SgDesc::LEN].copy_from_slice(&d.to_bytes());
        }
    }
}

/// A typed view of `rtrs_msg_rkey_rsp` (8 bytes): `type` le16 @0, `buf_id` le16 @2,
/// `rkey` le32 @4.
#[derive(Debug, Clone)]
pub struct RkeyRsp<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> RkeyRsp<T> {
    /// Length of the structure.
    pub const LEN: usize = 8;

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

    /// Checks the buffer holds all 8 bytes.
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
    /// `buf_id`.
    pub fn buf_id(&self) -> u16 {
        le16(self.buffer.as_ref(), 2)
    }
    /// `rkey`.
    pub fn rkey(&self) -> u32 {
        le32(self.buffer.as_ref(), 4)
    }
}

/// The meaning of an rkey response: chunk `buf_id` is now reachable under `rkey`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RkeyRspRepr {
    /// The chunk.
    pub buf_id: u16,
    /// Its new rkey.
    pub rkey: u32,
}

impl RkeyRspRepr {
    /// Parses (type `RKEY_RSP`; `buf_id` is checked by the receiver against its queue depth
    /// and the immediate).
    ///
    /// # Errors
    /// [`Bad::Truncated`], [`Bad::MsgType`].
    pub fn parse<T: AsRef<[u8]>>(p: &RkeyRsp<T>) -> Result<Self> {
        p.check_len()?;
        if p.msg_type() != MsgType::RkeyRsp {
            return Err(Bad::MsgType);
        }
        Ok(Self {
            buf_id: p.buf_id(),
            rkey: p.rkey(),
        })
    }

    /// The 8 bytes.
    pub fn to_bytes(&self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[0..2].copy_from_slice(&u16::from(MsgType::RkeyRsp).to_le_bytes());
        b[2..4].copy_from_slice(&self.buf_id.to_le_bytes());
        b[4..8].copy_from_slice(&self.rkey.to_le_bytes());
        b
    }
}
