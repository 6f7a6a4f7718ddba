//! Who an lcore is: its [`LcoreId`], its [`Role`] and the [`LcoreInfo`] that ties them to a CPU.
//!
//! Plain values, named by every layer that addresses an lcore (ports, the stop token, the poll
//! loop, the lcore set), so they sit below all of them.

use core::fmt;

/// Index of an lcore within its [`Lcores`](crate::Lcores) (0-based, in core-list order). Not the
/// CPU number: see [`LcoreInfo::cpu`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LcoreId(u16);

impl LcoreId {
    /// The lcore with index `index`.
    pub const fn new(index: u16) -> Self {
        Self(index)
    }

    /// The index.
    pub const fn index(self) -> u16 {
        self.0
    }
}

impl fmt::Display for LcoreId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lcore {}", self.0)
    }
}

/// The role of an lcore (DPDK's `ROLE_RTE` main vs worker).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Runs on the launching thread through
    /// [`Lcores::run_on_main`](crate::Lcores::run_on_main).
    Main,
    /// Runs on its own pinned thread through [`Lcores::launch`](crate::Lcores::launch).
    Worker,
}

/// Static description of one lcore.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LcoreInfo {
    /// Its id.
    pub id: LcoreId,
    /// The CPU it is pinned to.
    pub cpu: usize,
    /// Main or worker.
    pub role: Role,
}

impl fmt::Display for LcoreInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (cpu {}, {:?})", self.id, self.cpu, self.role)
    }
}
