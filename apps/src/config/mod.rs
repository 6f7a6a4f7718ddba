//! Pipeline configuration files: TOML deserialized into typed, validated structs.
//!
//! A file declares resources first and then the stages that use them, like DPDK's pipeline
//! scripts (`mempool`, `link`, then `pipeline ... cpu N`), but declaratively:
//!
//! ```toml
//! [eal]                      # the lcores: a DPDK -l core list and how idle lcores behave
//! cores = "0-1"
//! mode = "hybrid"            # "busy" spins (dedicated cores); "hybrid" spins, then sleeps
//!
//! [memory]
//! hugepages = "auto"         # "auto" (fall back to 4 KiB pages), "never" (--no-huge), "require"
//!
//! [pool.payload]             # an object pool for message payloads (rte_mempool)
//! obj_size = 2048
//! count = 4096
//!
//! [fabric]                   # needed by rsocket stages
//! provider = "shm"           # "shm" (software RDMA between processes) or "verbs"
//!
//! [ring.gen_to_sink]         # a ring between stages (rte_ring); SPSC or MPSC by usage
//! capacity = 1024
//!
//! [stage.gen]                # stages: a kind, a CPU of [eal] cores, and their connections
//! kind = "generator"
//! lcore = 1
//! output = "gen_to_sink"
//! rate = 1_000_000
//!
//! [stage.sink]
//! kind = "sink"
//! lcore = 0
//! input = "gen_to_sink"
//! ```
//!
//! An RNBD server is a stage whose devices are arrays of tables under it:
//!
//! ```toml
//! [stage.blk]
//! kind = "rnbd_server"
//! lcore = 0
//! listen = "10.0.0.1:1234"     # first path; `paths = N` listens on N consecutive ports
//! dev_search_path = "/srv/rnbd"
//!
//! [[stage.blk.export]]         # one per device: clients open "mem0" = /srv/rnbd/mem0
//! name = "mem0"
//! backend = "mem"              # "mem", "null" (with `size`) or "file" (with `path`)
//! size = "64m"
//! access = "rw"                # the most a client may open it for: "ro", "rw", "migration"
//! ```
//!
//! Every section is deserialized with unknown keys denied, so a typo is an error that names
//! the file, the line and the key (`pipeline.toml:12: unknown key `rat` in [stage.gen]`);
//! type errors, missing keys and values that do not fit together (a ring without a consumer,
//! a CPU outside the core list) are reported the same way. The whole reference, with every
//! key and its default, is in `apps/configs/README.md`.
//!
//! Stage kinds: `generator`, `forwarder`, `fanout`, `sink`, `rsocket_server`,
//! `rsocket_client`, `rds_sender`, `rds_receiver` (see [`StageKind`]).
//!
//! # Files
//!
//! From the top down: `parse.rs` turns text into a [`Config`] (with [`Config::from_file`] and
//! [`Config::parse`]); `validate/` checks the sections against each other and converts them
//! (resources, stage references, stages: one file each); `rds.rs` checks the RDS stages and
//! `rnbd.rs` the RNBD server (methods of the same checker);
//! `doc.rs` turns spans into lines and serde errors into located ones; `raw.rs` holds the
//! sections as serde sees them; `types.rs` the validated types and `error.rs` the errors,
//! which import nothing of their siblings.

mod doc;
mod error;
mod parse;
mod raw;
mod rds;
mod rnbd;
mod types;
mod validate;

pub use error::ConfigError;
pub use types::{
    ClientDef, Config, Eal, ExportAccess, ExportBackend, ExportDef, Fabric, FanoutDef,
    ForwarderDef, GeneratorDef, MAX_BURST, MAX_POOLS, Memory, OnFull, PoolDef, Provider,
    RdsReceiverDef, RdsSenderDef, RingDef, RnbdServerDef, ServerDef, ServerMode, SinkDef, StageDef,
    StageKind,
};

pub(crate) use rnbd::chunk_size as rnbd_chunk_size;

pub use crate::msg::{MAX_MSG_LEN, MIN_MSG_LEN};
