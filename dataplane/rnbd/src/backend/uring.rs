//! A file or block device through `io_uring` (the `io-uring` crate: the tokio project's
//! thin, well-kept binding of the kernel interface, with no runtime attached).
//!
//! The ring is created with a kernel submission-polling thread (`IORING_SETUP_SQPOLL`):
//! submitting is writing an entry into the shared submission queue and completions are read
//! from the shared completion queue, so a steady stream of IOs makes no system call. Only
//! when the kernel thread has gone idle (after [`UringConfig::sq_idle_ms`] without work)
//! does a submit wake it with one `io_uring_enter`. Reads and writes go straight to the
//! device with `O_DIRECT` unless the configuration says otherwise; FUA writes use
//! `RWF_DSYNC`; flush is `fsync`; discard and write-zeroes are `fallocate` (punch hole,
//! zero range), which block devices support too.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use io_uring::{IoUring, opcode, squeue, types};

use super::{Backend, BlkDone, BlkIo, BlkOp, Geometry, check};

/// How to open a file or block device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UringConfig {
    /// Submission-queue entries (also the most IOs in flight).
    pub entries: u32,
    /// Bypass the page cache (`O_DIRECT`): buffers and offsets must be aligned to the
    /// logical block size.
    pub direct: bool,
    /// Open read-only.
    pub read_only: bool,
    /// Milliseconds of idleness after which the kernel's polling thread sleeps.
    pub sq_idle_ms: u32,
}

impl Default for UringConfig {
    fn default() -> Self {
        Self {
            entries: 256,
            direct: true,
            read_only: false,
            sq_idle_ms: 2000,
        }
    }
}

/// A file or block device served through `io_uring`.
pub struct UringBackend {
    ring: IoUring,
    file: File,
    geo: Geometry,
    in_flight: usize,
    refused: VecDeque<BlkDone>,
}

impl core::fmt::Debug for UringBackend {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("UringBackend")
            .field("fd", &self.file.as_raw_fd())
            .field("geometry", &self.geo)
            .field("in_flight", &self.in_flight)
            .finish()
    }
}

/// The tag of a preflush's fsync (never a caller's tag: RTRS tags are small).
const PREFLUSH_TAG: u64 = u64::MAX;

const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const BLKSSZGET: libc::c_ulong = 0x1268;
const BLKPBSZGET: libc::c_ulong = 0x127B;

fn ioctl_u64(f: &File, req: libc::c_ulong) -> io::Result<u64> {
    let mut v: u64 = 0;
    // SAFETY: the request writes one u64 (BLKGETSIZE64) into the live local.
    if unsafe { libc::ioctl(f.as_raw_fd(), req, &raw mut v) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v)
}

fn ioctl_u32(f: &File, req: libc::c_ulong) -> io::Result<u32> {
    let mut v: libc::c_int = 0;
    // SAFETY: the request writes one int (BLKSSZGET, BLKPBSZGET) into the live local.
    if unsafe { libc::ioctl(f.as_raw_fd(), req, &raw mut v) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v as u32)
}

impl UringBackend {
    /// Opens `path` (a regular file or a block device).
    ///
    /// # Errors
    /// Opening the file (with `O_DIRECT` on a filesystem that refuses it, set
    /// `direct: false`), reading its size, or setting up the ring (a kernel without
    /// `io_uring`, or one that forbids it: `kernel.io_uring_disabled`).
    pub fn open(path: &Path, cfg: &UringConfig) -> io::Result<Self> {
        let mut opts = OpenOptions::new();
        opts.read(true).write(!cfg.read_only);
        if cfg.direct {
            opts.custom_flags(libc::O_DIRECT);
        }
        let file = opts
            .open(path)
            .map_err(|e| io::Error::new(e.kind(), format!("opening {}: {e}", path.display())))?;
        let meta = file.metadata()?;
        let (bytes, logical, physical, blockdev) = if meta.file_type().is_block_device() {
            (
                ioctl_u64(&file, BLKGETSIZE64)?,
                ioctl_u32(&file, BLKSSZGET)?,
                ioctl_u32(&file, BLKPBSZGET)?,
                true,
            )
        } else {
            (meta.len(), 512, 4096, false)
        };
        let logical = logical.clamp(512, 4096) as u16;
        let ring = IoUring::builder()
            .setup_sqpoll(cfg.sq_idle_ms)
            .build(cfg.entries)
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "setting up io_uring with a polling thread: {e} (is io_uring disabled, \
                         sysctl kernel.io_uring_disabled?)"
                    ),
                )
            })?;
        Ok(Self {
            ring,
            file,
            geo: Geometry {
                bytes: bytes - bytes % u64::from(logical),
                logical_block: logical,
                physical_block: physical.clamp(512, 65536) as u16,
                max_io: 1 << 20,
                discard: true,
                write_zeroes: true,
                write_cache: !blockdev || !cfg.direct,
                fua: true,
            },
            in_flight: 0,
            refused: VecDeque::new(),
        })
    }
}

impl Backend for UringBackend {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    unsafe fn submit(&mut self, io: BlkIo) -> Result<(), BlkIo> {
        if let Some(e) = check(&self.geo, &io) {
            // Refused before the kernel sees it; reported by the next poll.
            self.refused.push_back(BlkDone {
                tag: io.tag,
                result: -e,
            });
            self.in_flight += 1;
            return Ok(());
        }
        let fd = types::Fd(self.file.as_raw_fd());
        let entry = match io.op {
            BlkOp::Read => opcode::Read::new(fd, io.buf, io.len)
                .offset(io.offset)
                .build(),
            BlkOp::Write => opcode::Write::new(fd, io.buf.cast_const(), io.len)
                .offset(io.offset)
                .rw_flags(if io.fua { libc::RWF_DSYNC } else { 0 })
                .build(),
            BlkOp::Flush => opcode::Fsync::new(fd).build(),
            BlkOp::Discard => opcode::Fallocate::new(fd, u64::from(io.len))
                .offset(io.offset)
                .mode(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE)
                .build(),
            BlkOp::WriteZeroes => opcode::Fallocate::new(fd, u64::from(io.len))
                .offset(io.offset)
                .mode(libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE)
                .build(),
        }
        .user_data(io.tag);
        let mut sq = self.ring.submission();
        let room = sq.capacity() - sq.len();
        let preflush = io.preflush && io.op != BlkOp::Flush;
        if room < 1 + usize::from(preflush) {
            return Err(io);
        }
        if preflush {
            // The cache is flushed first; the operation is linked to it and only runs (and
            // completes) after the flush did.
            let flush = opcode::Fsync::new(fd)
                .build()
                .flags(squeue::Flags::IO_LINK)
                .user_data(PREFLUSH_TAG);
            // SAFETY: an fsync references no memory; room was checked.
            let _ = unsafe { sq.push(&flush) };
        }
        // SAFETY: the buffer stays valid until the completion is polled (trait contract),
        // and the file is owned by self, which outlives the ring's use of it; room was
        // checked.
        let _ = unsafe { sq.push(&entry) };
        drop(sq);
        self.in_flight += 1;
        // With a polling thread this only makes a system call when the thread sleeps.
        let _ = self.ring.submit();
        Ok(())
    }

    fn poll(&mut self, out: &mut [BlkDone]) -> usize {
        let mut n = 0;
        while n < out.len() {
            let Some(d) = self.refused.pop_front() else {
                break;
            };
            out[n] = d;
            n += 1;
        }
        let mut cq = self.ring.completion();
        cq.sync();
        while n < out.len() {
            let Some(c) = cq.next() else {
                break;
            };
            if c.user_data() == PREFLUSH_TAG {
                // A failed preflush cancels its linked operation, which reports it.
                continue;
            }
            out[n] = BlkDone {
                tag: c.user_data(),
                result: c.result().min(0),
            };
            n += 1;
        }
        self.in_flight -= n;
        n
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }
}
