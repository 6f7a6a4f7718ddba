//! The receive side's ack state (`i_ack_next`, `IB_ACK_REQUESTED`, `IB_ACK_IN_FLIGHT`) and
//! the send side's view of the peer's acks (`i_ack_recv`).

/// Ack state of a path (message flavour; a stream transport acks through its own bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AckState {
    /// Sequence number of the last message received whole (`i_ack_next`), dropped
    /// duplicates included: a retransmission must be acked again.
    pub next: u64,
    /// The ack value last put on the wire (piggybacked or ACK-only).
    pub sent: u64,
    /// An ack must go out (`IB_ACK_REQUESTED`).
    pub requested: bool,
    /// The ACK-only frame is in flight (`IB_ACK_IN_FLIGHT`): never more than one.
    pub in_flight: bool,
    /// The highest ack the peer sent that was applied (`i_ack_recv`).
    pub recv: u64,
}

impl AckState {
    /// The value to piggyback on an outgoing frame (`rds_ib_piggyb_ack`): clears the
    /// request. Returns (value, true if a request was pending).
    pub fn piggyback(&mut self) -> (u64, bool) {
        let was = self.requested;
        self.requested = false;
        self.sent = self.next;
        (self.next, was)
    }

    /// True if the peer has not been told about the last received message yet.
    pub fn owed(&self) -> bool {
        self.next != self.sent
    }
}
