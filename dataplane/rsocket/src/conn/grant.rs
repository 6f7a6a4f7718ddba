//! What this side granted its peer, and the checks of every peer-supplied value against it.
//!
//! The peer is untrusted: its immediates say how many bytes it wrote, where the credit
//! limit is, which iomap entry it filled. Each claim is checked against what we granted
//! (receive-buffer halves, message credits, iomap entries) or what the peer said about
//! itself at connection time (its receive-queue size). A claim that breaks a rule is a
//! [`Violation`]: the connection counts it and fails, as librdmacm's peers reset.
//!
//! # The receive window (`RxGrant`)
//!
//! The receive buffer is two halves. The first is granted in the connection data, the
//! second by the first credit update, and from then on a half each time the application has
//! consumed a half's worth of bytes (reference section 3.2). The peer fills the halves in
//! the order they were granted and never lets a chunk cross the end of a half (librdmacm
//! clips every chunk to its target entry), so the receiver knows where every byte lands
//! without trusting any address: the next data message starts where the last one ended, or
//! at the start of the next granted half once the current one is full.
//!
//! Invariant (checked in debug builds by the connection): bytes granted but not yet
//! filled, plus bytes filled but not yet consumed, plus bytes consumed but not yet granted
//! again, is the two halves.

use crate::wire::{BadConnData, MAX_CONN_CREDITS};

/// A rule of the stream protocol the peer broke, or a local access the I/O layer refused.
///
/// Recorded in [`ConnStats::last_violation`](super::ConnStats::last_violation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Violation {
    /// A receive completed without an immediate (rsocket peers send nothing else).
    NoImmediate,
    /// A data message of zero bytes.
    EmptyData,
    /// A data message whose length differs from the bytes its write carried.
    DataLenMismatch,
    /// More data messages than the credits granted.
    DataBeyondCredits,
    /// More bytes than granted and not yet filled.
    DataBeyondGrant,
    /// Data crossing the end of the receive-buffer half it lands in (or of the buffer).
    DataCrossesHalf,
    /// A credit update carrying something other than one target SGE or nothing.
    CreditLen,
    /// A credit update moving the limit backwards.
    CreditBackwards,
    /// A credit update granting more than the peer's receive queue holds.
    CreditBeyondPeerQueue,
    /// An iomap update carrying something other than one iomap entry.
    IomapLen,
    /// An iomap update naming an entry beyond the table we advertised.
    IomapIndex,
    /// `Write` in an immediate (`riowrite` is a plain RDMA WRITE; `Write` is a local tag).
    WriteImm,
    /// A reserved operation.
    ReservedOp,
    /// A control message with a payload.
    CtrlLen,
    /// A control code that is not sent on the wire (unknown, or keepalive).
    UnknownCtrl,
    /// Unusable connection data.
    ConnData(BadConnData),
    /// The state machine asked for a local access outside its own buffer and the I/O layer
    /// refused it (a bug, or a peer value that slipped past the checks above).
    LocalBounds,
}

impl Violation {
    /// A static description.
    pub const fn reason(self) -> &'static str {
        match self {
            Self::NoImmediate => "receive without an immediate",
            Self::EmptyData => "zero-length data message",
            Self::DataLenMismatch => "data length differs from the bytes written",
            Self::DataBeyondCredits => "more data messages than credits granted",
            Self::DataBeyondGrant => "more data bytes than granted",
            Self::DataCrossesHalf => "data crosses the end of a receive-buffer half",
            Self::CreditLen => "credit update with a payload other than one SGE",
            Self::CreditBackwards => "credit update moves the limit backwards",
            Self::CreditBeyondPeerQueue => "credit update beyond the peer's receive queue",
            Self::IomapLen => "iomap update with a payload other than one entry",
            Self::IomapIndex => "iomap update beyond the advertised table",
            Self::WriteImm => "write operation in an immediate",
            Self::ReservedOp => "reserved operation",
            Self::CtrlLen => "control message with a payload",
            Self::UnknownCtrl => "unknown control code",
            Self::ConnData(b) => b.reason(),
            Self::LocalBounds => "local access outside the socket's buffer",
        }
    }
}

impl core::fmt::Display for Violation {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.reason())
    }
}

/// The largest data field of an honest credit update: `rseq_no + rq_size`, computed
/// untruncated by librdmacm (`u16::MAX` + the largest receive queue).
pub(crate) const MAX_CREDIT_DATA: u32 = u16::MAX as u32 + MAX_CONN_CREDITS as u32;

/// Where the half after the one at `off` starts: halves follow each other and wrap to 0
/// when another would not fit (so an odd byte at the end of an odd-sized buffer is never
/// used). Granting and filling both go round in this order.
pub(crate) const fn next_half(off: u32, half: u32, rbuf_size: u32) -> u32 {
    let next = off + half;
    if next as u64 + half as u64 > rbuf_size as u64 {
        0
    } else {
        next
    }
}

/// Checks a credit update to limit `new` against the current limit `old`, with `sent`
/// data messages sent and a peer whose receive queue holds `peer_rq`: the limit may stay
/// or advance, but never beyond `sent + peer_rq` (librdmacm grants `rseq_no + rq_size`
/// with `rseq_no <= sent`). All in 16-bit sequence space.
pub(crate) fn check_credit_update(
    sent: u16,
    old: u16,
    new: u16,
    peer_rq: u16,
) -> Result<(), Violation> {
    let ahead_old = old.wrapping_sub(sent);
    let ahead_new = new.wrapping_sub(sent);
    if ahead_new > peer_rq {
        Err(Violation::CreditBeyondPeerQueue)
    } else if ahead_new < ahead_old {
        Err(Violation::CreditBackwards)
    } else {
        Ok(())
    }
}

/// The receive window granted to the peer: bytes (buffer halves) and messages (credits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RxGrant {
    half: u32,
    rbuf_size: u32,
    /// Where the next data byte lands.
    fill_off: u32,
    /// End of the half being filled (`fill_off <= fill_end <= rbuf_size`).
    fill_end: u32,
    /// Bytes granted and not yet filled.
    unfilled: u32,
    /// Data messages received (16-bit sequence).
    msgs: u16,
    /// The credit limit granted last (16-bit sequence).
    limit: u16,
}

impl RxGrant {
    /// The window of a new connection: the first half (granted in the connection data)
    /// and `credits` messages.
    pub(crate) const fn new(rbuf_size: u32, credits: u16) -> Self {
        let half = rbuf_size / 2;
        Self {
            half,
            rbuf_size,
            fill_off: 0,
            fill_end: half,
            unfilled: half,
            msgs: 0,
            limit: credits,
        }
    }

    /// Another half was granted.
    pub(crate) fn grant_half(&mut self) {
        self.unfilled += self.half;
        debug_assert!(
            self.unfilled <= 2 * self.half,
            "more than two halves granted"
        );
    }

    /// A credit update with limit `limit` was sent.
    pub(crate) fn grant_credits(&mut self, limit: u16) {
        self.limit = limit;
    }

    /// Bytes granted and not yet filled.
    pub(crate) const fn unfilled(&self) -> u32 {
        self.unfilled
    }

    /// Checks a data message of `len` bytes (already known non-zero) and accounts for it;
    /// returns where in the receive buffer it landed.
    pub(crate) fn accept_data(&mut self, len: u32) -> Result<u32, Violation> {
        if self.msgs == self.limit {
            return Err(Violation::DataBeyondCredits);
        }
        if len > self.unfilled {
            return Err(Violation::DataBeyondGrant);
        }
        if self.fill_off == self.fill_end {
            // The current half is full; the data starts the next granted one (there is
            // one: `len <= unfilled`).
            self.fill_off = next_half(self.fill_end - self.half, self.half, self.rbuf_size);
            self.fill_end = self.fill_off + self.half;
        }
        if len > self.fill_end - self.fill_off {
            return Err(Violation::DataCrossesHalf);
        }
        let off = self.fill_off;
        debug_assert!(off + len <= self.rbuf_size);
        self.fill_off += len;
        self.unfilled -= len;
        self.msgs = self.msgs.wrapping_add(1);
        Ok(off)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_alternate_and_odd_sizes_never_cross_the_end() {
        assert_eq!(next_half(0, 8, 16), 8);
        assert_eq!(next_half(8, 8, 16), 0);
        assert_eq!(next_half(0, 2, 5), 2);
        assert_eq!(next_half(2, 2, 5), 0, "a third half would cross the end");
        assert_eq!(next_half(0, 0x7FFF_FFFF, 0xFFFF_FFFF), 0x7FFF_FFFF);
        assert_eq!(next_half(0x7FFF_FFFF, 0x7FFF_FFFF, 0xFFFF_FFFF), 0);
    }

    #[test]
    fn credit_updates_stay_within_the_peer_queue_across_the_wrap() {
        assert_eq!(check_credit_update(0, 32, 32, 32), Ok(()));
        assert_eq!(check_credit_update(5, 32, 37, 32), Ok(()));
        assert_eq!(
            check_credit_update(5, 32, 38, 32),
            Err(Violation::CreditBeyondPeerQueue)
        );
        assert_eq!(
            check_credit_update(5, 32, 31, 32),
            Err(Violation::CreditBackwards)
        );
        assert_eq!(
            check_credit_update(5, 32, 4, 32),
            Err(Violation::CreditBeyondPeerQueue),
            "behind what was sent reads as far ahead"
        );
        assert_eq!(check_credit_update(65530, 65535, 20, 32), Ok(()));
        assert_eq!(
            check_credit_update(65530, 20, 65535, 32),
            Err(Violation::CreditBackwards)
        );
        assert_eq!(
            check_credit_update(65530, 20, 27, 32),
            Err(Violation::CreditBeyondPeerQueue)
        );
    }

    #[test]
    fn data_fills_granted_halves_in_order() {
        let mut g = RxGrant::new(16, 3);
        assert_eq!(g.accept_data(5), Ok(0));
        assert_eq!(g.accept_data(4), Err(Violation::DataBeyondGrant));
        g.grant_half();
        assert_eq!(g.accept_data(4), Err(Violation::DataCrossesHalf));
        assert_eq!(g.accept_data(3), Ok(5));
        assert_eq!(g.accept_data(8), Ok(8));
        assert_eq!(g.unfilled(), 0);
        assert_eq!(g.accept_data(1), Err(Violation::DataBeyondCredits));
        g.grant_credits(8);
        assert_eq!(g.accept_data(1), Err(Violation::DataBeyondGrant));
        g.grant_half();
        assert_eq!(g.accept_data(8), Ok(0), "the first half again");
    }
}
