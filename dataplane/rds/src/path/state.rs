//! The connection states of a path (`enum rds_conn_state`), with the kernel's values.
//!
//! | from | to | when |
//! |---|---|---|
//! | Down | Connecting | the reconnect timer fires (we dial), or a peer's connect is accepted |
//! | Connecting | Up | the transport reports the connection established |
//! | Resetting | Up | a stream transport's accept replaced the connection |
//! | Connecting | Down | the transport could not start the connect (then a reconnect is queued) |
//! | any | Error | a drop: transport failure, protocol violation, stale connection |
//! | Error | Disconnecting | the transport was told to tear the connection down |
//! | Disconnecting | Down | the transport finished: queues reset for retransmit, reconnect queued |
//!
//! Data is transmitted only in Up; received frames are processed in Connecting and Up (a
//! receive can complete before the connection-established event).

/// A path's connection state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConnState {
    /// Not connected (`RDS_CONN_DOWN`).
    Down = 0,
    /// Connecting (`RDS_CONN_CONNECTING`).
    Connecting = 1,
    /// Being torn down (`RDS_CONN_DISCONNECTING`).
    Disconnecting = 2,
    /// Connected (`RDS_CONN_UP`).
    Up = 3,
    /// A stream transport is replacing the connection (`RDS_CONN_RESETTING`).
    Resetting = 4,
    /// Dropped, waiting for teardown (`RDS_CONN_ERROR`).
    Error = 5,
}

impl ConnState {
    /// The state's name as the kernel spells it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Down => "DOWN",
            Self::Connecting => "CONNECTING",
            Self::Disconnecting => "DISCONNECTING",
            Self::Up => "UP",
            Self::Resetting => "RESETTING",
            Self::Error => "ERROR",
        }
    }

    /// True if received frames are processed.
    pub const fn receives(self) -> bool {
        matches!(self, Self::Connecting | Self::Up)
    }
}
