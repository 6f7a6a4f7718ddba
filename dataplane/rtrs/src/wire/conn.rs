//! Connection set-up: `rtrs_msg_conn_req` and `rtrs_msg_conn_rsp`, 56 bytes each, carried as
//! RDMA-CM private data (56 is what an InfiniBand CM REQ leaves a consumer).

use super::{
    Bad, Field, MAGIC, MAX_CONNS_PER_PATH, PROTO_VER, PROTO_VER_MAJOR, Result, le16, le32, major,
    need,
};

mod req_field {
    use super::Field;
    pub(super) const CMA_VERSION: usize = 0;
    pub(super) const IP_VERSION: usize = 1;
    pub(super) const MAGIC: usize = 2;
    pub(super) const VERSION: usize = 4;
    pub(super) const CID: usize = 6;
    pub(super) const CID_NUM: usize = 8;
    pub(super) const RECON_CNT: usize = 10;
    pub(super) const SESS_UUID: Field = 12..28;
    pub(super) const PATHS_UUID: Field = 28..44;
    pub(super) const FLAGS: usize = 44;
    pub(super) const RESERVED: Field = 45..56;
}

/// A typed view of `rtrs_msg_conn_req` (56 bytes, client to server).
///
/// Note the names: Linux calls the *path* UUID `sess_uuid` and the *session* UUID
/// `paths_uuid`; the accessors here say what they are.
#[derive(Debug, Clone)]
pub struct ConnReq<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ConnReq<T> {
    /// Length of the structure.
    pub const LEN: usize = 56;

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

    /// Checks the buffer holds all 56 bytes.
    ///
    /// # Errors
    /// [`Bad::Truncated`].
    pub fn check_len(&self) -> Result<()> {
        need(self.buffer.as_ref(), Self::LEN)
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// `__cma_version` (0 as sent; the CM may overwrite it).
    pub fn cma_version(&self) -> u8 {
        self.b()[req_field::CMA_VERSION]
    }
    /// `__ip_version` (0 as sent).
    pub fn ip_version(&self) -> u8 {
        self.b()[req_field::IP_VERSION]
    }
    /// `magic`.
    pub fn magic(&self) -> u16 {
        le16(self.b(), req_field::MAGIC)
    }
    /// `version`.
    pub fn version(&self) -> u16 {
        le16(self.b(), req_field::VERSION)
    }
    /// `cid`: this connection's index in the path.
    pub fn cid(&self) -> u16 {
        le16(self.b(), req_field::CID)
    }
    /// `cid_num`: connections in the path.
    pub fn cid_num(&self) -> u16 {
        le16(self.b(), req_field::CID_NUM)
    }
    /// `recon_cnt`.
    pub fn recon_cnt(&self) -> u16 {
        le16(self.b(), req_field::RECON_CNT)
    }
    /// `sess_uuid`: the UUID of the **path**.
    pub fn path_uuid(&self) -> [u8; 16] {
        let mut u = [0u8; 16];
        u.copy_from_slice(&self.b()[req_field::SESS_UUID]);
        u
    }
    /// `paths_uuid`: the UUID of the **session** (the group of paths).
    pub fn sess_uuid(&self) -> [u8; 16] {
        let mut u = [0u8; 16];
        u.copy_from_slice(&self.b()[req_field::PATHS_UUID]);
        u
    }
    /// The flags byte (bit 0: `first_conn`).
    pub fn flags(&self) -> u8 {
        self.b()[req_field::FLAGS]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ConnReq<T> {
    fn bm(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }
    /// Writes a little-endian `u16` at `at`.
    fn set16(&mut self, at: usize, v: u16) {
        self.bm()[at..at + 2].copy_from_slice(&v.to_le_bytes());
    }
}

/// The meaning of a connect request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnReqRepr {
    /// `version` as sent (the minor is informational).
    pub version: u16,
    /// This connection's index: 0 is the service connection.
    pub cid: u16,
    /// Connections in the path: `1..=`[`MAX_CONNS_PER_PATH`].
    pub cid_num: u16,
    /// The client's reconnect counter for this path (incremented per attempt).
    pub recon_cnt: u16,
    /// The path's UUID (`sess_uuid` on the wire).
    pub path_uuid: [u8; 16],
    /// The session's UUID (`paths_uuid` on the wire).
    pub sess_uuid: [u8; 16],
    /// `first_conn`: the server may create the session if it does not know it.
    pub first_conn: bool,
}

impl ConnReqRepr {
    /// Parses and checks what `rtrs_rdma_connect` checks: length, magic, major version,
    /// `cid_num <= 4096` (and not 0), `cid < cid_num`.
    ///
    /// # Errors
    /// The first [`Bad`] found.
    pub fn parse<T: AsRef<[u8]>>(p: &ConnReq<T>) -> Result<Self> {
        p.check_len()?;
        if p.magic() != MAGIC {
            return Err(Bad::Magic);
        }
        if major(p.version()) != PROTO_VER_MAJOR {
            return Err(Bad::Version);
        }
        let cid_num = p.cid_num();
        if cid_num == 0 || cid_num > MAX_CONNS_PER_PATH {
            return Err(Bad::ConnNum);
        }
        let cid = p.cid();
        if cid >= cid_num {
            return Err(Bad::Cid);
        }
        Ok(Self {
            version: p.version(),
            cid,
            cid_num,
            recon_cnt: p.recon_cnt(),
            path_uuid: p.path_uuid(),
            sess_uuid: p.sess_uuid(),
            first_conn: p.flags() & super::FIRST_CONN != 0,
        })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        ConnReq::<&[u8]>::LEN
    }

    /// Writes the 56 bytes (version [`PROTO_VER`], reserved bytes zero).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut ConnReq<T>) {
        let b = p.bm();
        b[..ConnReq::<&[u8]>::LEN].fill(0);
        p.set16(req_field::MAGIC, MAGIC);
        p.set16(req_field::VERSION, PROTO_VER);
        p.set16(req_field::CID, self.cid);
        p.set16(req_field::CID_NUM, self.cid_num);
        p.set16(req_field::RECON_CNT, self.recon_cnt);
        let b = p.bm();
        b[req_field::SESS_UUID].copy_from_slice(&self.path_uuid);
        b[req_field::PATHS_UUID].copy_from_slice(&self.sess_uuid);
        b[req_field::FLAGS] = if self.first_conn {
            super::FIRST_CONN
        } else {
            0
        };
        b[req_field::RESERVED].fill(0);
    }

    /// The 56 bytes.
    pub fn to_bytes(&self) -> [u8; 56] {
        let mut b = [0u8; 56];
        self.emit(&mut ConnReq::new_unchecked(&mut b[..]));
        b
    }
}

mod rsp_field {
    use super::Field;
    pub(super) const MAGIC: usize = 0;
    pub(super) const VERSION: usize = 2;
    pub(super) const ERRNO: usize = 4;
    pub(super) const QUEUE_DEPTH: usize = 6;
    pub(super) const MAX_IO_SIZE: usize = 8;
    pub(super) const MAX_HDR_SIZE: usize = 12;
    pub(super) const FLAGS: usize = 16;
    pub(super) const RESERVED: Field = 20..56;
}

/// A typed view of `rtrs_msg_conn_rsp` (56 bytes, the server's accept or reject data).
#[derive(Debug, Clone)]
pub struct ConnRsp<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ConnRsp<T> {
    /// Length of the structure.
    pub const LEN: usize = 56;

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

    /// Checks the buffer holds all 56 bytes.
    ///
    /// # Errors
    /// [`Bad::Truncated`].
    pub fn check_len(&self) -> Result<()> {
        need(self.buffer.as_ref(), Self::LEN)
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// `magic`.
    pub fn magic(&self) -> u16 {
        le16(self.b(), rsp_field::MAGIC)
    }
    /// `version`.
    pub fn version(&self) -> u16 {
        le16(self.b(), rsp_field::VERSION)
    }
    /// `errno` as sent: a negative errno in 16 bits on reject, 0 on accept.
    pub fn errno(&self) -> i16 {
        le16(self.b(), rsp_field::ERRNO) as i16
    }
    /// `queue_depth`.
    pub fn queue_depth(&self) -> u16 {
        le16(self.b(), rsp_field::QUEUE_DEPTH)
    }
    /// `max_io_size`.
    pub fn max_io_size(&self) -> u32 {
        le32(self.b(), rsp_field::MAX_IO_SIZE)
    }
    /// `max_hdr_size`.
    pub fn max_hdr_size(&self) -> u32 {
        le32(self.b(), rsp_field::MAX_HDR_SIZE)
    }
    /// `flags`.
    pub fn flags(&self) -> u32 {
        le32(self.b(), rsp_field::FLAGS)
    }
}

/// The meaning of a connect response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnRspRepr {
    /// `version` as sent.
    pub version: u16,
    /// 0 on accept; on reject a negative errno (`-EBUSY`: "previous session still exists").
    pub errno: i16,
    /// Chunks (and so permits) of the session.
    pub queue_depth: u16,
    /// The largest data length of one IO.
    pub max_io_size: u32,
    /// The room for user message plus RTRS header in a chunk.
    pub max_hdr_size: u32,
    /// `RTRS_MSG_NEW_RKEY_F` and bits this implementation does not know (kept as sent).
    pub flags: u32,
}

impl ConnRspRepr {
    /// Parses and checks what `rtrs_rdma_conn_established` checks: length, magic, major
    /// version. The errno and the sizes are left to [`check_accept`](Self::check_accept): a
    /// reject carries an errno and no sizes.
    ///
    /// # Errors
    /// [`Bad::Truncated`], [`Bad::Magic`], [`Bad::Version`].
    pub fn parse<T: AsRef<[u8]>>(p: &ConnRsp<T>) -> Result<Self> {
        p.check_len()?;
        if p.magic() != MAGIC {
            return Err(Bad::Magic);
        }
        if major(p.version()) != PROTO_VER_MAJOR {
            return Err(Bad::Version);
        }
        Ok(Self {
            version: p.version(),
            errno: p.errno(),
            queue_depth: p.queue_depth(),
            max_io_size: p.max_io_size(),
            max_hdr_size: p.max_hdr_size(),
            flags: p.flags(),
        })
    }

    /// An accept's parameters, checked beyond what Linux checks (a Linux client trusts them):
    /// a non-zero queue depth, a header room that holds an RTRS read header with one
    /// descriptor and is not larger than the chunk, a chunk size (`max_io_size +
    /// max_hdr_size`) that does not overflow, and a queue depth and chunk size that fit the
    /// 28-bit immediate.
    ///
    /// # Errors
    /// [`Bad::QueueDepth`], [`Bad::HdrSize`], [`Bad::ChunkSize`], [`Bad::ImmBudget`].
    pub fn check_accept(&self) -> Result<super::Geometry> {
        if self.queue_depth == 0 {
            return Err(Bad::QueueDepth);
        }
        let chunk = self
            .max_io_size
            .checked_add(self.max_hdr_size)
            .ok_or(Bad::ChunkSize)?;
        if (self.max_hdr_size as usize) < super::io::RdmaRead::<&[u8]>::hdr_len(1) {
            return Err(Bad::HdrSize);
        }
        super::Geometry::new(self.queue_depth, chunk)
    }

    /// True if the server re-keys chunks after every IO (`RTRS_MSG_NEW_RKEY_F`).
    pub const fn new_rkey(&self) -> bool {
        self.flags & super::MSG_NEW_RKEY_F != 0
    }

    /// `max_io_size + max_hdr_size`, saturating: the client's `chunk_size`.
    pub const fn chunk_size(&self) -> u32 {
        self.max_io_size.saturating_add(self.max_hdr_size)
    }

    /// A reject response carrying `errno` (a negative errno), as `rtrs_rdma_do_reject` sends.
    pub const fn reject(errno: i16) -> Self {
        Self {
            version: PROTO_VER,
            errno,
            queue_depth: 0,
            max_io_size: 0,
            max_hdr_size: 0,
            flags: 0,
        }
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        ConnRsp::<&[u8]>::LEN
    }

    /// Writes the 56 bytes (version [`PROTO_VER`], reserved bytes zero).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut ConnRsp<T>) {
        let b = &mut p.buffer.as_mut()[..ConnRsp::<&[u8]>::LEN];
        b.fill(0);
        b[rsp_field::MAGIC..rsp_field::MAGIC + 2].copy_from_slice(&MAGIC.to_le_bytes());
        b[rsp_field::VERSION..rsp_field::VERSION + 2].copy_from_slice(&PROTO_VER.to_le_bytes());
        b[rsp_field::ERRNO..rsp_field::ERRNO + 2].copy_from_slice(&self.errno.to_le_bytes());
        b[rsp_field::QUEUE_DEPTH..rsp_field::QUEUE_DEPTH + 2]
            .copy_from_slice(&self.queue_depth.to_le_bytes());
        b[rsp_field::MAX_IO_SIZE..rsp_field::MAX_IO_SIZE + 4]
            .copy_from_slice(&self.max_io_size.to_le_bytes());
        b[rsp_field::MAX_HDR_SIZE..rsp_field::MAX_HDR_SIZE + 4]
            .copy_from_slice(&self.max_hdr_size.to_le_bytes());
        b[rsp_field::FLAGS..rsp_field::FLAGS + 4].copy_from_slice(&self.flags.to_le_bytes());
        b[rsp_field::RESERVED].fill(0);
    }

    /// The 56 bytes.
    pub fn to_bytes(&self) -> [u8; 56] {
        let mut b = [0u8; 56];
        self.emit(&mut ConnRsp::new_unchecked(&mut b[..]));
        b
    }
}
