//! What a path borrows from its engine for one call.

use crate::rng::Rng;
use crate::stats::Stats;
use crate::store::Store;
use crate::wire::CongMap;

/// The engine's shared state a path works on: message memory, counters, randomness, and
/// its connection's congestion state.
#[derive(Debug)]
pub struct PathCtx<'a> {
    /// Message memory.
    pub store: &'a mut Store,
    /// Counters.
    pub stats: &'a mut Stats,
    /// Randomness (reconnect backoff).
    pub rng: &'a mut Rng,
    /// The connection's local congestion map (what a map update sends).
    pub local_map: &'a CongMap,
    /// The connection's pending map update (`c_map_queued`): set when the local map
    /// changed or a path came up; the first path to transmit between messages sends the map
    /// and clears it.
    pub map_queued: &'a mut bool,
}
