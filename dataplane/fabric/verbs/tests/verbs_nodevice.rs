//! Verbs provider entry points without RDMA hardware (this runs everywhere): the errors say
//! that no device was found and how to create one.
#![cfg(feature = "verbs")]

use std::io;
use std::time::Duration;

use dp_fabric::FabricError;
use dp_verbs::{VerbsConfig, VerbsDevice, devices};

#[test]
fn unknown_device_name_is_no_device_with_a_fix() {
    let e = VerbsDevice::open(Some("dp-no-such-device")).unwrap_err();
    assert!(
        matches!(&e, FabricError::NoDevice { name: Some(n) } if n == "dp-no-such-device"),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("no RDMA device found named 'dp-no-such-device'"),
        "{msg}"
    );
    assert!(
        msg.contains("rdma link add rxe0 type rxe netdev eth0"),
        "{msg}"
    );
    assert_eq!(io::Error::from(e).kind(), io::ErrorKind::Unsupported);
}

#[test]
fn discovery_and_open_agree() {
    match devices() {
        Err(e) => {
            eprintln!("no RDMA device here: {e}");
            assert!(matches!(e, FabricError::NoDevice { name: None }), "{e:?}");
            let msg = e.to_string();
            assert!(msg.starts_with("no RDMA device found:"), "{msg}");
            assert!(msg.contains("Soft-RoCE"), "{msg}");
            let e = VerbsDevice::open(None).unwrap_err();
            assert!(matches!(e, FabricError::NoDevice { name: None }), "{e:?}");
        }
        Ok(list) => {
            eprintln!("RDMA devices: {list:?}");
            assert!(!list.is_empty());
            let d = VerbsDevice::open(None).expect("the first device opens");
            assert!(
                list.iter().any(|n| n == d.name()),
                "{} not in {list:?}",
                d.name()
            );
            let named = VerbsDevice::open(Some(&list[0])).expect("a listed device opens by name");
            assert_eq!(named.name(), list[0]);
        }
    }
}

#[test]
fn bad_config_is_refused_before_looking_for_devices() {
    let cfg = VerbsConfig {
        resolve_attempts: 0,
        ..VerbsConfig::default()
    };
    let e = VerbsDevice::open_with(None, cfg).unwrap_err();
    assert!(matches!(e, FabricError::InvalidArgument { .. }), "{e:?}");
    let cfg = VerbsConfig {
        resolve_timeout: Duration::ZERO,
        ..VerbsConfig::default()
    };
    assert!(matches!(
        VerbsDevice::open_with(None, cfg),
        Err(FabricError::InvalidArgument { .. })
    ));
}
