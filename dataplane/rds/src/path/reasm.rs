//! Receive reassembly state: one message at a time per path, as RDS sends them.

use crate::store::MsgId;
use crate::wire::{HEADER_LEN, HeaderRepr};

/// A message being received (message flavour: fragment by fragment; stream flavour: byte
/// run by byte run).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partial {
    /// Its record (payload fragments are appended to it).
    pub msg: MsgId,
    /// The first fragment's header: later fragments must match its sequence, length and
    /// ports.
    pub hdr: HeaderRepr,
    /// Payload bytes still to come.
    pub rem: u32,
    /// Payload bytes stored.
    pub filled: u32,
}

/// The byte-stream receiver (`t_tinc_hdr_rem`, `t_tinc_data_rem` of RDS-TCP).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamRx {
    /// Collecting a header.
    Header {
        /// Bytes so far.
        buf: [u8; HEADER_LEN],
        /// How many.
        have: usize,
    },
    /// A header is complete but no record could be taken for it yet (store full).
    NeedRecord(HeaderRepr),
    /// Collecting a message's payload.
    Data(Partial),
}

impl Default for StreamRx {
    fn default() -> Self {
        Self::Header {
            buf: [0; HEADER_LEN],
            have: 0,
        }
    }
}
