//! Multipath policies: which path a request (or a failed-over request) tries next
//! (`path_it_init`, `get_next_path_*` in rtrs-clt.c; rtrs.md section 5.1).
//!
//! The iterator reads each path only through [`PathLoad`], so the same code can run over a
//! session's own paths (here) or over a shared, atomically updated view of paths driven by
//! other lcores.

use std::time::Duration;

/// `mp_policy` (sysfs `mpath_policy`: 0, 1, 2 or their names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MpPolicy {
    /// `MP_POLICY_RR` (0): the next path after the last one used, connected or not (the
    /// caller skips those that are not).
    RoundRobin,
    /// `MP_POLICY_MIN_INFLIGHT` (1, Linux's default): the connected path with the fewest
    /// requests in flight not yet tried for this request.
    #[default]
    MinInflight,
    /// `MP_POLICY_MIN_LATENCY` (2): the connected path with the smallest heartbeat round trip
    /// not yet tried (a path with no measurement yet counts as 0, so new paths are tried).
    MinLatency,
}

impl MpPolicy {
    /// Parses what sysfs `mpath_policy` accepts: `0|1|2`, `round-robin`/`rr`,
    /// `min-inflight`/`mi`, `min-latency`/`ml` (a trailing newline is ignored).
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim_end_matches('\n') {
            "0" | "round-robin" | "rr" => Some(Self::RoundRobin),
            "1" | "min-inflight" | "mi" => Some(Self::MinInflight),
            "2" | "min-latency" | "ml" => Some(Self::MinLatency),
            _ => None,
        }
    }

    /// The sysfs number.
    pub const fn to_raw(self) -> u8 {
        match self {
            Self::RoundRobin => 0,
            Self::MinInflight => 1,
            Self::MinLatency => 2,
        }
    }

    /// The sysfs name.
    pub const fn name(self) -> &'static str {
        match self {
            Self::RoundRobin => "round-robin",
            Self::MinInflight => "min-inflight",
            Self::MinLatency => "min-latency",
        }
    }
}

/// What a policy reads of a path.
pub trait PathLoad {
    /// The path is CONNECTED.
    fn connected(&self) -> bool;
    /// Requests in flight on it.
    fn inflight(&self) -> u32;
    /// Its last heartbeat round trip.
    fn latency(&self) -> Option<Duration>;
}

/// One request's walk over the paths (`struct path_it`): at most as many steps as there are
/// paths, each path tried at most once under the min-* policies.
#[derive(Clone, Copy, Debug)]
pub struct PathIter {
    policy: MpPolicy,
    steps: usize,
    tried: [u64; 2],
}

impl PathIter {
    /// A walk under `policy`.
    pub const fn new(policy: MpPolicy) -> Self {
        Self {
            policy,
            steps: 0,
            tried: [0; 2],
        }
    }

    fn is_tried(&self, i: usize) -> bool {
        i < 128 && self.tried[i / 64] & (1 << (i % 64)) != 0
    }

    fn mark(&mut self, i: usize) {
        if i < 128 {
            self.tried[i / 64] |= 1 << (i % 64);
        }
    }

    /// The next candidate among `paths` (`None` entries are removed slots), or `None` when
    /// the walk is over. Under round-robin `cursor` is the last path used and is advanced;
    /// the candidate may be a path that is not connected, which the caller skips (as Linux's
    /// `rtrs_clt_request` does).
    pub fn next<P: PathLoad>(
        &mut self,
        paths: &[Option<P>],
        cursor: &mut Option<usize>,
    ) -> Option<usize> {
        if let [only] = paths {
            // One path slot (the common session): its only step, whatever the policy (the
            // min-* walk would pick it if connected, round-robin even if not).
            if self.steps > 0 || only.is_none() {
                return None;
            }
            self.steps = 1;
            if self.policy == MpPolicy::RoundRobin {
                *cursor = Some(0);
            } else if !only.as_ref().is_some_and(PathLoad::connected) {
                return None;
            }
            self.mark(0);
            return Some(0);
        }
        let live = paths.iter().filter(|p| p.is_some()).count();
        if self.steps >= live {
            return None;
        }
        self.steps += 1;
        match self.policy {
            MpPolicy::RoundRobin => {
                let n = paths.len();
                let start = cursor.map_or(0, |c| c + 1);
                let pick = (0..n)
                    .map(|k| (start + k) % n)
                    .find(|&i| paths[i].is_some())?;
                *cursor = Some(pick);
                Some(pick)
            }
            MpPolicy::MinInflight | MpPolicy::MinLatency => {
                let mut best: Option<(usize, u128)> = None;
                for (i, p) in paths.iter().enumerate() {
                    let Some(p) = p else { continue };
                    if !p.connected() || self.is_tried(i) {
                        continue;
                    }
                    let key = match self.policy {
                        MpPolicy::MinInflight => u128::from(p.inflight()),
                        _ => p.latency().map_or(0, |d| d.as_nanos()),
                    };
                    if best.is_none_or(|(_, k)| key < k) {
                        best = Some((i, key));
                    }
                }
                let (i, _) = best?;
                self.mark(i);
                Some(i)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy)]
    struct P(bool, u32, Option<u64>);
    impl PathLoad for P {
        fn connected(&self) -> bool {
            self.0
        }
        fn inflight(&self) -> u32 {
            self.1
        }
        fn latency(&self) -> Option<Duration> {
            self.2.map(Duration::from_nanos)
        }
    }

    fn walk(policy: MpPolicy, paths: &[Option<P>], cursor: &mut Option<usize>) -> Vec<usize> {
        let mut it = PathIter::new(policy);
        std::iter::from_fn(|| it.next(paths, cursor)).collect()
    }

    #[test]
    fn test_rr_advances_cursor_and_wraps() {
        let paths = [
            Some(P(true, 0, None)),
            None,
            Some(P(false, 0, None)),
            Some(P(true, 0, None)),
        ];
        let mut c = None;
        assert_eq!(
            walk(MpPolicy::RoundRobin, &paths, &mut c),
            [0, 2, 3],
            "3 live paths, 3 steps"
        );
        assert_eq!(c, Some(3));
        let mut it = PathIter::new(MpPolicy::RoundRobin);
        assert_eq!(
            it.next(&paths, &mut c),
            Some(0),
            "wraps past the end, skipping holes"
        );
    }

    #[test]
    fn test_min_inflight_tries_each_connected_once() {
        let paths = [
            Some(P(true, 5, None)),
            Some(P(true, 1, None)),
            Some(P(false, 0, None)),
        ];
        assert_eq!(walk(MpPolicy::MinInflight, &paths, &mut None), [1, 0]);
    }

    #[test]
    fn test_min_latency_prefers_unmeasured() {
        let paths = [
            Some(P(true, 0, Some(900))),
            Some(P(true, 0, Some(300))),
            Some(P(true, 0, None)),
        ];
        assert_eq!(walk(MpPolicy::MinLatency, &paths, &mut None), [2, 1, 0]);
    }

    #[test]
    fn test_one_path_walks_as_many() {
        for policy in [
            MpPolicy::RoundRobin,
            MpPolicy::MinInflight,
            MpPolicy::MinLatency,
        ] {
            for p in [None, Some(P(true, 3, Some(5))), Some(P(false, 0, None))] {
                let paths = [p];
                let (mut c1, mut c2) = (Some(0), Some(0));
                let mut it = PathIter::new(policy);
                let got: Vec<usize> = std::iter::from_fn(|| it.next(&paths, &mut c1)).collect();
                // The general walk, on the same path and a removed slot after it.
                let two = [p, None];
                let mut it = PathIter::new(policy);
                let want: Vec<usize> = std::iter::from_fn(|| it.next(&two, &mut c2)).collect();
                assert_eq!(got, want, "{policy:?} {:?}", p.map(|p| p.0));
                assert_eq!(c1, c2, "{policy:?}: the cursor");
            }
        }
    }

    #[test]
    fn test_policy_parse_as_sysfs() {
        assert_eq!(MpPolicy::parse("rr\n"), Some(MpPolicy::RoundRobin));
        assert_eq!(MpPolicy::parse("1"), Some(MpPolicy::MinInflight));
        assert_eq!(MpPolicy::parse("min-latency"), Some(MpPolicy::MinLatency));
        assert_eq!(
            MpPolicy::parse(""),
            None,
            "the empty write Linux once crashed on"
        );
        assert_eq!(MpPolicy::default(), MpPolicy::MinInflight);
    }
}
