//! Cross-section checks: references resolve, rings have one consumer and at least one
//! producer, values fit together; and the conversion into the validated types of
//! [`super`].
//!
//! [`Checker`] holds the sections as parsed and what the checks learn on the way (the
//! CPUs of `[eal]`, the rings and who uses them, `[fabric] bounce_bytes`);
//! [`Checker::check`] runs the checks in order. From the top down: `resources.rs` checks
//! the resource sections (`[eal]`, pools, `[fabric]`, rings) and sizes the pools against
//! their users; `stages.rs` checks each stage and converts it; `refs.rs` resolves what a
//! stage names (rings it reads or writes, pools, addresses, bursts), for the stages here
//! and those of `rds.rs` and `rnbd.rs` alike. The files add methods to [`Checker`] and
//! import nothing of each other.

mod refs;
mod resources;
mod stages;

use std::collections::HashMap;
use std::ops::Range;

use mempool::memory::HugePolicy;
use toml::Spanned;

use crate::config::doc::Doc;
use crate::config::error::ConfigError;
use crate::config::raw::{RawHuge, Sections};
use crate::config::types::{Config, Memory};

/// The longest drain or connect timeout, in milliseconds.
const MAX_TIMEOUT_MS: u64 = 600_000;

/// Who uses a ring, for the one-consumer rule.
#[derive(Default)]
struct RingUse {
    producers: Vec<String>,
    consumer: Option<String>,
}

/// Cross-section checks and the conversion to validated types.
pub(super) struct Checker<'d, 'a> {
    pub(super) doc: &'d Doc<'a>,
    s: Sections,
    cpus: Option<Vec<usize>>,
    ring_caps: HashMap<String, usize>,
    ring_spans: HashMap<String, Range<usize>>,
    uses: HashMap<String, RingUse>,
    /// `[fabric] bounce_bytes` as written, if it was.
    pub(super) bounce: Option<Spanned<u32>>,
}

impl<'d, 'a> Checker<'d, 'a> {
    pub(super) fn new(doc: &'d Doc<'a>, s: Sections) -> Self {
        Self {
            doc,
            s,
            cpus: None,
            ring_caps: HashMap::new(),
            ring_spans: HashMap::new(),
            uses: HashMap::new(),
            bounce: None,
        }
    }

    pub(super) fn check(mut self) -> Result<Config, ConfigError> {
        let eal = self.eal()?;
        let memory = Memory {
            hugepages: match self.s.memory.hugepages {
                RawHuge::Auto => HugePolicy::Auto,
                RawHuge::Never => HugePolicy::Never,
                RawHuge::Require => HugePolicy::Require,
            },
        };
        let pools = self.pools()?;
        let mut fabric = self.fabric()?;
        let mut rings = self.rings()?;
        let stages = self.stages(&pools, fabric.is_some())?;
        self.rds_bounce(&mut fabric, &stages)?;
        for r in &mut rings {
            let u = self.uses.remove(&r.name).unwrap_or_default();
            let span = self.ring_spans.get(&r.name).cloned().unwrap_or(0..0);
            if u.producers.is_empty() {
                return Err(self.doc.invalid(
                    &span,
                    &format!("ring.{}", r.name),
                    "capacity",
                    format!(
                        "ring `{}` has no producer; give a stage `output = \"{}\"` or remove the ring",
                        r.name, r.name
                    ),
                ));
            }
            let Some(consumer) = u.consumer else {
                return Err(self.doc.invalid(
                    &span,
                    &format!("ring.{}", r.name),
                    "capacity",
                    format!(
                        "ring `{}` has no consumer; give a stage `input = \"{}\"` or remove the ring",
                        r.name, r.name
                    ),
                ));
            };
            r.producers = u.producers;
            r.consumer = consumer;
        }
        let cfg = Config {
            source: self.doc.file.to_owned(),
            eal,
            memory,
            pools,
            fabric,
            rings,
            stages,
        };
        self.pool_sizes(&cfg)?;
        Ok(cfg)
    }
}
