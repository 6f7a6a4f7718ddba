//! dp-rspreload's handshake message (`Hello::parse`, 16 bytes a peer sends on a TCP
//! connection before it moves to rsockets): no input panics, what parses emits back to the
//! same bytes, and only version-1 hellos with the magic parse.
#![no_main]
use libfuzzer_sys::fuzz_target;

// The preload is a cdylib (it cannot be a dependency); its wire format is one file that
// depends on dp-wire alone, included here.
#[allow(dead_code)]
#[path = "../../apps/rsocket-preload/src/wire.rs"]
mod wire;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = wire::Hello::parse(data) {
        assert_eq!(&h.to_bytes()[..], &data[..wire::LEN]);
        assert_eq!(&data[..4], &wire::MAGIC);
        assert_eq!(data[4], wire::VERSION);
    }
});
