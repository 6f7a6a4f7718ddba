//! Links librdmacm.so with librdmacm's identity: the SONAME `librdmacm.so.1` and a version
//! script that defines the `RDMACM_1.0` node. The exported functions are defined in
//! `src/export.rs` as assembler symbols bound to that node with `.symver`, so the symbol
//! list below must name exactly the symbols `src/export.rs` defines.

use std::fmt::Write as _;
use std::path::PathBuf;

/// The rsocket API (`<rdma/rsocket.h>`).
const RSOCKET: &[&str] = &[
    "rsocket",
    "rbind",
    "rlisten",
    "raccept",
    "rconnect",
    "rshutdown",
    "rclose",
    "rrecv",
    "rrecvfrom",
    "rrecvmsg",
    "rsend",
    "rsendto",
    "rsendmsg",
    "rread",
    "rreadv",
    "rwrite",
    "rwritev",
    "rpoll",
    "rselect",
    "rgetpeername",
    "rgetsockname",
    "rsetsockopt",
    "rgetsockopt",
    "rfcntl",
    "riomap",
    "riounmap",
    "riowrite",
];

/// The RDMA CM entry points rdmacm-utils' rsocket programs (rstream, riostream, rcopy,
/// udpong) import.
const RDMA_CM: &[&str] = &[
    "rdma_create_event_channel",
    "rdma_destroy_event_channel",
    "rdma_getaddrinfo",
    "rdma_freeaddrinfo",
];

/// With the verbs provider: the RDMA CM calls it makes, forwarded to the system's librdmacm
/// (see `src/verbs_fwd.rs`).
const VERBS_FORWARDED: &[&str] = &[
    "rdma_create_id",
    "rdma_destroy_id",
    "rdma_bind_addr",
    "rdma_listen",
    "rdma_resolve_addr",
    "rdma_resolve_route",
    "rdma_connect",
    "rdma_accept",
    "rdma_reject",
    "rdma_disconnect",
    "rdma_get_cm_event",
    "rdma_ack_cm_event",
    "rdma_create_qp",
    "rdma_destroy_qp",
    "rdma_migrate_id",
    "rdma_get_devices",
    "rdma_free_devices",
];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let verbs = std::env::var_os("CARGO_FEATURE_VERBS").is_some();
    let mut syms: Vec<&str> = RSOCKET.iter().chain(RDMA_CM).copied().collect();
    if verbs {
        syms.extend_from_slice(VERBS_FORWARDED);
    }
    let mut map = String::from("RDMACM_1.0 {\n  global:\n");
    for s in &syms {
        writeln!(map, "    {s};").expect("write to a String");
    }
    map.push_str("  local:\n    *;\n};\n");
    let path = out.join("rdmacm.map");
    std::fs::write(&path, map).expect("writing the version script");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,librdmacm.so.1");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        path.display()
    );
}
