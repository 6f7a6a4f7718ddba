//! What a client session needs from the fabric driver that runs it: [`ClientIo`].

use crate::work::{Conn, Dir, OutOfBounds, PathId, QpSizes, RecvBuf, RegToken, Wr};
use dp_fabric::PostError;

/// The data of one request: a range of memory the driver has registered, in the driver's
/// own numbering (`region`). The driver resolves it per path, because paths may run on
/// different devices with different keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DataRef {
    /// The driver's registration.
    pub region: u32,
    /// Offset of the first byte in it.
    pub offset: u64,
    /// Bytes (the request's `data_len`).
    pub len: u32,
}

/// How the driver exposed a request's data on one path ([`ClientIo::map_data`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapped {
    /// Address of the first byte, in this path's registration (the iova).
    pub addr: u64,
    /// Local key, for a WRITE's gather.
    pub lkey: u32,
    /// Remote key, for a READ: the server RDMA-writes through it.
    pub rkey: u32,
    /// A per-IO registration to post ahead of the request ([`Wr::Register`]); its key must
    /// be invalidated before the request completes: the state machine then sets `NEED_INVAL`
    /// on a READ (the server invalidates with SEND_WITH_INV) and posts `LOCAL_INV` itself
    /// when the server did not. `None` for memory registered once (long-lived keys that are
    /// never invalidated; `NEED_INVAL` is then not set).
    pub register: Option<RegToken>,
}

/// The fabric driver of a client session. The session calls it to connect, post and map;
/// it feeds the session what happens ([`ClientSession`](super::ClientSession)'s `handle_*`).
///
/// Every method is called from the session's own lcore; none may block on the data path
/// (`post_send`, `post_recv`, `map_data`, `write_iu`).
pub trait ClientIo {
    /// Resolves the address and route of `conn.path`, creates the connection's queue pair
    /// with `sizes` (and its share of completion queue), and connects with `private_data`
    /// (the `conn_req`). The outcome comes back through `handle_cm` with this `conn`.
    ///
    /// # Errors
    /// A negative errno if the attempt cannot even start (the path then fails as if the CM
    /// had reported an address error).
    fn connect(&mut self, conn: Conn, sizes: QpSizes, private_data: &[u8; 56]) -> Result<(), i32>;

    /// Disconnects every connection of `path`, moves its queue pairs to the error state,
    /// drains them, and destroys them with their per-path registrations (the per-IO
    /// registrations of its requests included). When this returns no request of the path
    /// can still move data, so the session may fail them over; completions of the path that
    /// are still reported carry the old epoch and are ignored.
    fn close_path(&mut self, path: PathId);

    /// Posts a chain of send work requests on `conn`, in order, as one `ibv_post_send`.
    ///
    /// # Errors
    /// The provider's refusal; nothing of the chain was posted.
    fn post_send(&mut self, conn: Conn, chain: &[Wr<'_>]) -> Result<(), PostError>;

    /// Posts one receive on `conn` with a buffer of the kind asked; its completion comes back
    /// with `wr_id` and the bytes received.
    ///
    /// # Errors
    /// The provider's refusal.
    fn post_recv(&mut self, conn: Conn, wr_id: u64, buf: RecvBuf) -> Result<(), PostError>;

    /// Exposes a request's data for a request on `conn` through permit `slot`, for `dir`
    /// (WRITE: local read access; READ: remote write access for the server). With per-IO
    /// registration the driver prepares a registration of a fresh key (fast-registration
    /// of the slot's MR, or a bind of the slot's memory window) and returns its token: the
    /// session posts it at the head of the request's chain.
    ///
    /// # Errors
    /// A positive errno; the request then tries the next path.
    fn map_data(&mut self, conn: Conn, slot: u16, data: &DataRef, dir: Dir) -> Result<Mapped, i32>;

    /// Writes `bytes` at `off` of permit `slot`'s header buffer (`max_hdr_size` bytes per
    /// permit, registered for local access on every path): the user message, then the RTRS
    /// header.
    ///
    /// # Errors
    /// [`OutOfBounds`] if the range is outside the slot's buffer.
    fn write_iu(&mut self, slot: u16, off: u32, bytes: &[u8]) -> Result<(), OutOfBounds>;
}
