//! A recording driver: [`Recorder`] implements both [`ClientIo`] and [`ServerIo`] with
//! plain memory and no network, and records every call, so a test (or a fuzz target) can
//! play the peer of one state machine by hand: read what it posted, answer anything.

use std::collections::{HashMap, VecDeque};

use dp_fabric::PostError;

use crate::clt::{ClientIo, DataRef, Mapped};
use crate::srv::{CmToken, ServerIo, SessId};
use crate::wire::SgDesc;
use crate::work::{Conn, Dir, OutOfBounds, PathId, QpSizes, RecvBuf, SrcRef, Wr};

/// One recorded call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    /// `connect(conn, private_data)`.
    Connect(Conn, [u8; 56]),
    /// `accept(token, conn, private_data)`.
    Accept(CmToken, Conn, [u8; 56]),
    /// `reject(token, private_data)`.
    Reject(CmToken, [u8; 56]),
    /// `close_path(path)`.
    ClosePath(PathId),
    /// `post_send(conn, chain)`, each request summarised.
    Send(Conn, Vec<Posted>),
    /// `post_recv(conn, wr_id, buf)`.
    Recv(Conn, u64, RecvBuf),
    /// `create_session`.
    CreateSession(SessId),
    /// `free_session`.
    FreeSession(SessId),
}

/// A posted send work request, owned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Posted {
    /// Its id.
    pub wr_id: u64,
    /// Signalled.
    pub signaled: bool,
    /// What it is: the variant name.
    pub kind: &'static str,
    /// Its immediate, if any.
    pub imm: Option<u32>,
    /// Its payload, if it carries bytes the state machine gave (SEND messages).
    pub bytes: Vec<u8>,
    /// A key it names (invalidation, registration, remote key).
    pub key: Option<u32>,
    /// Remote address, if any.
    pub addr: Option<u64>,
    /// The chunk or permit slot, if any.
    pub slot: Option<u16>,
    /// Length moved (IO request header bytes, chunk bytes).
    pub len: Option<u32>,
}

impl Posted {
    fn of(w: &Wr<'_>) -> Self {
        let mut p = Self {
            wr_id: w.wr_id(),
            signaled: w.signaled(),
            kind: "",
            imm: None,
            bytes: Vec::new(),
            key: None,
            addr: None,
            slot: None,
            len: None,
        };
        match *w {
            Wr::SendMsg { bytes, .. } => {
                p.kind = "SendMsg";
                p.bytes = bytes.to_vec();
            }
            Wr::WriteImmEmpty { imm, .. } => {
                p.kind = "WriteImmEmpty";
                p.imm = Some(imm);
            }
            Wr::IoRequest {
                remote,
                slot,
                iu_len,
                imm,
                ..
            } => {
                p.kind = "IoRequest";
                p.imm = Some(imm);
                p.key = Some(remote.rkey);
                p.addr = Some(remote.addr);
                p.slot = Some(slot);
                p.len = Some(iu_len);
            }
            Wr::Register { token, .. } => {
                p.kind = "Register";
                p.key = Some(token as u32);
            }
            Wr::LocalInv { key, .. } => {
                p.kind = "LocalInv";
                p.key = Some(key);
            }
            Wr::WriteChunk {
                chunk, len, remote, ..
            } => {
                p.kind = "WriteChunk";
                p.slot = Some(chunk);
                p.len = Some(len);
                p.key = Some(remote.rkey);
                p.addr = Some(remote.addr);
            }
            Wr::WriteSource {
                src, len, remote, ..
            } => {
                p.kind = "WriteSource";
                p.slot = u16::try_from(src.id).ok();
                p.len = Some(len);
                p.key = Some(remote.rkey);
                p.addr = Some(remote.addr);
            }
            Wr::SendInv { rkey, .. } => {
                p.kind = "SendInv";
                p.key = Some(rkey);
            }
            Wr::RegChunk { chunk, key, .. } => {
                p.kind = "RegChunk";
                p.slot = Some(chunk);
                p.key = Some(key);
            }
            Wr::SendImmMsg { bytes, imm, .. } => {
                p.kind = "SendImmMsg";
                p.imm = Some(imm);
                p.bytes = bytes.to_vec();
            }
        }
        p
    }
}

/// A driver that records (see the module doc). Posting never fails unless a test sets
/// [`fail_posts`](Recorder::fail_posts).
#[derive(Debug, Default)]
pub struct Recorder {
    /// Every call, in order.
    pub calls: Vec<Call>,
    /// Per-permit header buffers (client).
    pub iu: HashMap<u16, Vec<u8>>,
    /// Session chunks (server): `queue_depth * chunk_size` bytes each.
    pub chunks: HashMap<SessId, Vec<u8>>,
    /// Chunk size of the sessions.
    pub chunk_size: u32,
    /// Fail every post with this error.
    pub fail_posts: Option<PostError>,
    /// `map_data` registers per IO (one-shot keys).
    pub per_io_registration: bool,
    /// Receives posted and not yet consumed, per connection.
    pub recvs: HashMap<Conn, VecDeque<(u64, RecvBuf)>>,
    /// `max_hdr_size` of the header buffers.
    pub iu_size: usize,
    /// Accesses refused as out of bounds (`write_iu`, `read_chunk`): a state machine asked
    /// for something outside a buffer.
    pub bounds_faults: u64,
    /// Lengths of the handler sources (server), by source number.
    pub sources: Vec<u64>,
    next_key: u32,
}

impl Recorder {
    /// A recorder with 4 KiB header buffers.
    pub fn new() -> Self {
        Self {
            iu_size: 4096,
            next_key: 0x100,
            ..Self::default()
        }
    }

    /// Takes the recorded calls.
    pub fn take(&mut self) -> Vec<Call> {
        std::mem::take(&mut self.calls)
    }

    /// The oldest receive posted on `conn`, consumed.
    pub fn pop_recv(&mut self, conn: Conn) -> Option<(u64, RecvBuf)> {
        self.recvs.get_mut(&conn)?.pop_front()
    }

    /// Every send work request posted on `conn` so far (not consumed).
    pub fn sends(&self, conn: Conn) -> Vec<Posted> {
        self.calls
            .iter()
            .filter_map(|c| match c {
                Call::Send(k, v) if *k == conn => Some(v.clone()),
                _ => None,
            })
            .flatten()
            .collect()
    }

    fn post(&mut self, conn: Conn, chain: &[Wr<'_>]) -> Result<(), PostError> {
        if let Some(e) = self.fail_posts {
            return Err(e);
        }
        self.calls
            .push(Call::Send(conn, chain.iter().map(Posted::of).collect()));
        Ok(())
    }

    fn recv(&mut self, conn: Conn, wr_id: u64, buf: RecvBuf) -> Result<(), PostError> {
        if let Some(e) = self.fail_posts {
            return Err(e);
        }
        self.recvs.entry(conn).or_default().push_back((wr_id, buf));
        if !matches!(self.calls.last(), Some(Call::Recv(c, _, b)) if *c == conn && *b == buf) {
            self.calls.push(Call::Recv(conn, wr_id, buf));
        }
        Ok(())
    }
}

impl ClientIo for Recorder {
    fn connect(&mut self, conn: Conn, _sizes: QpSizes, private_data: &[u8; 56]) -> Result<(), i32> {
        self.calls.push(Call::Connect(conn, *private_data));
        Ok(())
    }

    fn close_path(&mut self, path: PathId) {
        self.recvs.retain(|c, _| c.path != path);
        self.calls.push(Call::ClosePath(path));
    }

    fn post_send(&mut self, conn: Conn, chain: &[Wr<'_>]) -> Result<(), PostError> {
        self.post(conn, chain)
    }

    fn post_recv(&mut self, conn: Conn, wr_id: u64, buf: RecvBuf) -> Result<(), PostError> {
        self.recv(conn, wr_id, buf)
    }

    fn map_data(
        &mut self,
        _conn: Conn,
        _slot: u16,
        data: &DataRef,
        _dir: Dir,
    ) -> Result<Mapped, i32> {
        let addr = 0x7000_0000_0000 + data.offset;
        if self.per_io_registration {
            self.next_key += 1;
            let k = self.next_key;
            return Ok(Mapped {
                addr,
                lkey: k,
                rkey: k,
                register: Some(u64::from(k)),
            });
        }
        Ok(Mapped {
            addr,
            lkey: 0x11,
            rkey: 0x22,
            register: None,
        })
    }

    fn write_iu(&mut self, slot: u16, off: u32, bytes: &[u8]) -> Result<(), OutOfBounds> {
        let n = self.iu_size;
        let b = self.iu.entry(slot).or_insert_with(|| vec![0; n]);
        let end = (off as usize).checked_add(bytes.len()).ok_or(OutOfBounds)?;
        b.get_mut(off as usize..end)
            .ok_or(OutOfBounds)?
            .copy_from_slice(bytes);
        Ok(())
    }
}

impl ServerIo for Recorder {
    fn accept(
        &mut self,
        req: CmToken,
        conn: Conn,
        _sizes: QpSizes,
        private_data: &[u8; 56],
    ) -> Result<(), i32> {
        self.calls.push(Call::Accept(req, conn, *private_data));
        Ok(())
    }

    fn reject(&mut self, req: CmToken, private_data: &[u8; 56]) {
        self.calls.push(Call::Reject(req, *private_data));
    }

    fn close_path(&mut self, path: PathId) {
        self.recvs.retain(|c, _| c.path != path);
        self.calls.push(Call::ClosePath(path));
    }

    fn post_send(&mut self, conn: Conn, chain: &[Wr<'_>]) -> Result<(), PostError> {
        self.post(conn, chain)
    }

    fn post_recv(&mut self, conn: Conn, wr_id: u64, buf: RecvBuf) -> Result<(), PostError> {
        self.recv(conn, wr_id, buf)
    }

    fn source_fits(&self, src: SrcRef, len: u32) -> bool {
        self.sources.get(src.id as usize).is_some_and(|&n| {
            src.offset
                .checked_add(u64::from(len))
                .is_some_and(|e| e <= n)
        })
    }

    fn create_session(
        &mut self,
        sess: SessId,
        queue_depth: u16,
        chunk_size: u32,
    ) -> Result<(), i32> {
        self.chunk_size = chunk_size;
        self.chunks.insert(
            sess,
            vec![0; usize::from(queue_depth) * chunk_size as usize],
        );
        self.calls.push(Call::CreateSession(sess));
        Ok(())
    }

    fn free_session(&mut self, sess: SessId) {
        self.chunks.remove(&sess);
        self.calls.push(Call::FreeSession(sess));
    }

    fn map_chunks(
        &mut self,
        sess: SessId,
        path: PathId,
        per_chunk: bool,
        table: &mut Vec<SgDesc>,
    ) -> Result<(), i32> {
        let mem = self.chunks.get(&sess).ok_or(-libc::ENOENT)?;
        let cs = u64::from(self.chunk_size);
        let qd = mem.len() as u64 / cs;
        let base = 0x5000_0000_0000 + (u64::from(sess.idx) << 36);
        table.clear();
        let n = if per_chunk { qd } else { 1 };
        for r in 0..n {
            table.push(SgDesc {
                addr: base + r * (qd / n) * cs,
                key: (u32::from(path.idx) + 1) << 24 | (r as u32) << 8,
                len: ((qd / n) * cs) as u32,
            });
        }
        Ok(())
    }

    fn read_chunk(
        &mut self,
        sess: SessId,
        chunk: u16,
        off: u32,
        out: &mut [u8],
    ) -> Result<(), OutOfBounds> {
        let cs = self.chunk_size as usize;
        let at = usize::from(chunk) * cs;
        let src = (off as usize)
            .checked_add(out.len())
            .filter(|&end| end <= cs)
            .and_then(|end| self.chunks.get(&sess)?.get(at + off as usize..at + end));
        match src {
            Some(b) => {
                out.copy_from_slice(b);
                Ok(())
            }
            None => {
                self.bounds_faults += 1;
                Err(OutOfBounds)
            }
        }
    }
}
