//! What a server needs from the fabric driver that runs it ([`ServerIo`]), and what it
//! reports to its user ([`ServerEvent`]).

use crate::wire::SgDesc;
use crate::work::{Conn, Dir, OutOfBounds, PathId, QpSizes, RecvBuf, SrcRef, Wr};
use dp_fabric::PostError;

/// The driver's handle of a pending connect request (its `rdma_cm_id`), answered with
/// [`ServerIo::accept`] or [`ServerIo::reject`].
pub type CmToken = u64;

/// A server session: the chunks shared by every path of one client session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessId {
    /// Slot in the server's session table.
    pub idx: u16,
    /// Generation of the slot.
    pub generation: u16,
}

/// One request waiting for its response (`struct rtrs_srv_op`): give it to
/// [`Server::resp_rdma`](super::Server::resp_rdma) exactly once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OpId {
    /// The path it came on.
    pub path: PathId,
    /// Its chunk.
    pub chunk: u16,
    /// Generation of the operation slot (stale ids are refused).
    pub generation: u32,
}

/// `enum rtrs_srv_link_ev`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SrvLinkEv {
    /// `RTRS_SRV_LINK_EV_CONNECTED`: the session's first path is up.
    Connected,
    /// `RTRS_SRV_LINK_EV_DISCONNECTED`: its last path went down.
    Disconnected,
}

/// What [`Server::resp_rdma`](super::Server::resp_rdma) did with a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resp {
    /// Posted.
    Sent,
    /// The send queue is full: it is posted by the server itself as room comes back
    /// (Linux's `rtrs_srv_resp_rdma` returning false).
    Queued,
    /// The path is not connected any more: nothing was sent (the client fails the request
    /// over).
    Dropped,
}

/// An event of a server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerEvent {
    /// A request (`rdma_ev`). Chunk `chunk` of session `sess` holds, for a WRITE, the data
    /// in `[0, data_len)` and the user message in `[data_len, data_len + usr_len)`; for a
    /// READ, the user message at the same place, and the handler writes the answer into
    /// `[0, read_len)`. Answer with `resp_rdma(op, status)` (0 or a negative errno).
    Request {
        /// The operation id to answer.
        op: OpId,
        /// The session (its chunk memory).
        sess: SessId,
        /// The chunk.
        chunk: u16,
        /// The direction.
        dir: Dir,
        /// Bytes before the user message.
        data_len: u32,
        /// Bytes of the user message.
        usr_len: u16,
        /// A READ's answer length (what the server RDMA-writes to the client); 0 for
        /// writes and for reads that move no data.
        read_len: u32,
    },
    /// A session's first path is up, or its last went down.
    Link {
        /// The session.
        sess: SessId,
        /// Which.
        ev: SrvLinkEv,
    },
    /// A path finished its info exchange (CONNECTED).
    PathUp {
        /// The path.
        path: PathId,
        /// Its session.
        sess: SessId,
    },
    /// A path is CLOSED and gone.
    PathClosed {
        /// The path.
        path: PathId,
        /// Its session.
        sess: SessId,
    },
}

/// The fabric driver of a server.
pub trait ServerIo {
    /// Creates the connection's queue pair with `sizes` and accepts the request `req` with
    /// `private_data` (the `conn_rsp`). Later events and completions of it carry `conn`.
    ///
    /// # Errors
    /// A negative errno: the server then rejects the request and closes the path.
    fn accept(
        &mut self,
        req: CmToken,
        conn: Conn,
        sizes: QpSizes,
        private_data: &[u8; 56],
    ) -> Result<(), i32>;

    /// Rejects the request `req` with `private_data` (a `conn_rsp` carrying the errno).
    fn reject(&mut self, req: CmToken, private_data: &[u8; 56]);

    /// Disconnects every connection of `path`, drains and destroys them, and unmaps the
    /// chunk registrations made for it by [`map_chunks`](Self::map_chunks).
    fn close_path(&mut self, path: PathId);

    /// Posts a chain of send work requests on `conn`, in order.
    ///
    /// # Errors
    /// The provider's refusal; nothing of the chain was posted.
    fn post_send(&mut self, conn: Conn, chain: &[Wr<'_>]) -> Result<(), PostError>;

    /// Posts one receive on `conn`.
    ///
    /// # Errors
    /// The provider's refusal.
    fn post_recv(&mut self, conn: Conn, wr_id: u64, buf: RecvBuf) -> Result<(), PostError>;

    /// Allocates the chunks of a new session: `queue_depth` chunks of `chunk_size` bytes
    /// (`get_or_create_srv`).
    ///
    /// # Errors
    /// A negative errno (`-ENOMEM`): the connect request is rejected with it.
    fn create_session(
        &mut self,
        sess: SessId,
        queue_depth: u16,
        chunk_size: u32,
    ) -> Result<(), i32>;

    /// Frees a session's chunks (its last path is gone).
    fn free_session(&mut self, sess: SessId);

    /// Registers the session's chunks for remote write on `path`'s device
    /// (`map_cont_bufs`) and fills `table` with the regions, in chunk order: with
    /// `per_chunk` (always_invalidate) exactly one region of `chunk_size` per chunk, so each
    /// chunk has a key of its own to invalidate and rotate; else regions of whole chunks whose
    /// count divides the queue depth. The server checks the table as a client would.
    ///
    /// # Errors
    /// A negative errno: the connect request is rejected with it.
    fn map_chunks(
        &mut self,
        sess: SessId,
        path: PathId,
        per_chunk: bool,
        table: &mut Vec<SgDesc>,
    ) -> Result<(), i32>;

    /// True if `src` names a source this driver registered on every path, with at least
    /// `len` bytes at its offset ([`Server::resp_rdma_from`](super::Server::resp_rdma_from)).
    /// A driver without sources answers false (the default).
    fn source_fits(&self, src: SrcRef, len: u32) -> bool {
        let _ = (src, len);
        false
    }

    /// Reads `out.len()` bytes at `off` of chunk `chunk` of `sess` (remote-writable memory:
    /// the driver copies, it never hands out a reference).
    ///
    /// # Errors
    /// [`OutOfBounds`] if the range is outside the chunk.
    fn read_chunk(
        &mut self,
        sess: SessId,
        chunk: u16,
        off: u32,
        out: &mut [u8],
    ) -> Result<(), OutOfBounds>;
}
