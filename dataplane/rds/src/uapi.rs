//! The constants of `<linux/rds.h>` and the socket-level values the API mirrors, so a C
//! shim (like `apps/rsocket-c` for rsockets) can map calls one to one.

/// `AF_RDS` / `PF_RDS`.
pub const AF_RDS: i32 = 21;
/// `SOL_RDS`: the option level.
pub const SOL_RDS: i32 = 276;
/// `SOL_SOCKET`.
pub const SOL_SOCKET: i32 = 1;
/// `SO_SNDBUF` (level `SOL_SOCKET`).
pub const SO_SNDBUF: i32 = 7;
/// `SO_RCVBUF` (level `SOL_SOCKET`).
pub const SO_RCVBUF: i32 = 8;
/// `SO_TIMESTAMP_OLD` (also accepted at `SOL_RDS`).
pub const SO_TIMESTAMP_OLD: i32 = 29;
/// `SO_TIMESTAMP_NEW` (also accepted at `SOL_RDS`).
pub const SO_TIMESTAMP_NEW: i32 = 63;

/// `RDS_CANCEL_SENT_TO`: drop this socket's unacked messages to an address and port.
pub const RDS_CANCEL_SENT_TO: i32 = 1;
/// `RDS_GET_MR`.
pub const RDS_GET_MR: i32 = 2;
/// `RDS_FREE_MR`.
pub const RDS_FREE_MR: i32 = 3;
/// Deprecated `RDS_BARRIER`.
pub const RDS_BARRIER: i32 = 4;
/// `RDS_RECVERR`: RDMA operations also notify on failure.
pub const RDS_RECVERR: i32 = 5;
/// `RDS_CONG_MONITOR`: congestion-update notifications as control messages.
pub const RDS_CONG_MONITOR: i32 = 6;
/// `RDS_GET_MR_FOR_DEST`.
pub const RDS_GET_MR_FOR_DEST: i32 = 7;
/// `SO_RDS_TRANSPORT`: choose the transport before bind.
pub const SO_RDS_TRANSPORT: i32 = 8;
/// `SO_RDS_MSG_RXPATH_LATENCY`.
pub const SO_RDS_MSG_RXPATH_LATENCY: i32 = 10;

/// `RDS_TRANS_IB`.
pub const RDS_TRANS_IB: i32 = 0;
/// `RDS_TRANS_GAP` / `RDS_TRANS_IWARP` (deprecated; no transport registers it).
pub const RDS_TRANS_GAP: i32 = 1;
/// `RDS_TRANS_TCP`.
pub const RDS_TRANS_TCP: i32 = 2;
/// `RDS_TRANS_COUNT`: transport values at or above it are invalid.
pub const RDS_TRANS_COUNT: i32 = 3;
/// `RDS_TRANS_NONE`: what `SO_RDS_TRANSPORT` reads on an unbound socket.
pub const RDS_TRANS_NONE: i32 = !0;

/// `RDS_CMSG_RDMA_ARGS`.
pub const RDS_CMSG_RDMA_ARGS: i32 = 1;
/// `RDS_CMSG_RDMA_DEST`.
pub const RDS_CMSG_RDMA_DEST: i32 = 2;
/// `RDS_CMSG_RDMA_MAP`.
pub const RDS_CMSG_RDMA_MAP: i32 = 3;
/// `RDS_CMSG_RDMA_STATUS`.
pub const RDS_CMSG_RDMA_STATUS: i32 = 4;
/// `RDS_CMSG_CONG_UPDATE`.
pub const RDS_CMSG_CONG_UPDATE: i32 = 5;
/// `RDS_CMSG_ATOMIC_FADD`.
pub const RDS_CMSG_ATOMIC_FADD: i32 = 6;
/// `RDS_CMSG_ATOMIC_CSWP`.
pub const RDS_CMSG_ATOMIC_CSWP: i32 = 7;
/// `RDS_CMSG_MASKED_ATOMIC_FADD`.
pub const RDS_CMSG_MASKED_ATOMIC_FADD: i32 = 8;
/// `RDS_CMSG_MASKED_ATOMIC_CSWP`.
pub const RDS_CMSG_MASKED_ATOMIC_CSWP: i32 = 9;
/// `RDS_CMSG_RXPATH_LATENCY`.
pub const RDS_CMSG_RXPATH_LATENCY: i32 = 11;
/// `RDS_CMSG_ZCOPY_COOKIE`.
pub const RDS_CMSG_ZCOPY_COOKIE: i32 = 12;
/// `RDS_CMSG_ZCOPY_COMPLETION`.
pub const RDS_CMSG_ZCOPY_COMPLETION: i32 = 13;

/// `RDS_RDMA_READWRITE`: on `RDS_GET_MR`, the peer may write the region (else only read
/// it); on `RDS_CMSG_RDMA_ARGS`, the operation is an RDMA WRITE (else a READ).
pub const RDS_RDMA_READWRITE: u64 = 0x0001;
/// `RDS_RDMA_FENCE`: the SEND after the RDMA operation waits for it.
pub const RDS_RDMA_FENCE: u64 = 0x0002;
/// `RDS_RDMA_INVALIDATE`: invalidate the region's key when it is freed.
pub const RDS_RDMA_INVALIDATE: u64 = 0x0004;
/// `RDS_RDMA_USE_ONCE`: the region is freed when the peer's RDMA extension header for it
/// arrives.
pub const RDS_RDMA_USE_ONCE: u64 = 0x0008;
/// `RDS_RDMA_DONTWAIT`.
pub const RDS_RDMA_DONTWAIT: u64 = 0x0010;
/// `RDS_RDMA_NOTIFY_ME`: queue an `RDS_CMSG_RDMA_STATUS` when the operation completes.
pub const RDS_RDMA_NOTIFY_ME: u64 = 0x0020;
/// `RDS_RDMA_SILENT`: no notification at the receiver.
pub const RDS_RDMA_SILENT: u64 = 0x0040;
/// `UIO_MAXIOV`: the most local ranges of one RDMA operation (`nr_local`).
pub const UIO_MAXIOV: u64 = 1024;
/// `sizeof(struct rds_get_mr_args)`: `RDS_GET_MR`'s exact option length.
pub const GET_MR_ARGS_LEN: usize = 32;
/// `sizeof(struct rds_get_mr_for_dest_args)`: the args plus a `sockaddr_storage` (128).
pub const GET_MR_FOR_DEST_ARGS_LEN: usize = 160;
/// `sizeof(struct rds_free_mr_args)`: `RDS_FREE_MR`'s exact option length.
pub const FREE_MR_ARGS_LEN: usize = 16;

/// `RDS_RDMA_SUCCESS`.
pub const RDS_RDMA_SUCCESS: i32 = 0;
/// `RDS_RDMA_REMOTE_ERROR`.
pub const RDS_RDMA_REMOTE_ERROR: i32 = 1;
/// `RDS_RDMA_CANCELED`.
pub const RDS_RDMA_CANCELED: i32 = 2;
/// `RDS_RDMA_DROPPED`.
pub const RDS_RDMA_DROPPED: i32 = 3;
/// `RDS_RDMA_OTHER_ERROR`.
pub const RDS_RDMA_OTHER_ERROR: i32 = 4;

/// `MSG_DONTWAIT`.
pub const MSG_DONTWAIT: u32 = 0x40;
/// `MSG_PEEK`.
pub const MSG_PEEK: u32 = 0x02;
/// `MSG_TRUNC`.
pub const MSG_TRUNC: u32 = 0x20;
/// `MSG_OOB`.
pub const MSG_OOB: u32 = 0x01;
/// `MSG_CMSG_COMPAT`.
pub const MSG_CMSG_COMPAT: u32 = 0x8000_0000;
/// `MSG_ZEROCOPY`.
pub const MSG_ZEROCOPY: u32 = 0x0400_0000;

/// `POLLIN`.
pub const POLLIN: u16 = 0x001;
/// `POLLOUT`.
pub const POLLOUT: u16 = 0x004;
/// `POLLERR`.
pub const POLLERR: u16 = 0x008;
/// `POLLRDNORM`.
pub const POLLRDNORM: u16 = 0x040;
/// `POLLWRNORM`.
pub const POLLWRNORM: u16 = 0x100;
/// `POLLWRBAND`.
pub const POLLWRBAND: u16 = 0x200;

/// Linux's `net.core.wmem_default` and `rmem_default` (and `_max`): 212992.
pub const SOCK_BUF_DEFAULT: u32 = 212_992;
/// `SOCK_MIN_SNDBUF` on x86_64 (`2 * (2048 + SKB_DATA_ALIGN(sizeof(struct sk_buff)))`).
pub const SOCK_MIN_SNDBUF: u32 = 4608;
/// `SOCK_MIN_RCVBUF` on x86_64.
pub const SOCK_MIN_RCVBUF: u32 = 2304;
