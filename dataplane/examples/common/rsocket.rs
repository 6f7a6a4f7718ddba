//! What the rsocket callgrind drivers (`rsocket_pingpong_cost`, `rsocket_idle_visit_cost`)
//! share: an rsocket context on its own shm device, as each process of `dp-perf rstream
//! --pair` has.

use std::path::Path;

use dataplane::fabric::shm::{Shm, ShmConfig, ShmDevice};
use dataplane::rsocket::{RsConfig, RsContext};

/// A context with the library's defaults on a new shm device meeting in `dir`.
pub fn context(dir: &Path) -> RsContext<Shm> {
    let dev = ShmDevice::open(ShmConfig {
        dir: Some(dir.to_path_buf()),
        ..ShmConfig::default()
    })
    .expect("shm device");
    RsContext::with_config(dev, RsConfig::default()).expect("rsocket context")
}
