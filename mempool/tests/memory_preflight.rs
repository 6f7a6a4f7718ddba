//! Preflight: gathers real machine state and reports it with fixes.

use std::fs;

use mempool::memory::{Limit, Preflight};

#[test]
fn gather_reads_this_machine() {
    let pf = Preflight::gather();
    assert!(pf.cores_online >= 1);
    assert!(!pf.cores_allowed.is_empty());
    assert!(pf.cores_allowed.len() <= pf.cores_online);

    // Every pool directory in sysfs shows up, with its counters.
    let dirs = fs::read_dir("/sys/kernel/mm/hugepages")
        .map(|d| d.filter_map(Result::ok).count())
        .unwrap_or(0);
    assert_eq!(pf.hugepages.len(), dirs);
    for p in &pf.hugepages {
        let dir = format!(
            "/sys/kernel/mm/hugepages/hugepages-{}kB",
            p.page_size / 1024
        );
        let total: u64 = fs::read_to_string(format!("{dir}/nr_hugepages"))
            .expect("nr_hugepages")
            .trim()
            .parse()
            .expect("number");
        assert_eq!(p.total, total, "{dir}");
        assert!(p.free <= p.total + p.surplus);
    }

    // The memlock limit matches getrlimit, with RLIM_INFINITY as Unlimited.
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `rl` is a valid writable rlimit.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl) }, 0);
    let conv = |v| {
        if v == libc::RLIM_INFINITY {
            Limit::Unlimited
        } else {
            Limit::Bytes(v)
        }
    };
    assert_eq!(pf.memlock.soft, conv(rl.rlim_cur));
    assert_eq!(pf.memlock.hard, conv(rl.rlim_max));
    // SAFETY: no preconditions.
    assert_eq!(pf.is_root, unsafe { libc::geteuid() } == 0);
}

#[test]
fn report_names_memlock_hugepages_and_fixes() {
    let pf = Preflight::gather();
    let report = pf.to_string();
    println!("{report}");
    assert!(report.contains("memlock:"), "{report}");
    assert!(report.contains("hugepages:"), "{report}");
    assert!(report.contains("cores:"), "{report}");
    let problems = pf.problems();
    if problems.is_empty() {
        assert!(report.contains("ok: nothing to fix"), "{report}");
    }
    for p in &problems {
        assert!(!p.fix.is_empty());
        assert!(report.contains(&p.to_string()), "{report}");
    }
    // With no free 2 MiB page, the report says how to reserve some.
    if pf.pool(2 << 20).is_some_and(|p| p.available() == 0) {
        assert!(
            problems
                .iter()
                .any(|p| p.fix.contains("hugepages-2048kB/nr_hugepages")),
            "{report}"
        );
    }
    // Every line is one item.
    assert!(report.lines().all(|l| !l.trim().is_empty()), "{report}");
}
