//! `dpctl check`: the preflight report.
//!
//! Cores, hugepages and the memlock limit come from `mempool`'s preflight; then the shm
//! rendezvous directory, and the RDMA devices the `verbs` provider could use (when built
//! with the `verbs` feature; the kernel's `/sys/class/infiniband` either way).

use std::fmt::Write as _;
use std::path::Path;

use dataplane::fabric::shm::default_rendezvous_dir;
use mempool::memory::Preflight;

/// One line of the rendezvous-directory check.
fn rendezvous_line(dir: &Path) -> (bool, String) {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {
            let probe = dir.join(format!(".dpctl-check-{}", std::process::id()));
            match std::fs::write(&probe, b"") {
                Ok(()) => {
                    let _ = std::fs::remove_file(&probe);
                    (
                        true,
                        format!("shm rendezvous directory {} is writable", dir.display()),
                    )
                }
                Err(e) => (
                    false,
                    format!(
                        "shm rendezvous directory {} is not writable ({e}): fix its permissions or set DP_SHM_DIR",
                        dir.display()
                    ),
                ),
            }
        }
        Ok(_) => (
            false,
            format!(
                "{} exists but is not a directory: remove it or set DP_SHM_DIR",
                dir.display()
            ),
        ),
        Err(_) => (
            true,
            format!(
                "shm rendezvous directory {} will be created on first use",
                dir.display()
            ),
        ),
    }
}

/// The RDMA devices the kernel exposes (`/sys/class/infiniband`), by name.
fn kernel_rdma_devices() -> Vec<String> {
    let Ok(d) = std::fs::read_dir("/sys/class/infiniband") else {
        return Vec::new();
    };
    let mut v: Vec<String> = d
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    v.sort();
    v
}

const SOFT_ROCE: &str = "to get one without RDMA hardware, load Soft-RoCE on an Ethernet \
    interface: `modprobe rdma_rxe && rdma link add rxe0 type rxe netdev eth0` (as root; \
    `ip link` names the interface)";

/// The RDMA line(s): whether the problem is worth an item to look at, and the text.
fn rdma_lines() -> (bool, String) {
    let kernel = kernel_rdma_devices();
    let kernel_text = if kernel.is_empty() {
        "the kernel exposes none: /sys/class/infiniband is empty".to_owned()
    } else {
        format!("the kernel exposes {}", kernel.join(", "))
    };
    #[cfg(feature = "verbs")]
    {
        match dataplane::fabric::verbs::devices() {
            Ok(names) => (
                false,
                format!(
                    "ok: RDMA devices for the verbs provider: {} ({kernel_text})",
                    names.join(", ")
                ),
            ),
            Err(_) => (
                true,
                format!(
                    "note: RDMA devices: none for the verbs provider ({kernel_text}); \
                     {SOFT_ROCE}. The shm provider needs no device."
                ),
            ),
        }
    }
    #[cfg(not(feature = "verbs"))]
    {
        (
            false,
            format!(
                "note: RDMA devices: the verbs provider is not built into this dpctl ({kernel_text}); \
                 rebuild with `cargo build --release -p apps --features verbs` (needs \
                 libibverbs-dev and librdmacm-dev; scripts/setup.sh installs them); {SOFT_ROCE}. \
                 The shm provider, the default, needs no device."
            ),
        )
    }
}

/// The full report, and whether anything must be fixed before running.
pub fn report() -> (String, bool) {
    let pf = Preflight::gather();
    let mut out = String::new();
    let _ = writeln!(out, "{pf}");
    let (dir_ok, line) = rendezvous_line(&default_rendezvous_dir());
    let _ = writeln!(out, "{}: {line}", if dir_ok { "ok" } else { "FIX" });
    let (rdma_item, rdma) = rdma_lines();
    let _ = writeln!(out, "{rdma}");
    let problems = pf.problems();
    // Preflight findings are warnings or advice: everything falls back (normal pages,
    // unlocked memory). Only an unusable rendezvous directory stops the shm provider.
    let blocking = !dir_ok;
    let n = problems.len() + usize::from(!dir_ok) + usize::from(rdma_item);
    if n == 0 {
        let _ = writeln!(out, "nothing to fix");
    } else {
        let _ = writeln!(out, "{n} item(s) above to look at; each says how to fix it");
    }
    (out, blocking)
}
