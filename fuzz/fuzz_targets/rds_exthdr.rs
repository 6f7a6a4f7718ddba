//! The extension-header parser never panics, stops within the 16 bytes, and what it yields
//! packs back (with `ExtWriter`) into an area that parses to the same list.
#![no_main]
use dp_rds::wire::{ExtIter, ExtWriter};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut area = [0u8; 16];
    let n = data.len().min(16);
    area[..n].copy_from_slice(&data[..n]);
    let exts: Vec<_> = ExtIter::new(&area).collect();
    assert!(exts.iter().map(|e| e.wire_len()).sum::<usize>() <= 16);
    let mut w = ExtWriter::new();
    for e in &exts {
        w.push(*e)
            .expect("what was parsed from 16 bytes fits in 16 bytes");
    }
    let again: Vec<_> = ExtIter::new(&w.finish()).collect();
    assert_eq!(again, exts);
});
