//! A peer's key table as every remote access reads it (`KeyTable::lookup`, `KeySnap::covers`);
//! the checks are in `dp_shm::fuzzing::key_table`. Input: key (u32 LE), address (u64 LE),
//! length (u64 LE), the 64-byte table header, then raw 64-byte entries from slot 0 on.
#![no_main]
use dataplane_fuzz::take_le;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut d = data;
    let key = take_le::<4>(&mut d) as u32;
    let addr = take_le::<8>(&mut d);
    let len = take_le::<8>(&mut d);
    let (header, entries) = d.split_at(d.len().min(64));
    dp_shm::fuzzing::key_table(header, entries, key, addr, len);
});
