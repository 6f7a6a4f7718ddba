//! The server side of one RNBD session, sans-IO: it takes the requests RTRS delivers
//! (direction, user message, the chunk holding the data) and answers them, either at once
//! (session info, open, close, refused IOs) or when the backend completes the IO.
//!
//! How RNBD uses RTRS (rtrs.md §9.2): `SESS_INFO` and `OPEN` arrive as RTRS **READ**
//! requests on the admin connection and their response structure is written into the chunk
//! (which RTRS then RDMA-writes into the client's buffer); `CLOSE` is a WRITE without data;
//! IO is a READ (data goes back to the client) or a WRITE (data came with the request) whose
//! chunk is the IO buffer, so the backend reads and writes the chunk directly (zero copy).
//!
//! Call order, from the lcore that polls the RTRS server session: for each request,
//! [`ServerSession::handle`]; after polling the backends, [`ServerSession::complete`] for each
//! completion whose tag belongs to this session. Each returns the response (`errno`, 0 for
//! success) to send with `resp_rdma`, or `None` while the IO is in flight.

use std::path::PathBuf;

use crate::backend::{Backend, BlkIo, BlkOp};
use crate::export::Exports;
use crate::wire::{
    AccessMode, CACHE_FUA, CACHE_WRITEBACK, Close, F_FUA, F_PREFLUSH, Io, Msg, Op, OpenRsp,
    PROTO_VER_MAJOR, SECTOR, SessInfoRsp,
};

mod devs;
pub use devs::SessDevs;

/// The direction of an RTRS request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// RTRS READ: the server writes the answer (or the data) into the chunk.
    Read,
    /// RTRS WRITE: the chunk holds data from the client.
    Write,
}

/// One device this session has open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessDev {
    /// The device's resolved path (its key in [`Exports`]).
    pub path: PathBuf,
    /// The device's index in [`Exports`] ([`Exports::id_of`] of `path`).
    pub export: usize,
    /// The name the client opened it by (reopening the same name is idempotent).
    pub name: Vec<u8>,
    /// How it is open.
    pub mode: AccessMode,
    /// The IOs this session submitted to the device.
    pub stats: DevStats,
}

/// IOs one session submitted to one device's backend (what a client's
/// `/sys/block/rnbdN/stat` counts, seen from the server).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DevStats {
    /// Reads.
    pub reads: u64,
    /// Sectors (512 bytes) read.
    pub read_sectors: u64,
    /// Writes (write-zeroes included).
    pub writes: u64,
    /// Sectors written.
    pub write_sectors: u64,
    /// Flushes.
    pub flushes: u64,
    /// Discards (secure erase included).
    pub discards: u64,
}

impl DevStats {
    fn count(&mut self, op: BlkOp, len: u32) {
        let sectors = u64::from(len) / SECTOR;
        match op {
            BlkOp::Read => {
                self.reads += 1;
                self.read_sectors += sectors;
            }
            BlkOp::Write | BlkOp::WriteZeroes => {
                self.writes += 1;
                self.write_sectors += sectors;
            }
            BlkOp::Flush => self.flushes += 1,
            BlkOp::Discard => self.discards += 1,
        }
    }
}

/// Counters of one session.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessStats {
    /// Requests that were not a message the protocol has, or did not fit their chunk.
    pub malformed: u64,
    /// IOs naming a device this session has not open.
    pub unknown_device: u64,
    /// IOs submitted to a backend.
    pub ios: u64,
    /// IOs or opens refused (permission, range, unsupported operation).
    pub refused: u64,
}

/// The server side of one session.
#[derive(Debug)]
pub struct ServerSession {
    name: String,
    ver: u8,
    devices: SessDevs,
    stats: SessStats,
}

impl ServerSession {
    /// A new session named `name` (the RTRS session name: `%SESSNAME%` in the search path).
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            ver: PROTO_VER_MAJOR,
            devices: SessDevs::default(),
            stats: SessStats::default(),
        }
    }

    /// The session's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The devices this session has open, by id.
    pub fn devices(&self) -> &SessDevs {
        &self.devices
    }

    /// Counters.
    pub fn stats(&self) -> SessStats {
        self.stats
    }

    /// Handles one request: `usr` is the RNBD message, `chunk` the request's chunk
    /// (`chunk_len` bytes) — the data of a WRITE, or where a READ's answer goes. `tag`
    /// identifies the request in the backend's completion (see [`ServerSession::complete`]).
    /// Returns `Some(errno)` to answer at once (0: success), `None` when a backend IO is
    /// in flight.
    ///
    /// # Safety
    /// `chunk` must be valid for `chunk_len` bytes and untouched by anything else until the
    /// request is answered (for an in-flight IO: until its completion is handed to
    /// [`ServerSession::complete`]).
    pub unsafe fn handle<B: Backend>(
        &mut self,
        exports: &mut Exports<B>,
        tag: u64,
        dir: Dir,
        usr: &[u8],
        chunk: *mut u8,
        chunk_len: usize,
    ) -> Option<i32> {
        let Ok(msg) = Msg::parse(usr) else {
            self.stats.malformed += 1;
            return Some(libc::EINVAL);
        };
        // SAFETY: the caller's contract covers the chunk for the whole request.
        let answer = |bytes: &[u8]| unsafe { write_answer(chunk, chunk_len, bytes) };
        // A request whose answer cannot fit its chunk is refused before it changes anything
        // (an open must not leave the device open, and counted as a writer, behind a refusal).
        let fits = |len: usize| !chunk.is_null() && chunk_len >= len;
        match (dir, msg) {
            (Dir::Read, Msg::SessInfo(_)) if !fits(SessInfoRsp::LEN) => {
                self.stats.malformed += 1;
                Some(libc::EINVAL)
            }
            (Dir::Read, Msg::Open(_)) if !fits(OpenRsp::LEN) => {
                self.stats.malformed += 1;
                Some(libc::EINVAL)
            }
            (Dir::Read, Msg::SessInfo(s)) => {
                self.ver = s.ver.min(PROTO_VER_MAJOR);
                let mut b = [0u8; SessInfoRsp::LEN];
                SessInfoRsp { ver: self.ver }.emit(&mut b);
                Some(answer(&b))
            }
            (Dir::Read, Msg::Open(o)) => {
                Some(self.open(exports, o.access_mode, o.dev_name, &answer))
            }
            (Dir::Write, Msg::Close(Close { device_id })) => {
                match self.devices.remove(&device_id) {
                    Some(d) => {
                        exports.close(&d.path, d.mode);
                        Some(0)
                    }
                    None => {
                        self.stats.unknown_device += 1;
                        Some(libc::ENOTCONN)
                    }
                }
            }
            (dir, Msg::Io(io)) => {
                // SAFETY: forwarded contract.
                unsafe { self.io(exports, tag, dir, &io, chunk, chunk_len) }
            }
            _ => {
                self.stats.malformed += 1;
                Some(libc::EINVAL)
            }
        }
    }

    fn open<B: Backend>(
        &mut self,
        exports: &mut Exports<B>,
        mode: AccessMode,
        name: &[u8],
        answer: &dyn Fn(&[u8]) -> i32,
    ) -> i32 {
        // Reopening a name this session has open returns the same device (remap after a
        // reconnect relies on it).
        let known = self
            .devices
            .iter()
            .find(|(_, d)| d.name == name)
            .map(|(id, d)| (id, d.path.clone()));
        let (id, path) = match known {
            Some(x) => x,
            None => match exports.open(&self.name, name, mode) {
                Ok(path) => {
                    let Some(export) = exports.id_of(&path) else {
                        return libc::ENOENT;
                    };
                    let id = self.devices.insert(SessDev {
                        path: path.clone(),
                        export,
                        name: name.to_vec(),
                        mode,
                        stats: DevStats::default(),
                    });
                    (id, path)
                }
                Err(e) => {
                    self.stats.refused += 1;
                    return e.errno();
                }
            },
        };
        let Some(dev) = exports.get(&path) else {
            return libc::ENOENT;
        };
        let g = dev.backend.geometry();
        let rsp = OpenRsp {
            device_id: id,
            nsectors: g.bytes / SECTOR,
            max_hw_sectors: g.max_io / SECTOR as u32,
            max_write_zeroes_sectors: if g.write_zeroes {
                g.max_io / SECTOR as u32
            } else {
                0
            },
            max_discard_sectors: if g.discard {
                g.max_io / SECTOR as u32
            } else {
                0
            },
            discard_granularity: if g.discard {
                u32::from(g.logical_block)
            } else {
                0
            },
            discard_alignment: 0,
            physical_block_size: g.physical_block,
            logical_block_size: g.logical_block,
            max_segments: 128,
            secure_discard: 0,
            cache_policy: (if g.fua { CACHE_FUA } else { 0 })
                | (if g.write_cache { CACHE_WRITEBACK } else { 0 }),
        };
        let mut b = [0u8; OpenRsp::LEN];
        rsp.emit(&mut b);
        answer(&b)
    }

    /// # Safety
    /// As [`ServerSession::handle`].
    unsafe fn io<B: Backend>(
        &mut self,
        exports: &mut Exports<B>,
        tag: u64,
        dir: Dir,
        io: &Io,
        chunk: *mut u8,
        chunk_len: usize,
    ) -> Option<i32> {
        let Some(dev) = self.devices.get_mut(&io.device_id) else {
            self.stats.unknown_device += 1;
            return Some(libc::ENOTCONN);
        };
        if !io.rw.supported() {
            self.stats.refused += 1;
            return Some(libc::EOPNOTSUPP);
        }
        let op = match io.rw.op() {
            Op::Read => BlkOp::Read,
            Op::Write => BlkOp::Write,
            Op::Flush => BlkOp::Flush,
            Op::Discard | Op::SecureErase => BlkOp::Discard,
            Op::WriteZeroes => BlkOp::WriteZeroes,
            Op::Unknown(_) => return Some(libc::EOPNOTSUPP),
        };
        let writes = !matches!(op, BlkOp::Read);
        if writes && dev.mode == AccessMode::Ro {
            self.stats.refused += 1;
            return Some(libc::EPERM);
        }
        // The direction must match the operation, and data must fit the chunk.
        let wants = if op == BlkOp::Read {
            Dir::Read
        } else {
            Dir::Write
        };
        let carries = matches!(op, BlkOp::Read | BlkOp::Write);
        if dir != wants || (carries && io.bi_size as usize > chunk_len) {
            self.stats.malformed += 1;
            return Some(libc::EINVAL);
        }
        let Some(offset) = io.offset() else {
            self.stats.refused += 1;
            return Some(libc::EINVAL);
        };
        let Some(d) = exports.by_id_mut(dev.export) else {
            return Some(libc::ENODEV);
        };
        let blk = BlkIo {
            tag,
            op,
            offset,
            len: io.bi_size,
            buf: if carries {
                chunk
            } else {
                core::ptr::null_mut()
            },
            fua: io.rw.flags() & F_FUA != 0,
            preflush: io.rw.flags() & F_PREFLUSH != 0,
        };
        // SAFETY: the chunk is valid and ours until the completion (caller's contract).
        match unsafe { d.backend.submit(blk) } {
            Ok(()) => {
                self.stats.ios += 1;
                dev.stats.count(op, io.bi_size);
                None
            }
            Err(_) => Some(libc::EAGAIN),
        }
    }

    /// The answer for a backend completion of one of this session's IOs: 0 or an errno.
    pub fn complete(&mut self, result: i32) -> i32 {
        -result.min(0)
    }
}

/// Writes `bytes` at the start of the chunk, if it fits: 0, or `EINVAL`.
///
/// # Safety
/// `chunk` valid for `chunk_len` writable bytes.
unsafe fn write_answer(chunk: *mut u8, chunk_len: usize, bytes: &[u8]) -> i32 {
    if chunk.is_null() || bytes.len() > chunk_len {
        return libc::EINVAL;
    }
    // SAFETY: the chunk holds at least bytes.len() writable bytes (checked; contract).
    unsafe { core::ptr::copy_nonoverlapping(bytes.as_ptr(), chunk, bytes.len()) };
    0
}

#[cfg(test)]
mod tests;
