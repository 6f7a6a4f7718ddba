//! What a path hands its transport, and what it asks of it.

use crate::store::{Chain, FragId, FragPool, RdmaOp};
use crate::wire::{FRAG_SIZE, HEADER_LEN};

/// A path: connection `conn` (an engine index), path `index` (0..8 on multipath
/// transports, else 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PathId {
    /// The connection's index in its engine.
    pub conn: u32,
    /// The path within the connection.
    pub index: u8,
}

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    /// A fragment (message flavour) or a whole message (stream flavour): data, ping, pong,
    /// probe.
    Data,
    /// A congestion-map update (or a fragment of one).
    CongMap,
    /// An ACK-only frame (message flavour): header only, ports 0, sequence 0.
    Ack,
}

/// A frame's payload: bytes of the engine's fragment region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxPayload {
    /// Header only.
    None,
    /// One fragment (message flavour): `len` bytes at the start of `frag`.
    Frag {
        /// The fragment.
        frag: FragId,
        /// Bytes used (1..=4096).
        len: u32,
    },
    /// A whole message (stream flavour): the chain's first `len` bytes.
    Chain {
        /// The message's fragments.
        chain: Chain,
        /// Payload bytes.
        len: u32,
    },
}

impl TxPayload {
    /// Payload bytes.
    pub const fn len(&self) -> usize {
        match *self {
            Self::None => 0,
            Self::Frag { len, .. } | Self::Chain { len, .. } => len as usize,
        }
    }

    /// True if there is no payload.
    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The payload as `(offset in the fragment region, length)` segments, in order: one for
    /// a fragment, one per fragment of a chain. A fabric transport posts them as scatter
    /// entries of the region's registration.
    pub fn segments<'a>(&self, frags: &'a FragPool) -> impl Iterator<Item = (usize, usize)> + 'a {
        let (chain, single, len) = match *self {
            Self::None => (Chain::EMPTY, None, 0),
            Self::Frag { frag, len } => (Chain::EMPTY, Some(frag), len as usize),
            Self::Chain { chain, len } => (chain, None, len as usize),
        };
        let mut left = len;
        single
            .into_iter()
            .chain(frags.iter(&chain))
            .map_while(move |f| {
                if left == 0 {
                    return None;
                }
                let n = left.min(FRAG_SIZE);
                left -= n;
                Some((f.offset(), n))
            })
    }

    /// Copies the payload into `out` (at least [`len`](Self::len) bytes): for transports
    /// that write bytes (stream sockets, the simulator).
    pub fn copy_to(&self, frags: &FragPool, out: &mut [u8]) {
        let mut at = 0;
        for (off, n) in self.segments(frags) {
            let f = FragId((off / FRAG_SIZE) as u32);
            frags.read(f, 0, &mut out[at..at + n]);
            at += n;
        }
    }
}

/// A frame to transmit. Hand it to the transport, and report its completion with
/// [`crate::Path::handle_send_complete`] (its `token`, or a later one: completions are
/// cumulative, in posting order).
#[must_use = "a frame taken from poll_transmit must be sent, or the path stalls"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxFrame {
    /// Completion token (the work-request id to use), increasing per path.
    pub token: u64,
    /// The 48-byte header.
    pub header: [u8; HEADER_LEN],
    /// The payload.
    pub payload: TxPayload,
    /// What the frame is.
    pub kind: FrameKind,
    /// The last frame of a message or update (RDS-IB signals and solicits it).
    pub last: bool,
    /// On a message's first frame: the RDMA operation to post just before it, on the same
    /// queue pair, so the data is in place before the peer sees the header
    /// (`rds_ib_xmit_rdma` ahead of `rds_ib_xmit`).
    pub rdma: Option<RdmaOp>,
}

impl TxFrame {
    /// Bytes on the wire: header plus payload.
    pub fn wire_len(&self) -> usize {
        HEADER_LEN + self.payload.len()
    }
}

/// A request to the transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathCmd {
    /// Dial the peer (RDMA CM connect with private data, TCP connect). Report the outcome
    /// with `handle_connected` or `handle_connect_failed`.
    Connect,
    /// Tear the connection down (flush everything posted). Report with
    /// `handle_transport_down` when done; no completion may be reported after that.
    Disconnect,
}

/// A received frame could not be stored: the message store is full. Keep it and offer it
/// again later (after the application reads, or on the next poll); nothing of it was used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RxRefused;
