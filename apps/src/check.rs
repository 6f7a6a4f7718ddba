//! `dpctl check`: the preflight report.

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

/// The full report, and whether anything must be fixed before running.
pub fn report() -> (String, bool) {
    let pf = Preflight::gather();
    let mut out = String::new();
    let _ = writeln!(out, "{pf}");
    let (dir_ok, line) = rendezvous_line(&default_rendezvous_dir());
    let _ = writeln!(out, "{}: {line}", if dir_ok { "ok" } else { "FIX" });
    let problems = pf.problems();
    // Preflight findings are warnings or advice: everything falls back (normal pages,
    // unlocked memory). Only an unusable rendezvous directory stops the shm provider.
    let blocking = !dir_ok;
    let n = problems.len() + usize::from(!dir_ok);
    if n == 0 {
        let _ = writeln!(out, "nothing to fix");
    } else {
        let _ = writeln!(out, "{n} item(s) above to look at; each says how to fix it");
    }
    (out, blocking)
}
