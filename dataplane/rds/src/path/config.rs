//! What a path is configured with: the transport flavour and the kernel's tunables.

use std::time::Duration;

/// How a transport carries RDS frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// A message transport (RDS-IB, and the fabric transport over shm or verbs): every
    /// fragment of up to 4 KiB is one transport message with its own copy of the header;
    /// acks and credits travel in headers, ACK-only frames exist, headers are checksummed.
    Message,
    /// A byte stream (RDS-TCP): one header per message, then exactly `h_len` bytes; no
    /// credits, no ACK-only frames; a message is acked when the transport says every byte
    /// up to its end was acknowledged ([`crate::Path::handle_stream_acked`]).
    Stream,
}

/// Who may start a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectRule {
    /// Either side (RDS-IB): racing connects are resolved by the passive side's rules
    /// (refuse while connecting, replace a connection thought up) and random backoff.
    Any,
    /// Only the numerically lower address reconnects (RDS-TCP's `rds_queue_reconnect`):
    /// the higher side still dials once when it has something to send, to provoke the
    /// lower one, but never schedules retries, and paths above 0 are only ever dialled by
    /// the lower address.
    LowerAddress,
}

/// Tunables of one path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathConfig {
    /// The transport flavour.
    pub flavor: Flavor,
    /// Who dials.
    pub connect_rule: ConnectRule,
    /// Ask for credit-based flow control (message flavour). It runs when both sides ask:
    /// each grants its initial credits in the connection's private data, and a side that
    /// receives 0 runs without (`net.rds.ib.flow_control`; Linux's default is off).
    pub flow_control: bool,
    /// Fill in the header checksum on transmit (message flavour; RDS-IB always does).
    /// Received checksums are verified whatever this says (0 means "not checksummed").
    pub checksum: bool,
    /// Data frames the transport accepts before their completions return (RDS-IB's send
    /// ring, `max_send_wr` 256). One ACK-only frame may be in flight on top of it.
    pub send_depth: u32,
    /// `net.rds.max_unacked_packets`: ask for an ack at least every this many messages (8).
    pub max_unacked_packets: u32,
    /// `net.rds.max_unacked_bytes`: and at least every this many bytes (16 MiB).
    pub max_unacked_bytes: u32,
    /// Ack a received message that did not ask for one after this long, unless another
    /// frame carried the ack first. The kernel has no such timer, so the tail of a one-way
    /// burst holds its sender's buffer until traffic flows again; `None` restores that.
    pub delayed_ack: Option<Duration>,
    /// `net.rds.reconnect_min_delay_ms` (1 ms).
    pub reconnect_min: Duration,
    /// `net.rds.reconnect_max_delay_ms` (1000 ms).
    pub reconnect_max: Duration,
    /// A message-transport connection that is not established this long after the dial
    /// (or, on the passive side, after the accept) is dropped and dialled again with the
    /// backoff. RDS-IB has this from the IB CM (REQ retries, then `UNREACHABLE`; a REP
    /// with no RTU, then `CONNECT_ERROR`); a provider that loses a CM answer must not
    /// leave a path Connecting for ever, refusing the peer's redials as racing. `None`
    /// waits for ever. Stream transports ignore it (their socket's connect has its own).
    /// The default, 5 s, leaves room for a provider's address and route resolution
    /// (dp-verbs resolves for up to 2 s per attempt inside the dial) and the IB CM's first
    /// REQ timeout of about 4 s.
    pub connect_timeout: Option<Duration>,
}

impl PathConfig {
    /// RDS-IB's defaults, with flow control and a 1 ms delayed ack: the fabric transport.
    pub const fn message() -> Self {
        Self {
            flavor: Flavor::Message,
            connect_rule: ConnectRule::Any,
            flow_control: true,
            checksum: true,
            send_depth: 256,
            max_unacked_packets: 8,
            max_unacked_bytes: 16 << 20,
            delayed_ack: Some(Duration::from_millis(1)),
            reconnect_min: Duration::from_millis(1),
            reconnect_max: Duration::from_millis(1000),
            connect_timeout: Some(Duration::from_secs(5)),
        }
    }

    /// RDS-TCP's defaults.
    pub const fn stream() -> Self {
        Self {
            flavor: Flavor::Stream,
            connect_rule: ConnectRule::LowerAddress,
            flow_control: false,
            checksum: false,
            send_depth: 4,
            ..Self::message()
        }
    }
}

impl Default for PathConfig {
    fn default() -> Self {
        Self::message()
    }
}
