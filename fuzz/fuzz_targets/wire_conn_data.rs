//! `ConnDataRepr::parse` never panics, and parse(emit(x)) == x for every x it yields.
#![no_main]
use dp_rsocket::wire::{ConnData, ConnDataRepr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(r) = ConnData::new_checked(data).and_then(|p| ConnDataRepr::parse(&p)) else {
        return;
    };
    let bytes = r.to_bytes();
    assert_eq!(
        ConnDataRepr::parse(&ConnData::new_checked(&bytes[..]).unwrap()),
        Ok(r)
    );
});
