//! Core-list parsing and resolution against an allowed set.

use lcore::{
    CoreList, CoreListError, CoreSelectError, CpuSet, InitError, Lcores, LcoresConfig, Role,
};

fn cpus(list: &str) -> Vec<usize> {
    match CoreList::parse(list).unwrap() {
        CoreList::Cpus(c) => c,
        CoreList::All => panic!("`{list}` parsed as all"),
    }
}

#[test]
fn ranges_lists_and_whitespace() {
    assert_eq!(cpus("0-3,6"), vec![0, 1, 2, 3, 6]);
    assert_eq!(cpus("7"), vec![7]);
    assert_eq!(cpus(" 2 - 4 , 0 ,\t9 "), vec![2, 3, 4, 0, 9]);
    assert_eq!(cpus("5-5"), vec![5]);
    assert_eq!(cpus("1023"), vec![1023]);
    assert_eq!(CoreList::parse("all").unwrap(), CoreList::All);
    assert_eq!(CoreList::parse(" ALL ").unwrap(), CoreList::All);
    assert_eq!("0-2,8".parse::<CoreList>().unwrap().to_string(), "0,1,2,8");
}

#[test]
fn syntax_errors() {
    assert_eq!(CoreList::parse("  "), Err(CoreListError::Empty));
    assert!(matches!(
        CoreList::parse("0,,1"),
        Err(CoreListError::EmptyItem { item: 2, .. })
    ));
    assert!(matches!(
        CoreList::parse("0,1,"),
        Err(CoreListError::EmptyItem { item: 3, .. })
    ));
    assert!(
        matches!(CoreList::parse("0,x"), Err(CoreListError::BadNumber { token, .. }) if token == "x")
    );
    assert!(matches!(
        CoreList::parse("-1"),
        Err(CoreListError::BadNumber { .. })
    ));
    assert!(matches!(
        CoreList::parse("1-2-3"),
        Err(CoreListError::BadNumber { .. })
    ));
    assert!(matches!(
        CoreList::parse("0-"),
        Err(CoreListError::BadNumber { .. })
    ));
    assert!(matches!(
        CoreList::parse("all,1"),
        Err(CoreListError::BadNumber { .. })
    ));
    assert!(matches!(
        CoreList::parse("+3"),
        Err(CoreListError::BadNumber { .. })
    ));
    let e = CoreList::parse("0,6-3").unwrap_err();
    assert_eq!(
        e,
        CoreListError::ReversedRange {
            list: "0,6-3".into(),
            start: 6,
            end: 3
        }
    );
    assert!(e.to_string().contains("write `3-6`"), "{e}");
    let e = CoreList::parse("1024").unwrap_err();
    assert!(matches!(e, CoreListError::OutOfRange { cpu: 1024, .. }));
    assert!(matches!(
        CoreList::parse("99999999999999999999999"),
        Err(CoreListError::OutOfRange { .. })
    ));
    let e = CoreList::parse("0-3,2").unwrap_err();
    assert_eq!(
        e,
        CoreListError::Duplicate {
            list: "0-3,2".into(),
            cpu: 2
        }
    );
    assert!(
        e.to_string().contains("CPU 2 appears more than once"),
        "{e}"
    );
}

#[test]
fn resolution_names_the_core_and_the_allowed_set() {
    let allowed: CpuSet = [0, 1, 4, 5, 6].into_iter().collect();
    assert_eq!(allowed.to_string(), "0-1,4-6");
    assert_eq!(
        CoreList::All.resolve(&allowed, 8).unwrap(),
        vec![0, 1, 4, 5, 6]
    );
    assert_eq!(
        CoreList::parse("5,0")
            .unwrap()
            .resolve(&allowed, 8)
            .unwrap(),
        vec![5, 0]
    );

    let e = CoreList::parse("0-2")
        .unwrap()
        .resolve(&allowed, 8)
        .unwrap_err();
    assert!(matches!(&e, CoreSelectError::NotAllowed { cpu: 2, .. }));
    let msg = e.to_string();
    assert!(
        msg.contains("CPU 2 is not allowed") && msg.contains("0-1,4-6"),
        "{msg}"
    );

    let e = CoreList::parse("0,9")
        .unwrap()
        .resolve(&allowed, 8)
        .unwrap_err();
    assert!(matches!(
        &e,
        CoreSelectError::NoSuchCpu {
            cpu: 9,
            last: 7,
            ..
        }
    ));
    let msg = e.to_string();
    assert!(
        msg.contains("CPU 9 does not exist") && msg.contains("0-1,4-6"),
        "{msg}"
    );

    assert_eq!(
        CoreList::All.resolve(&CpuSet::new(), 8),
        Err(CoreSelectError::NoneAllowed)
    );
}

#[test]
fn init_rejects_cpus_outside_this_process() {
    let allowed = CpuSet::process_affinity().unwrap();
    let cfg = LcoresConfig::new(CoreList::parse("1000").unwrap());
    let err = Lcores::<u64>::init(&cfg).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, InitError::Cores(_)), "{err:?}");
    assert!(
        msg.contains("CPU 1000") && msg.contains(&allowed.to_string()),
        "{msg}"
    );
}

#[test]
fn init_assigns_roles_and_checks_main() {
    let allowed = CpuSet::process_affinity().unwrap();
    let first = allowed.iter().next().unwrap();
    let lcores = Lcores::<u64>::init(&LcoresConfig::new(CoreList::All)).unwrap();
    assert_eq!(lcores.len(), allowed.len());
    assert_eq!(lcores.info(lcores.main_lcore()).unwrap().cpu, first);
    assert_eq!(lcores.workers().count(), allowed.len() - 1);
    assert!(
        lcores
            .lcores()
            .iter()
            .filter(|l| l.role == Role::Main)
            .count()
            == 1
    );

    if let Some(last) = allowed.iter().last().filter(|&c| c != first) {
        let mut cfg = LcoresConfig::new(CoreList::All);
        cfg.main_cpu = Some(last);
        let l = Lcores::<u64>::init(&cfg).unwrap();
        assert_eq!(l.info(l.main_lcore()).unwrap().cpu, last);
        assert_eq!(
            l.by_cpu(first).map(|id| l.info(id).unwrap().role),
            Some(Role::Worker)
        );
    }

    let mut cfg = LcoresConfig::new(CoreList::Cpus(vec![first]));
    cfg.main_cpu = Some(first + 1);
    assert!(matches!(
        Lcores::<u64>::init(&cfg),
        Err(InitError::MainNotInList { .. })
    ));

    let mut cfg = LcoresConfig::new(CoreList::Cpus(vec![first]));
    cfg.inbox_capacity = 1000;
    let err = Lcores::<u64>::init(&cfg).unwrap_err();
    assert!(matches!(err, InitError::Inbox { .. }), "{err:?}");
}
