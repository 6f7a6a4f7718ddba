//! The exported symbols: one trampoline for each symbol `symbols.txt` lists.
//!
//! Each exported function is a one-instruction assembler trampoline that tail-jumps to its
//! Rust implementation in [`crate::ffi`] (or [`crate::rdmacm_fwd`]). The trampolines exist
//! for the symbol versions: rustc gives every `#[no_mangle]` symbol of a cdylib its own,
//! unversioned export, which would win over `build.rs`'s version script; symbols defined in
//! assembler are left to the script, which binds each to its version node (`RDMACM_1.0`, ...) exactly
//! as librdmacm does. A tail jump leaves every argument register and the stack untouched, so
//! each trampoline is exactly its target's C function, `rfcntl`'s variadic call included.
//!
//! `build.rs` makes both the version script and the `export!` invocations below from
//! `symbols.txt`, the one list of exported names: a symbol listed there gets a trampoline to
//! the function of the same name in the module of its section (`crate::ffi` or
//! `crate::rdmacm_fwd`), and is exported.

macro_rules! export {
    ($($name:ident => $target:path),* $(,)?) => {$(
        #[cfg(target_arch = "x86_64")]
        core::arch::global_asm!(
            ".text",
            ".p2align 4",
            concat!(".globl ", stringify!($name)),
            concat!(".type ", stringify!($name), ",@function"),
            concat!(stringify!($name), ":"),
            "jmp {f}",
            concat!(".size ", stringify!($name), ", .-", stringify!($name)),
            f = sym $target,
        );
        #[cfg(target_arch = "aarch64")]
        core::arch::global_asm!(
            ".text",
            ".p2align 4",
            concat!(".globl ", stringify!($name)),
            concat!(".type ", stringify!($name), ",%function"),
            concat!(stringify!($name), ":"),
            "b {f}",
            concat!(".size ", stringify!($name), ", .-", stringify!($name)),
            f = sym $target,
        );
    )*};
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!(
    "dp-rsocket-c defines its exports as x86_64 or aarch64 trampolines (and relies on those \
     ABIs passing rfcntl's variadic argument like a fixed one); port src/export.rs first"
);

// `export! { name => crate::module::name, ... }` for every symbol of `symbols.txt` that this
// build exports.
include!(concat!(env!("OUT_DIR"), "/exports.rs"));
