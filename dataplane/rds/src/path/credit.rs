//! RDS-IB's credit-based flow control (`rds_ib_send_grab_credits`, `_add_credits`,
//! `_advertise_credits`), for message transports.
//!
//! *Send credits* are receive buffers the peer has posted for us: every frame we send
//! (fragment or ACK-only) costs one. *Posted credits* are receive buffers we posted and
//! have not yet told the peer about: any frame can carry up to 255 of them in `h_credit`.
//! The last send credit is held back unless it can carry posted credits with it, so both
//! sides can never be left at zero with nothing able to move credits. When 16 or more are
//! posted and unadvertised, an ack is requested so an ACK-only frame carries them; on a ring
//! of 32 buffers or fewer at half the ring instead (see [`Credits::update_at`]).
//!
//! The kernel packs both counters into one atomic word (16 bits each); here one owner
//! holds them, so they are plain fields, and a grant that would push send credits past
//! [`CREDIT_LIMIT`] (more receive buffers than any ring holds, where the kernel's 16-bit
//! field would overflow into the posted count) is a protocol violation.

use crate::wire::MAX_ADV_CREDIT;

/// Most send credits a peer may grant in total (the kernel warns at 16384).
pub const CREDIT_LIMIT: u32 = 16383;
/// Posted credits at which an update is requested.
pub const CREDIT_UPDATE_AT: u32 = 16;

/// The credit state of a path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Credits {
    /// Flow control is on for this connection (both sides granted initial credits).
    pub on: bool,
    /// Frames we may send.
    pub send: u32,
    /// Receive buffers we posted and have not advertised.
    pub posted: u32,
    /// A transmit stopped for lack of credits (`RDS_LL_SEND_FULL`).
    pub send_full: bool,
    /// Receive buffers granted to the peer in the connection's private data (our ring), 0
    /// before that: bounds [`Credits::update_at`].
    pub granted: u32,
}

/// A grant would exceed [`CREDIT_LIMIT`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CreditOverflow;

impl Credits {
    /// Posted credits at which an update is requested: [`CREDIT_UPDATE_AT`] (the kernel's
    /// fixed 16), or half the ring granted to the peer when that is less, but at least 2.
    ///
    /// A peer that has nothing of its own to advertise stops with one credit held back, after
    /// `granted - 1` frames; we then hold at most `granted - 1` posted credits, and with the
    /// kernel's fixed 16 a ring of 16 or fewer buffers never reaches it: a multi-fragment
    /// message stalls for good (seen with 16 buffers and a 100 kB message). Half the ring is
    /// reached first, and leaves the peer half its window meanwhile. The floor of 2 keeps two
    /// idle sides from trading credit updates forever: each ACK-only frame uses one buffer of
    /// the side it reaches, whose re-post alone must not call for the next update (the storm
    /// the kernel's comment in `rds_ib_advertise_credits` describes). Rings of 3 or more
    /// buffers satisfy both ([`FabricConfig`](crate::fabric::FabricConfig) asks for 4).
    pub fn update_at(&self) -> u32 {
        if self.granted == 0 {
            CREDIT_UPDATE_AT
        } else {
            CREDIT_UPDATE_AT.min((self.granted / 2).max(2))
        }
    }

    /// `rds_ib_send_grab_credits(wanted, need_posted, max_posted)`: returns (credits got,
    /// posted credits to advertise). Without flow control every request is granted.
    pub fn grab(&mut self, wanted: u32, need_posted: bool, max_posted: u32) -> (u32, u32) {
        if !self.on {
            return (wanted, 0);
        }
        let mut avail = self.send;
        if avail > 0 && self.posted == 0 {
            avail -= 1; // the last credit is kept for a credit update
        }
        let got = if avail < wanted {
            self.send_full = true;
            avail
        } else {
            wanted
        };
        self.send -= got;
        let mut adv = 0;
        if self.posted > 0 && (got > 0 || need_posted) {
            adv = self.posted.min(max_posted).min(MAX_ADV_CREDIT);
            self.posted -= adv;
        }
        (got, adv)
    }

    /// `rds_ib_send_add_credits`: the peer granted `n` (a non-zero `h_credit`).
    ///
    /// # Errors
    ///
    /// [`CreditOverflow`] if the total would exceed [`CREDIT_LIMIT`] (nothing is added).
    pub fn add(&mut self, n: u32) -> Result<(), CreditOverflow> {
        let total = self.send.saturating_add(n);
        if total > CREDIT_LIMIT {
            return Err(CreditOverflow);
        }
        self.send = total;
        self.send_full = false;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(send: u32, posted: u32) -> Credits {
        Credits {
            on: true,
            send,
            posted,
            send_full: false,
            granted: 0,
        }
    }

    #[test]
    fn test_credit_update_threshold_is_reached_on_small_rings() {
        let mut c = Credits::default();
        assert_eq!(
            c.update_at(),
            CREDIT_UPDATE_AT,
            "before the grant: the kernel's 16"
        );
        for (ring, at) in [(1024, 16), (33, 16), (32, 16), (16, 8), (4, 2), (3, 2)] {
            c.granted = ring;
            assert_eq!(c.update_at(), at, "ring of {ring}");
            // The peer stops after `ring - 1` frames (one credit held back): we must have asked
            // for an update by then; one re-posted buffer alone never asks.
            assert!(at < ring && at >= 2, "ring of {ring}: update at {at}");
        }
    }

    #[test]
    fn test_credit_last_one_held_back_without_posted() {
        let mut c = on(1, 0);
        assert_eq!(c.grab(1, false, 255), (0, 0), "the last credit is kept");
        assert!(c.send_full);
        let mut c = on(1, 3);
        assert_eq!(c.grab(1, false, 255), (1, 3), "it may go with an update");
        assert_eq!((c.send, c.posted), (0, 0));
    }

    #[test]
    fn test_credit_grab_partial_and_advertise_at_most_255() {
        let mut c = on(5, 300);
        assert_eq!(c.grab(8, false, 255), (5, 255));
        assert!(c.send_full);
        assert_eq!(c.posted, 45);
        assert_eq!(
            c.grab(0, true, 10),
            (0, 10),
            "need_posted advertises without sending"
        );
        assert_eq!(
            c.grab(0, false, 255),
            (0, 0),
            "nothing without need_posted or a credit"
        );
    }

    #[test]
    fn test_credit_off_grants_everything() {
        let mut c = Credits::default();
        assert_eq!(c.grab(1000, true, 255), (1000, 0));
    }

    #[test]
    fn test_credit_add_bounds() {
        let mut c = on(0, 0);
        c.send_full = true;
        c.add(255).unwrap();
        assert!(!c.send_full);
        c.send = CREDIT_LIMIT - 1;
        assert_eq!(c.add(2), Err(CreditOverflow));
        assert_eq!(c.send, CREDIT_LIMIT - 1, "nothing added");
    }
}
