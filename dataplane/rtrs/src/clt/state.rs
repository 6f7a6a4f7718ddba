//! The client path's states and the exact transition table of Linux's
//! `rtrs_clt_change_state` (rtrs-clt.c; rtrs.md section 5.2).

/// `enum rtrs_clt_state`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClientState {
    /// `RTRS_CLT_CONNECTING` (0): connections and the info exchange are under way; IO never
    /// picks the path.
    Connecting,
    /// `RTRS_CLT_CONNECTING_ERR` (1): establishment failed; the owner decides (open fails,
    /// an added path is dropped, a reconnect is retried).
    ConnectingErr,
    /// `RTRS_CLT_RECONNECTING` (2): the path failed or is being reconnected; its IO was failed
    /// over; a reconnect is scheduled.
    Reconnecting,
    /// `RTRS_CLT_CONNECTED` (3): carries IO.
    Connected,
    /// `RTRS_CLT_CLOSING` (4): being closed.
    Closing,
    /// `RTRS_CLT_CLOSED` (5): closed; stays listed and can be reconnected.
    Closed,
    /// `RTRS_CLT_DEAD` (6): removed.
    Dead,
}

impl ClientState {
    /// The number Linux gives the state.
    pub const fn to_raw(self) -> u8 {
        match self {
            Self::Connecting => 0,
            Self::ConnectingErr => 1,
            Self::Reconnecting => 2,
            Self::Connected => 3,
            Self::Closing => 4,
            Self::Closed => 5,
            Self::Dead => 6,
        }
    }

    /// What sysfs `state` prints: `connected` or `disconnected`.
    pub const fn sysfs(self) -> &'static str {
        match self {
            Self::Connected => "connected",
            _ => "disconnected",
        }
    }

    /// True if `rtrs_clt_change_state` allows `self -> to`:
    ///
    /// | to | from |
    /// |---|---|
    /// | CONNECTING | RECONNECTING |
    /// | CONNECTING_ERR | CONNECTING |
    /// | RECONNECTING | CONNECTED, CONNECTING_ERR, CLOSED |
    /// | CONNECTED | CONNECTING |
    /// | CLOSING | CONNECTING, CONNECTING_ERR, RECONNECTING, CONNECTED |
    /// | CLOSED | CLOSING |
    /// | DEAD | CLOSED |
    pub const fn may_become(self, to: Self) -> bool {
        use ClientState::*;
        match to {
            Connecting => matches!(self, Reconnecting),
            ConnectingErr => matches!(self, Connecting),
            Reconnecting => matches!(self, Connected | ConnectingErr | Closed),
            Connected => matches!(self, Connecting),
            Closing => matches!(self, Connecting | ConnectingErr | Reconnecting | Connected),
            Closed => matches!(self, Closing),
            Dead => matches!(self, Closed),
        }
    }

    /// Every state, in Linux's order.
    pub const ALL: [Self; 7] = [
        Self::Connecting,
        Self::ConnectingErr,
        Self::Reconnecting,
        Self::Connected,
        Self::Closing,
        Self::Closed,
        Self::Dead,
    ];
}

/// A state plus the table: the only way the state changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PathState(ClientState);

impl PathState {
    /// A new path starts in CONNECTING (`alloc_path` sets it directly).
    pub(crate) const fn new() -> Self {
        Self(ClientState::Connecting)
    }

    pub(crate) const fn get(self) -> ClientState {
        self.0
    }

    /// `rtrs_clt_change_state`: moves to `to` if the table allows it; returns whether it did.
    pub(crate) fn change(&mut self, to: ClientState) -> bool {
        if self.0.may_become(to) {
            self.0 = to;
            true
        } else {
            false
        }
    }

    /// `rtrs_clt_change_state_from_to`.
    pub(crate) fn change_from(&mut self, from: ClientState, to: ClientState) -> bool {
        self.0 == from && self.change(to)
    }
}

#[cfg(test)]
mod tests {
    use super::ClientState::*;
    use super::*;

    /// The table written out as Linux's switch statement has it, pair by pair.
    #[test]
    fn test_change_state_table_exact() {
        let allowed = [
            (Reconnecting, Connecting),
            (Connecting, ConnectingErr),
            (Connected, Reconnecting),
            (ConnectingErr, Reconnecting),
            (Closed, Reconnecting),
            (Connecting, Connected),
            (Connecting, Closing),
            (ConnectingErr, Closing),
            (Reconnecting, Closing),
            (Connected, Closing),
            (Closing, Closed),
            (Closed, Dead),
        ];
        let mut n = 0;
        for from in ClientState::ALL {
            for to in ClientState::ALL {
                let want = allowed.contains(&(from, to));
                assert_eq!(from.may_become(to), want, "{from:?} -> {to:?}");
                n += usize::from(want);
            }
        }
        assert_eq!(n, 12);
    }

    #[test]
    fn test_change_state_refuses_and_keeps() {
        let mut s = PathState::new();
        assert!(
            !s.change(Closed),
            "CONNECTING -> CLOSED is not in the table"
        );
        assert_eq!(s.get(), Connecting);
        assert!(s.change(Connected));
        assert!(
            !s.change_from(Connecting, ConnectingErr),
            "from_to checks the source"
        );
        assert!(s.change_from(Connected, Reconnecting));
        assert_eq!(Connected.to_raw(), 3);
        assert_eq!(Reconnecting.sysfs(), "disconnected");
    }
}
