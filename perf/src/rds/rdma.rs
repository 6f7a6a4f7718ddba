//! `dp-perf rds-stress --rdma` (rds-stress's `-D`): the request's payload moves by RDMA
//! WRITE into a region the passive side registered for the socket, and the request
//! message, 16 bytes, carries the notification (`RDS_EXTHDR_RDMA`).
//!
//! How the sides meet: the active side sends a hello (sequence number [`HELLO`]) on each
//! socket until it has that socket's cookie; the passive side answers a hello with a
//! message carrying `RDS_CMSG_RDMA_DEST` (the cookie of the socket's region, registered
//! read-write with `RDS_GET_MR`). Hellos are neither counted nor acked. Both sides take
//! their RDMA memory from one window (a mempool region: hugepages when reserved) given to
//! the fabric transport.

use std::sync::Arc;

use dataplane::rds::node::RdsNode;
use dataplane::rds::uapi::RDS_RDMA_READWRITE;
use dataplane::rds::{RdsSocket, SendCmsg};
use mempool::memory::{Region, RegionConfig};

use crate::PerfError;

/// The sequence number of a hello (never a request's).
pub(crate) const HELLO: u64 = u64::MAX;

/// A window of `slots` regions of `len` bytes each (page-aligned slots), filled with
/// `fill`.
pub(crate) fn window(
    name: &str,
    slots: usize,
    len: usize,
    fill: u8,
) -> Result<Arc<Region>, PerfError> {
    let slot = len.next_multiple_of(4096).max(4096);
    let r = Region::new(&RegionConfig::new(name, slot * slots).quiet())
        .map_err(|e| PerfError::Fabric(format!("RDMA window: {e}")))?;
    if fill != 0 {
        r.copy_in(0, &vec![fill; slot * slots]);
    }
    Ok(Arc::new(r))
}

/// The offset of slot `k` in a window of `len`-byte slots.
pub(crate) fn slot(k: usize, len: usize) -> usize {
    k * len.next_multiple_of(4096).max(4096)
}

/// Registers slot `k` of `w` for socket `s` (read-write) and returns the cookie.
pub(crate) fn register(
    n: &mut RdsNode,
    s: RdsSocket,
    w: &Region,
    k: usize,
    len: usize,
) -> Result<u64, PerfError> {
    let addr = w.as_ptr() as u64 + slot(k, len) as u64;
    n.engine_mut()
        .get_mr(s, addr, len as u64, RDS_RDMA_READWRITE)
        .map_err(|e| PerfError::Fabric(format!("RDS_GET_MR: {e}")))
}

/// The control message of one request: WRITE `len` bytes from the start of `w` into the
/// peer's region `cookie`.
pub(crate) fn write_args(w: &Region, len: usize, cookie: u64, token: u64, flags: u64) -> SendCmsg {
    SendCmsg::RdmaArgs {
        cookie,
        remote_addr: 0,
        remote_bytes: len as u64,
        nr_local: 1,
        local_addr: w.as_ptr() as u64,
        local_bytes: len as u64,
        flags: RDS_RDMA_READWRITE | flags,
        user_token: token,
    }
}
