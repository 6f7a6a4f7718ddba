//! The server side of `dp-perf rtrs`: an RTRS server whose handler is a RAM disk. READs are
//! answered from its memory: the disk is a registered source and the block is RDMA-written
//! to the client from it (`resp_rdma_from`, zero copy), or with `--server-copy` the block
//! is copied into the request's chunk and written from there, as Linux's RTRS servers
//! answer. WRITEs are copied from the chunk into the disk.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use dataplane::fabric::Provider;
use dataplane::rtrs::error::RtrsError;
use dataplane::rtrs::fabric::ServerDriver;
use dataplane::rtrs::srv::{Server, ServerConfig, ServerEvent, ServerIo, SrvLinkEv};
use dataplane::rtrs::wire::{DEFAULT_MAX_HDR_SIZE, MIN_CHUNK_SIZE};
use dataplane::rtrs::work::{Dir, SrcRef};
use lcore::time::{Clock, RealClock};
use mempool::memory::{Region, RegionConfig};

use super::msg::{BYE, USR_LEN};
use crate::PerfError;
use crate::harness::Idle;

/// Blocks of the RAM disk (the block a request names is taken modulo this).
pub(super) const DISK_BLOCKS: u64 = 1024;

/// The chunk size for `bs`-byte requests: room for the data and the header, a power of two
/// of at least 8 KiB.
pub(super) fn chunk_size(bs: u32) -> u32 {
    (bs + DEFAULT_MAX_HDR_SIZE)
        .next_power_of_two()
        .max(MIN_CHUNK_SIZE)
}

/// What the server did.
#[derive(Debug, Clone, Copy, Default)]
pub struct Served {
    /// READ requests answered.
    pub reads: u64,
    /// WRITE requests stored.
    pub writes: u64,
    /// Requests refused (a malformed user message).
    pub refused: u64,
}

/// How the server answers.
#[derive(Debug, Clone, Copy)]
pub(super) struct Answer {
    /// Chunks of the session.
    pub(super) queue_depth: u16,
    /// Bytes per block.
    pub(super) bs: u32,
    /// Spin when idle.
    pub(super) busy: bool,
    /// READs through the chunk instead of from the disk.
    pub(super) copy: bool,
    /// Each chunk's key invalidated per request and rotated (`always_invalidate`).
    pub(super) always_invalidate: bool,
}

/// Serves one client session on `addrs` (one listener per path) until the client says bye
/// and its session is gone.
pub(super) fn serve<P: Provider>(
    dev: Arc<P::Device>,
    addrs: &[SocketAddr],
    how: Answer,
) -> Result<Served, PerfError> {
    let Answer {
        queue_depth,
        bs,
        busy,
        copy,
        always_invalidate,
    } = how;
    let fail = |what: &str, e: &dyn std::fmt::Display| PerfError::Fabric(format!("{what}: {e}"));
    let clock = RealClock::new();
    let mut drv = ServerDriver::<P>::new(dev, addrs).map_err(|e| fail("listening", &e))?;
    let mut srv = Server::new(ServerConfig {
        queue_depth,
        chunk_size: chunk_size(bs),
        always_invalidate,
        ..ServerConfig::default()
    })
    .map_err(|e| PerfError::Usage(format!("server configuration: {e}")))?;
    let block = bs as usize;
    let disk = Arc::new(
        Region::new(&RegionConfig::new("rtrs-ramdisk", DISK_BLOCKS as usize * block).quiet())
            .map_err(|e| PerfError::Fabric(format!("the RAM disk: {e}")))?,
    );
    let mut stage = vec![0u8; block];
    for b in 0..DISK_BLOCKS as usize {
        for (i, x) in stage.iter_mut().enumerate() {
            *x = ((b * block + i) as u64).wrapping_mul(0x9E37_79B9) as u8;
        }
        disk.copy_in(b * block, &stage);
    }
    let source = drv
        .add_source(Arc::clone(&disk))
        .map_err(|e| fail("registering the RAM disk", &e))?;
    let mut served = Served::default();
    let mut usr = [0u8; USR_LEN];
    let mut bye = false;
    let mut idle = Idle::new(busy);
    let start = std::time::Instant::now();
    let mut connected = false;
    let mut lost: Option<std::time::Instant> = None;
    loop {
        let now = clock.now();
        let mut work = drv.poll(now, &mut srv);
        while let Some(ev) = srv.poll_event() {
            work += 1;
            match ev {
                ServerEvent::Request {
                    op,
                    sess,
                    chunk,
                    dir,
                    data_len,
                    usr_len,
                    read_len,
                } => {
                    let mut status = 0;
                    if usize::from(usr_len) != USR_LEN
                        || drv.read_chunk(sess, chunk, data_len, &mut usr).is_err()
                    {
                        served.refused += 1;
                        status = -libc::EINVAL;
                    } else if usr[8..] == BYE {
                        bye = true;
                    } else {
                        let b = u64::from_le_bytes(usr[..8].try_into().expect("8 bytes"));
                        let at = (b % DISK_BLOCKS) as usize * block;
                        match dir {
                            Dir::Read if !copy && read_len as usize <= block => {
                                served.reads += 1;
                                let src = SrcRef {
                                    id: source,
                                    offset: at as u64,
                                };
                                match srv.resp_rdma_from(now, op, src, &mut drv) {
                                    // A READ without data: answered below.
                                    Err(RtrsError::NotARead) => {}
                                    _ => continue,
                                }
                            }
                            Dir::Read => {
                                let n = (read_len as usize).min(block);
                                match drv.chunk_mem(sess, chunk) {
                                    Ok((mem, off, len)) => {
                                        mem.copy_from(off, &disk, at, n.min(len))
                                    }
                                    Err(_) => status = -libc::EINVAL,
                                }
                                served.reads += 1;
                            }
                            Dir::Write => {
                                let n = (data_len as usize).min(block);
                                match drv.chunk_mem(sess, chunk) {
                                    Ok((mem, off, len)) => {
                                        disk.copy_from(at, &mem, off, n.min(len))
                                    }
                                    Err(_) => status = -libc::EINVAL,
                                }
                                served.writes += 1;
                            }
                        }
                    }
                    let _ = srv.resp_rdma(now, op, status, &mut drv);
                }
                ServerEvent::Link {
                    ev: SrvLinkEv::Connected,
                    ..
                } => {
                    connected = true;
                    lost = None;
                }
                ServerEvent::Link {
                    ev: SrvLinkEv::Disconnected,
                    ..
                } if bye => return Ok(served),
                ServerEvent::Link {
                    ev: SrvLinkEv::Disconnected,
                    ..
                } => lost = Some(std::time::Instant::now()),
                _ => {}
            }
        }
        if !connected && start.elapsed() > Duration::from_secs(60) {
            return Err(PerfError::Fabric(
                "no RTRS client connected within 60 s".into(),
            ));
        }
        if lost.is_some_and(|t| t.elapsed() > Duration::from_secs(30)) {
            return Err(PerfError::Fabric(
                "the RTRS client went away without saying bye, and did not come back within 30 s"
                    .into(),
            ));
        }
        idle.after(work);
    }
}
