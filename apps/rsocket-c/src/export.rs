//! The exported symbols, and the only place that names them.
//!
//! Each exported function is a one-instruction assembler trampoline that tail-jumps to its
//! Rust implementation in [`crate::ffi`] (or [`crate::verbs_fwd`]). The trampolines exist
//! for the symbol versions: rustc gives every `#[no_mangle]` symbol of a cdylib its own,
//! unversioned export, which would win over `build.rs`'s version script; symbols defined in
//! assembler are left to the script, which binds each to the `RDMACM_1.0` node exactly as
//! librdmacm does. A tail jump leaves every argument register and the stack untouched, so
//! each trampoline is exactly its target's C function, `rfcntl`'s variadic call included.
//!
//! Keep this list and `build.rs`'s in step: a name missing here fails the link (the script
//! names an undefined symbol only as a warning, so the library test checks every symbol);
//! a name missing there is not exported.

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

export! {
    rsocket => crate::ffi::rsocket,
    rbind => crate::ffi::rbind,
    rlisten => crate::ffi::rlisten,
    raccept => crate::ffi::raccept,
    rconnect => crate::ffi::rconnect,
    rshutdown => crate::ffi::rshutdown,
    rclose => crate::ffi::rclose,
    rrecv => crate::ffi::rrecv,
    rrecvfrom => crate::ffi::rrecvfrom,
    rrecvmsg => crate::ffi::rrecvmsg,
    rsend => crate::ffi::rsend,
    rsendto => crate::ffi::rsendto,
    rsendmsg => crate::ffi::rsendmsg,
    rread => crate::ffi::rread,
    rreadv => crate::ffi::rreadv,
    rwrite => crate::ffi::rwrite,
    rwritev => crate::ffi::rwritev,
    rpoll => crate::ffi::rpoll,
    rselect => crate::ffi::rselect,
    rgetpeername => crate::ffi::rgetpeername,
    rgetsockname => crate::ffi::rgetsockname,
    rsetsockopt => crate::ffi::rsetsockopt,
    rgetsockopt => crate::ffi::rgetsockopt,
    rfcntl => crate::ffi::rfcntl,
    riomap => crate::ffi::riomap,
    riounmap => crate::ffi::riounmap,
    riowrite => crate::ffi::riowrite,
    rdma_getaddrinfo => crate::ffi::rdma_getaddrinfo,
    rdma_freeaddrinfo => crate::ffi::rdma_freeaddrinfo,
    rdma_create_event_channel => crate::ffi::rdma_create_event_channel,
    rdma_destroy_event_channel => crate::ffi::rdma_destroy_event_channel,
}

#[cfg(feature = "verbs")]
export! {
    rdma_create_id => crate::verbs_fwd::rdma_create_id,
    rdma_destroy_id => crate::verbs_fwd::rdma_destroy_id,
    rdma_bind_addr => crate::verbs_fwd::rdma_bind_addr,
    rdma_listen => crate::verbs_fwd::rdma_listen,
    rdma_resolve_addr => crate::verbs_fwd::rdma_resolve_addr,
    rdma_resolve_route => crate::verbs_fwd::rdma_resolve_route,
    rdma_connect => crate::verbs_fwd::rdma_connect,
    rdma_accept => crate::verbs_fwd::rdma_accept,
    rdma_reject => crate::verbs_fwd::rdma_reject,
    rdma_disconnect => crate::verbs_fwd::rdma_disconnect,
    rdma_get_cm_event => crate::verbs_fwd::rdma_get_cm_event,
    rdma_ack_cm_event => crate::verbs_fwd::rdma_ack_cm_event,
    rdma_create_qp => crate::verbs_fwd::rdma_create_qp,
    rdma_destroy_qp => crate::verbs_fwd::rdma_destroy_qp,
    rdma_migrate_id => crate::verbs_fwd::rdma_migrate_id,
    rdma_get_devices => crate::verbs_fwd::rdma_get_devices,
    rdma_free_devices => crate::verbs_fwd::rdma_free_devices,
}
