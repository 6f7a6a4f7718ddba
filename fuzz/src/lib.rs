//! Shared code of the fuzz targets in `fuzz_targets/` (each target is a thin file over a
//! function here or over an entry point of the crate it fuzzes). See `README.md`.

pub mod rds;
pub mod rnbd_client;
pub mod rnbd_server;
pub mod rtrs_client;
pub mod rtrs_server;
pub mod stream;

/// Splits off a little-endian integer of `N` bytes from the front of `data` (zero-padded
/// when `data` is short), for targets whose input is a fixed header then free bytes.
pub fn take_le<const N: usize>(data: &mut &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let k = N.min(data.len());
    b[..k].copy_from_slice(&data[..k]);
    *data = &data[k..];
    u64::from_le_bytes(b)
}
