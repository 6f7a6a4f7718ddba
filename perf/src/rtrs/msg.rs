//! The user message of every `dp-perf rtrs` request (RNBD's `rnbd_msg_io` in spirit): the
//! block number, then an 8-byte marker that is [`BYE`] on the client's last request.

/// Bytes of the user message: the block number (little endian), then the marker.
pub(super) const USR_LEN: usize = 16;
/// The marker of the client's last request: the server stops once the session is gone.
pub(super) const BYE: [u8; 8] = *b"DPPERFOK";
