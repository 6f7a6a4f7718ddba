//! Where an exported device's blocks live: the [`Backend`] trait and its three
//! implementations.
//!
//! | backend | stores | data path |
//! |---|---|---|
//! | [`MemBackend`] | a mempool region (hugepages when reserved) | `memcpy` at submit time |
//! | [`NullBackend`] | nothing (reads return whatever the buffer held) | completes at submit time, for measuring the transport alone |
//! | [`UringBackend`] | a file or block device | `io_uring` with a kernel submission-polling thread: once the ring is set up, an IO costs no system call |
//!
//! A backend is driven from one lcore: [`Backend::submit`] queues an IO on a buffer the
//! caller owns until the IO completes (an RTRS chunk, registered memory), and
//! [`Backend::poll`] collects completions. Requests outside the device are refused at
//! submit time (`EINVAL`), never passed on.
#![allow(unsafe_code)]

mod mem;
mod null;
mod uring;

pub use mem::MemBackend;
pub use null::NullBackend;
pub use uring::{UringBackend, UringConfig};

/// What a device looks like to clients (filled into `OPEN_RSP`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Size in bytes (a multiple of the logical block size).
    pub bytes: u64,
    /// Logical block size (the smallest IO).
    pub logical_block: u16,
    /// Physical block size.
    pub physical_block: u16,
    /// Largest IO in bytes.
    pub max_io: u32,
    /// Discard supported.
    pub discard: bool,
    /// Write-zeroes supported.
    pub write_zeroes: bool,
    /// The device has a volatile write cache (flush matters).
    pub write_cache: bool,
    /// FUA writes are honoured.
    pub fua: bool,
}

/// A block operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlkOp {
    /// Read `len` bytes at `offset` into the buffer.
    Read,
    /// Write `len` bytes of the buffer at `offset` (with `fua`: durable when completed).
    Write,
    /// Make completed writes durable.
    Flush,
    /// Discard `len` bytes at `offset` (reads of them return zeroes afterwards).
    Discard,
    /// Write zeroes over `len` bytes at `offset`.
    WriteZeroes,
}

/// One IO handed to a backend.
#[derive(Clone, Copy, Debug)]
pub struct BlkIo {
    /// Returned in the completion.
    pub tag: u64,
    /// What to do.
    pub op: BlkOp,
    /// Byte offset on the device.
    pub offset: u64,
    /// Bytes.
    pub len: u32,
    /// The data buffer for reads and writes (`len` bytes); unused otherwise.
    pub buf: *mut u8,
    /// Force unit access (writes).
    pub fua: bool,
    /// Flush the device's cache before the operation.
    pub preflush: bool,
}

/// A completed IO: its tag and 0 or a negative errno.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlkDone {
    /// The IO's tag.
    pub tag: u64,
    /// 0, or `-errno`.
    pub result: i32,
}

/// A device's storage.
pub trait Backend: Send {
    /// The device's geometry.
    fn geometry(&self) -> Geometry;

    /// Queues `io`. Returns it back if the backend's queue is full (submit it again after
    /// a `poll`).
    ///
    /// # Safety
    /// For reads and writes, `io.buf` must be valid for `io.len` bytes (writable for
    /// reads) until the IO's completion is returned by [`Backend::poll`], and nothing else
    /// may access those bytes meanwhile.
    unsafe fn submit(&mut self, io: BlkIo) -> Result<(), BlkIo>;

    /// Writes completed IOs into `out`; returns how many.
    fn poll(&mut self, out: &mut [BlkDone]) -> usize;

    /// IOs submitted and not yet returned by `poll`.
    fn in_flight(&self) -> usize;
}

/// Checks `io` against `g`: `None` if it is allowed, else the errno to complete it with.
pub fn check(g: &Geometry, io: &BlkIo) -> Option<i32> {
    let in_range = io
        .offset
        .checked_add(u64::from(io.len))
        .is_some_and(|end| end <= g.bytes);
    let aligned = io.offset.is_multiple_of(u64::from(g.logical_block))
        && io.len.is_multiple_of(u32::from(g.logical_block));
    match io.op {
        BlkOp::Flush => None,
        _ if !in_range || !aligned => Some(libc::EINVAL),
        BlkOp::Read | BlkOp::Write if io.len > g.max_io || io.buf.is_null() => Some(libc::EINVAL),
        BlkOp::Discard if !g.discard => Some(libc::EOPNOTSUPP),
        BlkOp::WriteZeroes if !g.write_zeroes => Some(libc::EOPNOTSUPP),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
