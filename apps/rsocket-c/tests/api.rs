//! The C API, called through the exported symbols the way a C program binds to them: the
//! test loads the built `librdmacm.so` with `dlopen` and looks every function up with
//! `dlvsym(..., "RDMACM_1.0")`, so each test also checks the symbol versions. Both ends of
//! every connection live in this process: the library's connection-manager thread accepts
//! in the background, so even a single thread can connect to itself.
//!
//! The tests run one at a time (they close descriptors and check that the numbers are
//! gone, which a parallel test could reuse); `threads_share_the_library` is the one that
//! runs calls concurrently.

mod common;

use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use libc::{iovec, msghdr, off_t, pollfd, size_t, sockaddr, sockaddr_in, socklen_t, ssize_t};

/// The exported API, with C's signatures (from `<rdma/rsocket.h>` and `<rdma/rdma_cma.h>`).
struct Api {
    rsocket: unsafe extern "C" fn(c_int, c_int, c_int) -> c_int,
    rbind: unsafe extern "C" fn(c_int, *const sockaddr, socklen_t) -> c_int,
    rlisten: unsafe extern "C" fn(c_int, c_int) -> c_int,
    raccept: unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int,
    rconnect: unsafe extern "C" fn(c_int, *const sockaddr, socklen_t) -> c_int,
    rshutdown: unsafe extern "C" fn(c_int, c_int) -> c_int,
    rclose: unsafe extern "C" fn(c_int) -> c_int,
    rrecv: unsafe extern "C" fn(c_int, *mut c_void, size_t, c_int) -> ssize_t,
    rrecvfrom: unsafe extern "C" fn(
        c_int,
        *mut c_void,
        size_t,
        c_int,
        *mut sockaddr,
        *mut socklen_t,
    ) -> ssize_t,
    rrecvmsg: unsafe extern "C" fn(c_int, *mut msghdr, c_int) -> ssize_t,
    rsend: unsafe extern "C" fn(c_int, *const c_void, size_t, c_int) -> ssize_t,
    rsendto: unsafe extern "C" fn(
        c_int,
        *const c_void,
        size_t,
        c_int,
        *const sockaddr,
        socklen_t,
    ) -> ssize_t,
    rsendmsg: unsafe extern "C" fn(c_int, *const msghdr, c_int) -> ssize_t,
    rread: unsafe extern "C" fn(c_int, *mut c_void, size_t) -> ssize_t,
    rreadv: unsafe extern "C" fn(c_int, *const iovec, c_int) -> ssize_t,
    rwrite: unsafe extern "C" fn(c_int, *const c_void, size_t) -> ssize_t,
    rwritev: unsafe extern "C" fn(c_int, *const iovec, c_int) -> ssize_t,
    rpoll: unsafe extern "C" fn(*mut pollfd, libc::nfds_t, c_int) -> c_int,
    rselect: unsafe extern "C" fn(
        c_int,
        *mut libc::fd_set,
        *mut libc::fd_set,
        *mut libc::fd_set,
        *mut libc::timeval,
    ) -> c_int,
    rgetpeername: unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int,
    rgetsockname: unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int,
    rsetsockopt: unsafe extern "C" fn(c_int, c_int, c_int, *const c_void, socklen_t) -> c_int,
    rgetsockopt: unsafe extern "C" fn(c_int, c_int, c_int, *mut c_void, *mut socklen_t) -> c_int,
    rfcntl: unsafe extern "C" fn(c_int, c_int, ...) -> c_int,
    riomap: unsafe extern "C" fn(c_int, *mut c_void, size_t, c_int, c_int, off_t) -> off_t,
    riounmap: unsafe extern "C" fn(c_int, *mut c_void, size_t) -> c_int,
    riowrite: unsafe extern "C" fn(c_int, *const c_void, size_t, off_t, c_int) -> size_t,
    rdma_getaddrinfo: unsafe extern "C" fn(
        *const c_char,
        *const c_char,
        *const c_void,
        *mut *mut RdmaAddrinfo,
    ) -> c_int,
    rdma_freeaddrinfo: unsafe extern "C" fn(*mut RdmaAddrinfo),
    rdma_create_event_channel: unsafe extern "C" fn() -> *mut c_int,
    rdma_destroy_event_channel: unsafe extern "C" fn(*mut c_int),
}

/// `struct rdma_addrinfo`.
#[repr(C)]
struct RdmaAddrinfo {
    ai_flags: c_int,
    ai_family: c_int,
    ai_qp_type: c_int,
    ai_port_space: c_int,
    ai_src_len: socklen_t,
    ai_dst_len: socklen_t,
    ai_src_addr: *mut sockaddr,
    ai_dst_addr: *mut sockaddr,
    ai_src_canonname: *mut c_char,
    ai_dst_canonname: *mut c_char,
    ai_route_len: size_t,
    ai_route: *mut c_void,
    ai_connect_len: size_t,
    ai_connect: *mut c_void,
    ai_next: *mut Self,
}

/// The rsocket calls and the address resolution this library serves itself, at
/// `RDMACM_1.0`.
const OURS: [&str; 29] = [
    "rsocket",
    "rbind",
    "rlisten",
    "raccept",
    "rconnect",
    "rshutdown",
    "rclose",
    "rrecv",
    "rrecvfrom",
    "rrecvmsg",
    "rsend",
    "rsendto",
    "rsendmsg",
    "rread",
    "rreadv",
    "rwrite",
    "rwritev",
    "rpoll",
    "rselect",
    "rgetpeername",
    "rgetsockname",
    "rsetsockopt",
    "rgetsockopt",
    "rfcntl",
    "riomap",
    "riounmap",
    "riowrite",
    "rdma_getaddrinfo",
    "rdma_freeaddrinfo",
];

/// The rest of librdmacm's version script (rdma-core v44), forwarded to the system's
/// librdmacm, with each symbol's version node.
const FORWARDED: [(&str, &str); 39] = [
    ("rdma_create_event_channel", "RDMACM_1.0"),
    ("rdma_destroy_event_channel", "RDMACM_1.0"),
    ("rdma_create_id", "RDMACM_1.0"),
    ("rdma_destroy_id", "RDMACM_1.0"),
    ("rdma_bind_addr", "RDMACM_1.0"),
    ("rdma_resolve_addr", "RDMACM_1.0"),
    ("rdma_resolve_route", "RDMACM_1.0"),
    ("rdma_create_qp", "RDMACM_1.0"),
    ("rdma_destroy_qp", "RDMACM_1.0"),
    ("rdma_connect", "RDMACM_1.0"),
    ("rdma_listen", "RDMACM_1.0"),
    ("rdma_accept", "RDMACM_1.0"),
    ("rdma_reject", "RDMACM_1.0"),
    ("rdma_notify", "RDMACM_1.0"),
    ("rdma_disconnect", "RDMACM_1.0"),
    ("rdma_get_cm_event", "RDMACM_1.0"),
    ("rdma_ack_cm_event", "RDMACM_1.0"),
    ("rdma_get_src_port", "RDMACM_1.0"),
    ("rdma_get_dst_port", "RDMACM_1.0"),
    ("rdma_join_multicast", "RDMACM_1.0"),
    ("rdma_leave_multicast", "RDMACM_1.0"),
    ("rdma_get_devices", "RDMACM_1.0"),
    ("rdma_free_devices", "RDMACM_1.0"),
    ("rdma_event_str", "RDMACM_1.0"),
    ("rdma_set_option", "RDMACM_1.0"),
    ("rdma_migrate_id", "RDMACM_1.0"),
    ("rdma_get_request", "RDMACM_1.0"),
    ("rdma_create_ep", "RDMACM_1.0"),
    ("rdma_destroy_ep", "RDMACM_1.0"),
    ("rdma_create_srq", "RDMACM_1.0"),
    ("rdma_destroy_srq", "RDMACM_1.0"),
    ("rdma_create_srq_ex", "RDMACM_1.0"),
    ("rdma_create_qp_ex", "RDMACM_1.0"),
    ("rdma_join_multicast_ex", "RDMACM_1.1"),
    ("rdma_establish", "RDMACM_1.2"),
    ("rdma_init_qp_attr", "RDMACM_1.2"),
    ("rdma_get_remote_ece", "RDMACM_1.3"),
    ("rdma_reject_ece", "RDMACM_1.3"),
    ("rdma_set_local_ece", "RDMACM_1.3"),
];

const SOL_RDMA: c_int = 0x10000;
const RDMA_SQSIZE: c_int = 0;
const RDMA_INLINE: c_int = 2;
const RDMA_IOMAPSIZE: c_int = 3;

fn handle() -> *mut c_void {
    static H: OnceLock<usize> = OnceLock::new();
    *H.get_or_init(|| {
        let path = std::ffi::CString::new(common::library().to_str().expect("utf-8 path"))
            .expect("no NUL in the path");
        // SAFETY: a NUL-terminated path; the library's initialisers are Rust statics only.
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!h.is_null(), "dlopen {}", common::library().display());
        h as usize
    }) as *mut c_void
}

fn sym(name: &str) -> *mut c_void {
    let n = std::ffi::CString::new(name).expect("symbol name");
    // SAFETY: live handle, NUL-terminated strings.
    unsafe { libc::dlvsym(handle(), n.as_ptr(), c"RDMACM_1.0".as_ptr()) }
}

fn api() -> &'static Api {
    static API: OnceLock<Api> = OnceLock::new();
    API.get_or_init(|| {
        macro_rules! f {
            ($n:ident) => {{
                let p = sym(stringify!($n));
                assert!(
                    !p.is_null(),
                    concat!(stringify!($n), "@RDMACM_1.0 is not exported")
                );
                // SAFETY: the symbol is the library's function of this C signature.
                #[allow(clippy::missing_transmute_annotations)]
                unsafe {
                    std::mem::transmute(p)
                }
            }};
        }
        Api {
            rsocket: f!(rsocket),
            rbind: f!(rbind),
            rlisten: f!(rlisten),
            raccept: f!(raccept),
            rconnect: f!(rconnect),
            rshutdown: f!(rshutdown),
            rclose: f!(rclose),
            rrecv: f!(rrecv),
            rrecvfrom: f!(rrecvfrom),
            rrecvmsg: f!(rrecvmsg),
            rsend: f!(rsend),
            rsendto: f!(rsendto),
            rsendmsg: f!(rsendmsg),
            rread: f!(rread),
            rreadv: f!(rreadv),
            rwrite: f!(rwrite),
            rwritev: f!(rwritev),
            rpoll: f!(rpoll),
            rselect: f!(rselect),
            rgetpeername: f!(rgetpeername),
            rgetsockname: f!(rgetsockname),
            rsetsockopt: f!(rsetsockopt),
            rgetsockopt: f!(rgetsockopt),
            rfcntl: f!(rfcntl),
            riomap: f!(riomap),
            riounmap: f!(riounmap),
            riowrite: f!(riowrite),
            rdma_getaddrinfo: f!(rdma_getaddrinfo),
            rdma_freeaddrinfo: f!(rdma_freeaddrinfo),
            rdma_create_event_channel: f!(rdma_create_event_channel),
            rdma_destroy_event_channel: f!(rdma_destroy_event_channel),
        }
    })
}

fn errno() -> c_int {
    // SAFETY: the calling thread's errno slot.
    unsafe { *libc::__errno_location() }
}

fn clear_errno() {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = 0 };
}

fn v4(port: u16) -> sockaddr_in {
    // SAFETY: all-zero is a valid sockaddr_in.
    let mut a: sockaddr_in = unsafe { std::mem::zeroed() };
    a.sin_family = libc::AF_INET as libc::sa_family_t;
    a.sin_port = port.to_be();
    a.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
    a
}

fn sp(a: &sockaddr_in) -> *const sockaddr {
    (a as *const sockaddr_in).cast()
}

const SIN_LEN: socklen_t = size_of::<sockaddr_in>() as socklen_t;

fn set_int(s: c_int, level: c_int, name: c_int, v: c_int) -> c_int {
    // SAFETY: a live int and its size.
    unsafe { (api().rsetsockopt)(s, level, name, (&raw const v).cast(), 4) }
}

fn get_int(s: c_int, level: c_int, name: c_int) -> c_int {
    let mut v: c_int = -12345;
    let mut len: socklen_t = 4;
    // SAFETY: a live int and its size.
    let r = unsafe { (api().rgetsockopt)(s, level, name, (&raw mut v).cast(), &mut len) };
    assert_eq!(r, 0, "getsockopt({level}, {name}): errno {}", errno());
    v
}

/// A stream listener on 127.0.0.1:`port`.
fn listener(port: u16) -> c_int {
    let a = api();
    // SAFETY: C calls with live arguments.
    unsafe {
        let l = (a.rsocket)(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(l >= 0, "rsocket: errno {}", errno());
        assert_eq!(set_int(l, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1), 0);
        let sa = v4(port);
        assert_eq!(
            (a.rbind)(l, sp(&sa), SIN_LEN),
            0,
            "rbind: errno {}",
            errno()
        );
        assert_eq!((a.rlisten)(l, 4), 0, "rlisten: errno {}", errno());
        l
    }
}

/// A connected pair over listener `l` on `port`: (client, accepted).
fn pair(l: c_int, port: u16) -> (c_int, c_int) {
    let a = api();
    // SAFETY: C calls with live arguments.
    unsafe {
        let c = (a.rsocket)(libc::AF_INET, libc::SOCK_STREAM, 0);
        let sa = v4(port);
        assert_eq!(
            (a.rconnect)(c, sp(&sa), SIN_LEN),
            0,
            "rconnect: errno {}",
            errno()
        );
        let s = (a.raccept)(l, std::ptr::null_mut(), std::ptr::null_mut());
        assert!(s >= 0, "raccept: errno {}", errno());
        (c, s)
    }
}

fn send_all(s: c_int, b: &[u8]) {
    // SAFETY: a live buffer and its length.
    let n = unsafe { (api().rsend)(s, b.as_ptr().cast(), b.len(), 0) };
    assert_eq!(n, b.len() as ssize_t, "rsend: errno {}", errno());
}

fn recv_exact(s: c_int, n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    // SAFETY: a live buffer and its length.
    let r = unsafe { (api().rrecv)(s, b.as_mut_ptr().cast(), n, libc::MSG_WAITALL) };
    assert_eq!(r, n as ssize_t, "rrecv: errno {}", errno());
    b
}

fn is_open(fd: c_int) -> bool {
    // SAFETY: fcntl on a descriptor number; no pointers.
    unsafe { libc::fcntl(fd, libc::F_GETFD) >= 0 }
}

/// Minimal ELF64 reader: the `DT_SONAME` of a shared object.
fn soname(path: &std::path::Path) -> Option<String> {
    let f = std::fs::read(path).ok()?;
    let u16_at = |o: usize| u16::from_le_bytes(f[o..o + 2].try_into().unwrap());
    let u32_at = |o: usize| u32::from_le_bytes(f[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(f[o..o + 8].try_into().unwrap()) as usize;
    let (shoff, shentsize, shnum) = (u64_at(0x28), u16_at(0x3A) as usize, u16_at(0x3C) as usize);
    let sec = |i: usize| shoff + i * shentsize;
    let dynamic = (0..shnum).find(|&i| u32_at(sec(i) + 4) == 6)?; // SHT_DYNAMIC
    let (off, size, link) = (
        u64_at(sec(dynamic) + 0x18),
        u64_at(sec(dynamic) + 0x20),
        u32_at(sec(dynamic) + 0x28) as usize,
    );
    let strtab = u64_at(sec(link) + 0x18);
    (0..size / 16).find_map(|i| {
        let e = off + i * 16;
        (u64_at(e) == 14).then(|| {
            // DT_SONAME
            let s = strtab + u64_at(e + 8);
            let end = f[s..].iter().position(|&b| b == 0).unwrap() + s;
            String::from_utf8_lossy(&f[s..end]).into_owned()
        })
    })
}

/// Minimal ELF64 reader: the names of the symbols a shared object defines and exports
/// (global or weak, defined, in `.dynsym`).
fn exported_names(path: &std::path::Path) -> Vec<String> {
    let f = std::fs::read(path).expect("reading the library");
    let u16_at = |o: usize| u16::from_le_bytes(f[o..o + 2].try_into().unwrap());
    let u32_at = |o: usize| u32::from_le_bytes(f[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(f[o..o + 8].try_into().unwrap()) as usize;
    let (shoff, shentsize, shnum) = (u64_at(0x28), u16_at(0x3A) as usize, u16_at(0x3C) as usize);
    let sec = |i: usize| shoff + i * shentsize;
    let dynsym = (0..shnum)
        .find(|&i| u32_at(sec(i) + 4) == 11) // SHT_DYNSYM
        .expect("a .dynsym section");
    let (off, size, link) = (
        u64_at(sec(dynsym) + 0x18),
        u64_at(sec(dynsym) + 0x20),
        u32_at(sec(dynsym) + 0x28) as usize,
    );
    let strtab = u64_at(sec(link) + 0x18);
    (0..size / 24)
        .map(|i| off + i * 24)
        .filter(|&e| matches!(f[e + 4] >> 4, 1 | 2) && u16_at(e + 6) != 0) // GLOBAL/WEAK, defined
        .map(|e| {
            let s = strtab + u32_at(e) as usize;
            let end = f[s..].iter().position(|&b| b == 0).unwrap() + s;
            String::from_utf8_lossy(&f[s..end]).into_owned()
        })
        .collect()
}

/// `name@version` in the library under test, or null.
fn vsym(name: &str, version: &str) -> *mut c_void {
    let n = std::ffi::CString::new(name).expect("symbol name");
    let v = std::ffi::CString::new(version).expect("version name");
    // SAFETY: live handle, NUL-terminated strings.
    unsafe { libc::dlvsym(handle(), n.as_ptr(), v.as_ptr()) }
}

#[test]
fn exports_carry_librdmacm_identity() {
    let _one = common::serial();
    assert_eq!(soname(common::library()).as_deref(), Some("librdmacm.so.1"));
    for name in OURS {
        assert!(!sym(name).is_null(), "{name}@RDMACM_1.0 is not exported");
    }
    for (name, version) in FORWARDED {
        assert!(
            !vsym(name, version).is_null(),
            "{name}@{version} is not exported"
        );
    }
    // And nothing else: a symbol added to `symbols.txt` belongs in one of the lists too.
    let mut exported = exported_names(common::library());
    exported.sort();
    let mut listed: Vec<String> = OURS
        .iter()
        .copied()
        .chain(FORWARDED.iter().map(|(n, _)| *n))
        .map(String::from)
        .collect();
    listed.sort();
    listed.dedup();
    assert_eq!(
        exported, listed,
        "the library exports exactly OURS and FORWARDED"
    );
    api();
}

/// Every symbol the system's librdmacm exports, this library exports too: a program
/// linked against librdmacm (`qperf`, which uses the RDMA CM and verbs) finds all it binds
/// to. Skipped, saying so, where librdmacm is not installed.
#[test]
fn exports_every_symbol_of_the_system_librdmacm() {
    let _one = common::serial();
    let arch = std::env::consts::ARCH;
    let Some(system) = [
        format!("/usr/lib/{arch}-linux-gnu/librdmacm.so.1"),
        format!("/lib/{arch}-linux-gnu/librdmacm.so.1"),
        "/usr/lib64/librdmacm.so.1".into(),
    ]
    .into_iter()
    .map(std::path::PathBuf::from)
    .find(|p| p.exists()) else {
        eprintln!(
            "skipped: the system's librdmacm.so.1 is not installed (apt-get install librdmacm1)"
        );
        return;
    };
    let ours = exported_names(common::library());
    // The system library's own version-node symbols (RDMACM_1.x, absolute) are not calls.
    let missing: Vec<String> = exported_names(&system)
        .into_iter()
        .filter(|n| !n.starts_with("RDMACM_") && !ours.contains(n))
        .collect();
    assert!(
        missing.is_empty(),
        "{} exports symbols this library lacks: {missing:?}",
        system.display()
    );
}

/// A forwarded call reaches the system's librdmacm: `rdma_event_str` answers from its
/// table (no device needed), and the answer for an unknown event is librdmacm's.
#[test]
fn rdma_cm_calls_reach_the_system_librdmacm() {
    let _one = common::serial();
    let p = vsym("rdma_event_str", "RDMACM_1.0");
    assert!(!p.is_null(), "rdma_event_str is not exported");
    // SAFETY: librdmacm's signature: const char *rdma_event_str(enum rdma_cm_event_type).
    let f: unsafe extern "C" fn(c_int) -> *const c_char = unsafe { std::mem::transmute(p) };
    let s = |e| {
        // SAFETY: rdma_event_str returns a static NUL-terminated string.
        unsafe { std::ffi::CStr::from_ptr(f(e)) }
            .to_string_lossy()
            .into_owned()
    };
    assert_eq!(s(9), "RDMA_CM_EVENT_ESTABLISHED");
    assert_eq!(s(0), "RDMA_CM_EVENT_ADDR_RESOLVED");
    assert_eq!(s(1000), "UNKNOWN EVENT");
}

#[test]
fn handles_are_real_descriptors_closed_by_rclose() {
    let _one = common::serial();
    let a = api();
    // SAFETY: C calls with live arguments.
    unsafe {
        let s = (a.rsocket)(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(s >= 0);
        assert!(is_open(s), "the handle is an open descriptor");
        let other = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY);
        assert!(
            other >= 0 && other != s,
            "descriptors never collide with handles"
        );
        libc::close(other);
        assert_eq!(libc::fcntl(s, libc::F_GETFD) & libc::FD_CLOEXEC, 0);
        let c = (a.rsocket)(libc::AF_INET6, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(c >= 0);
        assert_ne!(
            (a.rfcntl)(c, libc::F_GETFD) & libc::FD_CLOEXEC,
            0,
            "SOCK_CLOEXEC is real"
        );
        assert_eq!((a.rfcntl)(s, libc::F_SETFD, libc::FD_CLOEXEC), 0);
        assert_ne!(
            libc::fcntl(s, libc::F_GETFD) & libc::FD_CLOEXEC,
            0,
            "F_SETFD is real"
        );
        assert_eq!((a.rclose)(s), 0);
        assert_eq!((a.rclose)(c), 0);
        assert!(!is_open(s), "rclose closes the handle's descriptor");
        clear_errno();
        assert_eq!((a.rclose)(s), -1, "librdmacm's positive EBADF is fixed");
        assert_eq!(errno(), libc::EBADF);
        let mut p = [0 as c_int; 2];
        assert_eq!(libc::pipe(p.as_mut_ptr()), 0);
        assert_eq!((a.rclose)(p[0]), -1);
        assert_eq!(
            errno(),
            libc::EBADF,
            "an ordinary descriptor is not an rsocket"
        );
        assert!(is_open(p[0]), "rclose leaves ordinary descriptors alone");
        assert_eq!((a.rsend)(p[1], b"x".as_ptr().cast(), 1, 0), -1);
        assert_eq!(errno(), libc::EBADF);
        libc::close(p[0]);
        libc::close(p[1]);
        for (d, t, p) in [
            (libc::AF_UNIX, libc::SOCK_STREAM, 0),
            (libc::AF_INET, libc::SOCK_RAW, 0),
            (libc::AF_INET, libc::SOCK_STREAM, libc::IPPROTO_UDP),
            (27, libc::SOCK_STREAM, 0), // AF_IB
        ] {
            assert_eq!((a.rsocket)(d, t, p), -1, "rsocket({d}, {t}, {p})");
            assert_eq!(errno(), libc::EOPNOTSUPP);
        }
    }
}

#[test]
fn blocking_stream_semantics() {
    let _one = common::serial();
    let a = api();
    let port = common::port(1);
    let l = listener(port);
    // SAFETY: C calls with live arguments throughout.
    unsafe {
        let c = (a.rsocket)(libc::AF_INET, libc::SOCK_STREAM, 0);
        let sa = v4(port);
        assert_eq!((a.rconnect)(c, sp(&sa), SIN_LEN), 0);
        let mut peer: sockaddr_in = std::mem::zeroed();
        let mut len = SIN_LEN;
        let s = (a.raccept)(l, (&raw mut peer).cast(), &mut len);
        assert!(s >= 0 && s != c && s != l);
        assert_eq!(
            (len, u32::from_be(peer.sin_addr.s_addr)),
            (SIN_LEN, 0x7F00_0001)
        );
        // Names: the client's peer is the listener's address; the accepted socket's peer is
        // the client's local address.
        let mut name: sockaddr_in = std::mem::zeroed();
        let mut len = SIN_LEN;
        assert_eq!((a.rgetpeername)(c, (&raw mut name).cast(), &mut len), 0);
        assert_eq!(u16::from_be(name.sin_port), port);
        let mut local: sockaddr_in = std::mem::zeroed();
        let mut len = SIN_LEN;
        assert_eq!((a.rgetsockname)(c, (&raw mut local).cast(), &mut len), 0);
        assert_eq!(local.sin_port, peer.sin_port);
        let mut len = SIN_LEN;
        assert_eq!((a.rgetsockname)(l, (&raw mut name).cast(), &mut len), 0);
        assert_eq!(u16::from_be(name.sin_port), port);

        // Data both ways, larger than the ring, with peek and waitall.
        let big: Vec<u8> = (0..3 << 20).map(|i| (i * 7 + 1) as u8).collect();
        let sender = {
            let big = big.clone();
            std::thread::spawn(move || send_all(c, &big))
        };
        let mut head = [0u8; 5];
        let n = (a.rrecv)(
            s,
            head.as_mut_ptr().cast(),
            5,
            libc::MSG_PEEK | libc::MSG_WAITALL,
        );
        assert_eq!((n, &head[..]), (5, &big[..5]), "peek");
        assert_eq!(
            recv_exact(s, big.len()),
            big,
            "MSG_WAITALL gets everything, in order"
        );
        sender.join().unwrap();
        assert_eq!((a.rwrite)(s, b"pong".as_ptr().cast(), 4), 4);
        let mut b = [0u8; 4];
        assert_eq!((a.rread)(c, b.as_mut_ptr().cast(), 4), 4);
        assert_eq!(&b, b"pong");
        // Zero-length send and receive.
        assert_eq!((a.rsend)(c, b.as_ptr().cast(), 0, 0), 0);

        // Half close: the peer reads end of stream, and can still send back.
        assert_eq!((a.rshutdown)(c, libc::SHUT_WR), 0);
        assert_eq!(
            (a.rrecv)(s, b.as_mut_ptr().cast(), 4, 0),
            0,
            "EOF after SHUT_WR"
        );
        send_all(s, b"late");
        assert_eq!(recv_exact(c, 4), b"late");
        clear_errno();
        assert_eq!((a.rsend)(c, b.as_ptr().cast(), 4, 0), -1);
        assert_eq!(
            errno(),
            libc::ECONNRESET,
            "send after SHUT_WR: ECONNRESET, not EPIPE"
        );
        assert_eq!((a.rshutdown)(c, 7), -1);
        assert_eq!(errno(), libc::EINVAL);

        // The peer closes: reads give EOF, sends ECONNRESET (never SIGPIPE).
        assert_eq!((a.rclose)(c), 0);
        assert_eq!((a.rrecv)(s, b.as_mut_ptr().cast(), 4, 0), 0);
        let t0 = Instant::now();
        loop {
            let r = (a.rsend)(s, b.as_ptr().cast(), 4, 0);
            if r == -1 {
                assert_eq!(errno(), libc::ECONNRESET);
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "sends keep succeeding"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!((a.rclose)(s), 0);

        // raccept on a socket that is not listening; rconnect where nobody listens.
        let x = (a.rsocket)(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert_eq!(
            (a.raccept)(x, std::ptr::null_mut(), std::ptr::null_mut()),
            -1
        );
        assert_eq!(
            errno(),
            libc::EBADF,
            "librdmacm's code for accept on a non-listener"
        );
        let nobody = v4(common::port(15));
        assert_eq!((a.rconnect)(x, sp(&nobody), SIN_LEN), -1);
        assert_eq!(errno(), libc::ECONNREFUSED);
        assert_eq!((a.rrecv)(x, b.as_mut_ptr().cast(), 4, 0), -1);
        assert_eq!(errno(), libc::ENOTCONN);
        assert_eq!((a.rclose)(x), 0);
        assert_eq!((a.rclose)(l), 0);
    }
}

#[test]
fn nonblocking_calls_and_async_connect() {
    let _one = common::serial();
    let a = api();
    let port = common::port(2);
    let l = listener(port);
    // SAFETY: C calls with live arguments throughout.
    unsafe {
        assert_eq!((a.rfcntl)(l, libc::F_GETFL) & libc::O_NONBLOCK, 0);
        assert_eq!((a.rfcntl)(l, libc::F_SETFL, libc::O_NONBLOCK), 0);
        assert_ne!((a.rfcntl)(l, libc::F_GETFL) & libc::O_NONBLOCK, 0);
        assert_eq!(
            (a.raccept)(l, std::ptr::null_mut(), std::ptr::null_mut()),
            -1
        );
        assert_eq!(errno(), libc::EAGAIN, "nothing to accept");
        assert_eq!((a.rfcntl)(l, libc::F_DUPFD, 0), -1);
        assert_eq!(errno(), libc::EOPNOTSUPP);

        let c = (a.rsocket)(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0);
        assert_ne!(
            (a.rfcntl)(c, libc::F_GETFL) & libc::O_NONBLOCK,
            0,
            "SOCK_NONBLOCK"
        );
        let sa = v4(port);
        let r = (a.rconnect)(c, sp(&sa), SIN_LEN);
        if r == -1 {
            assert_eq!(errno(), libc::EINPROGRESS);
        }
        let mut p = pollfd {
            fd: c,
            events: libc::POLLOUT,
            revents: 0,
        };
        assert_eq!((a.rpoll)(&mut p, 1, 10_000), 1, "connected within 10 s");
        assert_eq!(p.revents & libc::POLLOUT, libc::POLLOUT);
        assert_eq!(get_int(c, libc::SOL_SOCKET, libc::SO_ERROR), 0);

        let mut lp = pollfd {
            fd: l,
            events: libc::POLLIN,
            revents: 0,
        };
        assert_eq!((a.rpoll)(&mut lp, 1, 10_000), 1, "a connection to accept");
        let s = (a.raccept)(l, std::ptr::null_mut(), std::ptr::null_mut());
        assert!(s >= 0);
        assert_ne!(
            (a.rfcntl)(s, libc::F_GETFL) & libc::O_NONBLOCK,
            0,
            "accepted sockets inherit O_NONBLOCK (librdmacm)"
        );
        let mut b = [0u8; 8];
        assert_eq!((a.rrecv)(s, b.as_mut_ptr().cast(), 8, 0), -1);
        assert_eq!(errno(), libc::EWOULDBLOCK);
        // MSG_DONTWAIT on a blocking socket.
        assert_eq!((a.rfcntl)(s, libc::F_SETFL, 0), 0);
        assert_eq!(
            (a.rrecv)(s, b.as_mut_ptr().cast(), 8, libc::MSG_DONTWAIT),
            -1
        );
        assert_eq!(errno(), libc::EWOULDBLOCK);

        // A non-blocking sender fills the window, then gets EWOULDBLOCK, then drains.
        let chunk = vec![9u8; 1 << 20];
        let mut sent = 0usize;
        loop {
            let n = (a.rsend)(c, chunk.as_ptr().cast(), chunk.len(), 0);
            if n < 0 {
                assert_eq!(errno(), libc::EWOULDBLOCK);
                break;
            }
            sent += n as usize;
            assert!(sent < 64 << 20, "the window never fills");
        }
        assert!(sent > 0);
        assert_eq!(recv_exact(s, sent), vec![9u8; sent]);
        // Small messages beyond the credits (one per message, rq_size 384 by default) are
        // taken into the send buffer, and arrive although the sender never calls again:
        // only the receiver's calls move them.
        let msg: Vec<u8> = (0..64u8).collect();
        let mut msgs = 0usize;
        while (a.rsend)(c, msg.as_ptr().cast(), msg.len(), 0) == 64 {
            msgs += 1;
            assert!(msgs < 1 << 20, "the send buffer never fills");
        }
        assert_eq!(errno(), libc::EWOULDBLOCK);
        assert!(msgs > 384, "stopped at the credits: {msgs} messages");
        let got = recv_exact(s, msgs * 64);
        assert!(got.chunks(64).all(|m| m == msg.as_slice()), "in order");
        for x in [c, s, l] {
            assert_eq!((a.rclose)(x), 0);
        }
    }
}

#[test]
fn rpoll_and_rselect_mix_rsockets_and_descriptors() {
    let _one = common::serial();
    let a = api();
    let port = common::port(3);
    let l = listener(port);
    let (c, s) = pair(l, port);
    let mut fds = [0 as c_int; 2];
    // SAFETY: C calls with live arguments throughout.
    unsafe {
        assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
        let [rd, wr] = fds;
        let mut set = [
            pollfd {
                fd: rd,
                events: libc::POLLIN,
                revents: 0,
            },
            pollfd {
                fd: s,
                events: libc::POLLIN,
                revents: 0,
            },
            pollfd {
                fd: -1,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        assert_eq!((a.rpoll)(set.as_mut_ptr(), 3, 0), 0, "nothing ready");
        let t0 = Instant::now();
        assert_eq!((a.rpoll)(set.as_mut_ptr(), 3, 50), 0);
        assert!(
            t0.elapsed() >= Duration::from_millis(50),
            "rpoll waits its timeout"
        );

        assert_eq!(libc::write(wr, b"x".as_ptr().cast(), 1), 1);
        assert_eq!((a.rpoll)(set.as_mut_ptr(), 3, 10_000), 1);
        assert_eq!(
            (set[0].revents, set[1].revents, set[2].revents),
            (libc::POLLIN, 0, 0)
        );
        assert_eq!((set[0].fd, set[1].fd), (rd, s), "the set is left as it was");
        let mut b = [0u8; 1];
        libc::read(rd, b.as_mut_ptr().cast(), 1);

        send_all(c, b"y");
        assert_eq!((a.rpoll)(set.as_mut_ptr(), 3, 10_000), 1);
        assert_eq!((set[0].revents, set[1].revents), (0, libc::POLLIN));
        // A blocked rpoll wakes for an ordinary descriptor.
        let w = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            libc::write(wr, b"z".as_ptr().cast(), 1)
        });
        recv_exact(s, 1);
        assert_eq!((a.rpoll)(set.as_mut_ptr(), 2, -1), 1);
        assert_eq!(set[0].revents, libc::POLLIN);
        assert_eq!(w.join().unwrap(), 1);

        // rselect over the same mix, including writability of the rsocket.
        let mut r: libc::fd_set = std::mem::zeroed();
        let mut wset: libc::fd_set = std::mem::zeroed();
        libc::FD_SET(rd, &mut r);
        libc::FD_SET(s, &mut r);
        libc::FD_SET(c, &mut wset);
        let nfds = rd.max(s).max(c) + 1;
        let mut tv = libc::timeval {
            tv_sec: 5,
            tv_usec: 0,
        };
        let n = (a.rselect)(nfds, &mut r, &mut wset, std::ptr::null_mut(), &mut tv);
        assert_eq!(n, 2, "the pipe is readable and the client writable");
        assert!(libc::FD_ISSET(rd, &r) && !libc::FD_ISSET(s, &r) && libc::FD_ISSET(c, &wset));
        // The peer sends and closes: POLLIN alone while its data waits (no POLLHUP that
        // would make a program drop it), then end of stream with POLLHUP.
        send_all(c, b"last");
        assert_eq!((a.rclose)(c), 0);
        let mut p = pollfd {
            fd: s,
            events: libc::POLLIN,
            revents: 0,
        };
        assert_eq!((a.rpoll)(&mut p, 1, 10_000), 1);
        assert_eq!(p.revents, libc::POLLIN, "data first");
        assert_eq!(recv_exact(s, 4), b"last");
        let t0 = Instant::now();
        while p.revents & libc::POLLHUP == 0 {
            assert_eq!((a.rpoll)(&mut p, 1, 10_000), 1);
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "no POLLHUP after the close"
            );
        }
        assert_ne!(p.revents & libc::POLLIN, 0, "end of stream is readable");
        let mut b = [0u8; 4];
        assert_eq!((a.rrecv)(s, b.as_mut_ptr().cast(), 4, 0), 0);
        // Only ordinary descriptors: plain poll semantics.
        let mut q = pollfd {
            fd: wr,
            events: libc::POLLOUT,
            revents: 0,
        };
        assert_eq!((a.rpoll)(&mut q, 1, 0), 1);
        libc::close(rd);
        libc::close(wr);
        assert_eq!((a.rclose)(s), 0);
        assert_eq!((a.rclose)(l), 0);
    }
}

#[test]
fn socket_options() {
    let _one = common::serial();
    let a = api();
    let port = common::port(4);
    let l = listener(port);
    assert_eq!(
        set_int(l, SOL_RDMA, RDMA_SQSIZE, 64),
        0,
        "RDMA options on the listener"
    );
    assert_eq!(get_int(l, SOL_RDMA, RDMA_SQSIZE), 64);
    assert_eq!(set_int(l, SOL_RDMA, RDMA_IOMAPSIZE, 300), 0);
    assert_eq!(
        get_int(l, SOL_RDMA, RDMA_IOMAPSIZE),
        256,
        "scale-rounded as librdmacm"
    );
    assert_eq!(set_int(l, SOL_RDMA, RDMA_INLINE, 0x1_0000), -1);
    assert_eq!(errno(), libc::EINVAL);
    assert_eq!(set_int(l, libc::SOL_SOCKET, libc::SO_RCVBUF, 1 << 19), 0);
    assert_eq!(
        get_int(l, libc::SOL_SOCKET, libc::SO_RCVBUF),
        1 << 20,
        "doubled"
    );
    let (c, s) = pair(l, port);
    assert_eq!(
        get_int(s, SOL_RDMA, RDMA_SQSIZE),
        64,
        "accepted sockets inherit"
    );
    assert_eq!(
        set_int(c, SOL_RDMA, RDMA_INLINE, 16),
        -1,
        "after connecting"
    );
    assert_eq!(errno(), libc::EINVAL);
    assert_eq!(set_int(c, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1), 0);
    assert_eq!(get_int(c, libc::IPPROTO_TCP, libc::TCP_NODELAY), 1);
    assert_eq!(set_int(c, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1), 0);
    assert_eq!(set_int(c, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 30), 0);
    assert_eq!(get_int(c, libc::SOL_SOCKET, libc::SO_KEEPALIVE), 1);
    assert_eq!(get_int(c, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE), 30);
    assert_eq!(set_int(c, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 0), -1);
    assert_eq!(errno(), libc::EINVAL);
    assert_eq!(set_int(c, libc::IPPROTO_IP, libc::IP_TOS, 0x10), 0);
    assert_eq!(get_int(c, libc::IPPROTO_IP, libc::IP_TOS), 0x10);
    assert_eq!(get_int(c, libc::SOL_SOCKET, libc::SO_REUSEADDR), 0);
    assert_eq!(get_int(l, libc::SOL_SOCKET, libc::SO_REUSEADDR), 1);
    assert_eq!(
        get_int(c, libc::SOL_SOCKET, libc::SO_TYPE),
        libc::SOCK_STREAM
    );
    assert_eq!(get_int(c, libc::SOL_SOCKET, libc::SO_ERROR), 0);
    assert_eq!(set_int(c, libc::SOL_SOCKET, libc::SO_PRIORITY, 1), -1);
    assert_eq!(errno(), libc::EOPNOTSUPP);
    // SAFETY: C calls with live arguments throughout.
    unsafe {
        let lg = libc::linger {
            l_onoff: 1,
            l_linger: 5,
        };
        let sz = size_of::<libc::linger>() as socklen_t;
        assert_eq!(
            (a.rsetsockopt)(
                c,
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&raw const lg).cast(),
                sz
            ),
            0
        );
        let mut back = libc::linger {
            l_onoff: 0,
            l_linger: 0,
        };
        let mut len = sz;
        assert_eq!(
            (a.rgetsockopt)(
                c,
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&raw mut back).cast(),
                &mut len
            ),
            0
        );
        assert_eq!((back.l_onoff, back.l_linger, len), (1, 5, sz));
        let mut info: libc::tcp_info = std::mem::zeroed();
        let mut len = size_of::<libc::tcp_info>() as socklen_t;
        assert_eq!(
            (a.rgetsockopt)(
                c,
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                (&raw mut info).cast(),
                &mut len
            ),
            0
        );
        assert_eq!(info.tcpi_state, 1, "TCP_ESTABLISHED while connected");
        // A short buffer gets a truncated value and the length copied.
        let mut small = [0u8; 2];
        let mut len: socklen_t = 2;
        assert_eq!(
            (a.rgetsockopt)(
                c,
                libc::SOL_SOCKET,
                libc::SO_TYPE,
                small.as_mut_ptr().cast(),
                &mut len
            ),
            0
        );
        assert_eq!((len, small), (2, (libc::SOCK_STREAM as u16).to_ne_bytes()));
        assert_eq!(
            (a.rsetsockopt)(
                c,
                libc::SOL_SOCKET,
                libc::SO_KEEPALIVE,
                b"x".as_ptr().cast(),
                1
            ),
            -1
        );
        assert_eq!(errno(), libc::EINVAL, "short option value");
        for x in [c, s, l] {
            assert_eq!((a.rclose)(x), 0);
        }
    }
}

#[test]
fn vectored_and_message_io() {
    let _one = common::serial();
    let a = api();
    let port = common::port(5);
    let l = listener(port);
    let (c, s) = pair(l, port);
    // SAFETY: C calls with live arguments throughout.
    unsafe {
        let parts: [&[u8]; 3] = [b"hello ", b"vectored ", b"world"];
        let iov: Vec<iovec> = parts
            .iter()
            .map(|p| iovec {
                iov_base: p.as_ptr() as *mut c_void,
                iov_len: p.len(),
            })
            .collect();
        assert_eq!((a.rwritev)(c, iov.as_ptr(), 3), 20);
        // Wait until all of it is queued, then scatter it over three buffers: every iovec
        // is filled (librdmacm fills only the first).
        let mut p = pollfd {
            fd: s,
            events: libc::POLLIN,
            revents: 0,
        };
        assert_eq!((a.rpoll)(&mut p, 1, 10_000), 1);
        let mut peek = [0u8; 20];
        assert_eq!(
            (a.rrecv)(
                s,
                peek.as_mut_ptr().cast(),
                20,
                libc::MSG_PEEK | libc::MSG_WAITALL
            ),
            20
        );
        let (mut x, mut y, mut z) = ([0u8; 4], [0u8; 10], [0u8; 6]);
        let riov = [
            iovec {
                iov_base: x.as_mut_ptr().cast(),
                iov_len: 4,
            },
            iovec {
                iov_base: y.as_mut_ptr().cast(),
                iov_len: 10,
            },
            iovec {
                iov_base: z.as_mut_ptr().cast(),
                iov_len: 6,
            },
        ];
        assert_eq!((a.rreadv)(s, riov.as_ptr(), 3), 20);
        assert_eq!((&x, &y, &z), (b"hell", b"o vectored", b" world"));

        let mut m: msghdr = std::mem::zeroed();
        m.msg_iov = iov.as_ptr() as *mut iovec;
        m.msg_iovlen = 3;
        assert_eq!((a.rsendmsg)(c, &m, 0), 20);
        let mut ctl = [0u8; 8];
        m.msg_control = ctl.as_mut_ptr().cast();
        m.msg_controllen = 8;
        assert_eq!((a.rsendmsg)(c, &m, 0), -1);
        assert_eq!(errno(), libc::EOPNOTSUPP, "no ancillary data over rsockets");
        let mut out = [0u8; 20];
        let oiov = [iovec {
            iov_base: out.as_mut_ptr().cast(),
            iov_len: 20,
        }];
        let mut r: msghdr = std::mem::zeroed();
        r.msg_iov = oiov.as_ptr() as *mut iovec;
        r.msg_iovlen = 1;
        r.msg_control = ctl.as_mut_ptr().cast();
        r.msg_controllen = 8;
        assert_eq!(
            (a.rrecvmsg)(s, &mut r, libc::MSG_WAITALL),
            20,
            "flags are honoured"
        );
        assert_eq!(
            (&out, r.msg_controllen, r.msg_flags),
            (b"hello vectored world", 0, 0)
        );
        assert_eq!((a.rwritev)(c, iov.as_ptr(), -1), -1);
        assert_eq!(errno(), libc::EINVAL);
        for x in [c, s, l] {
            assert_eq!((a.rclose)(x), 0);
        }
    }
}

#[test]
fn iomap_and_riowrite_into_plain_memory() {
    let _one = common::serial();
    let a = api();
    let port = common::port(6);
    let l = listener(port);
    assert_eq!(set_int(l, SOL_RDMA, RDMA_IOMAPSIZE, 1), 0);
    // SAFETY: C calls with live arguments throughout; the mapping below is ours alone and
    // outlives its registration.
    unsafe {
        let c = (a.rsocket)(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert_eq!(set_int(c, SOL_RDMA, RDMA_IOMAPSIZE, 1), 0);
        let sa = v4(port);
        assert_eq!((a.rconnect)(c, sp(&sa), SIN_LEN), 0);
        let s = (a.raccept)(l, std::ptr::null_mut(), std::ptr::null_mut());
        assert!(s >= 0);
        // Plain private anonymous memory (what malloc returns for large buffers), which the
        // shm provider makes shareable in place.
        let len = 3 * 4096;
        let buf = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(buf, libc::MAP_FAILED);
        std::ptr::write_bytes(buf.cast::<u8>(), 0xEE, len);
        let at = buf.cast::<u8>().add(100);
        assert_eq!((a.riomap)(s, at.cast(), 8000, libc::PROT_READ, 0, 0), -1);
        assert_eq!(
            errno(),
            libc::EINVAL,
            "prot must be PROT_WRITE or PROT_NONE"
        );
        assert_eq!(
            (a.riomap)(s, at.cast(), 8000, libc::PROT_WRITE, 0, 4096),
            4096
        );
        assert_eq!((a.riomap)(s, at.cast(), 100, libc::PROT_WRITE, 0, 0), -1);
        assert_eq!(errno(), libc::ENOMEM, "the peer exposes one slot only");
        // The mapping travels with the next send; after it, the peer can write.
        send_all(s, b"m");
        assert_eq!(recv_exact(c, 1), b"m");
        let data: Vec<u8> = (0..5000).map(|i| (i % 253) as u8).collect();
        let n = (a.riowrite)(c, data.as_ptr().cast(), data.len(), 4096 + 10, 0);
        assert_eq!(n, data.len());
        assert_eq!((a.riowrite)(c, data.as_ptr().cast(), 10, 0, 0), usize::MAX);
        assert_eq!(errno(), libc::EINVAL, "offset 0 is not mapped");
        // RC order: the notification arrives after the direct write landed.
        send_all(c, b"n");
        assert_eq!(recv_exact(s, 1), b"n");
        let got = std::slice::from_raw_parts(at, 8000);
        assert!(got[..10].iter().all(|&b| b == 0xEE));
        assert_eq!(&got[10..5010], &data[..]);
        assert!(got[5010..].iter().all(|&b| b == 0xEE));
        assert_eq!((a.riounmap)(s, at.cast(), 8000), 0);
        assert_eq!((a.riounmap)(s, at.cast(), 8000), -1);
        assert_eq!(errno(), libc::EINVAL);
        // PROT_NONE mappings are local only.
        assert_eq!(
            (a.riomap)(s, at.cast(), 16, libc::PROT_NONE, 0, -1),
            at as off_t
        );
        assert_eq!((a.riounmap)(s, at.cast(), 16), 0);
        for x in [c, s, l] {
            assert_eq!((a.rclose)(x), 0);
        }
        libc::munmap(buf, len);
    }
}

#[test]
fn datagrams() {
    let _one = common::serial();
    let a = api();
    let (pa, pb) = (common::port(7), common::port(8));
    // SAFETY: C calls with live arguments throughout.
    unsafe {
        let x = (a.rsocket)(libc::AF_INET, libc::SOCK_DGRAM, 0);
        let y = (a.rsocket)(libc::AF_INET, libc::SOCK_DGRAM, libc::IPPROTO_UDP);
        assert!(x >= 0 && y >= 0);
        assert_eq!(
            get_int(x, libc::SOL_SOCKET, libc::SO_TYPE),
            libc::SOCK_DGRAM
        );
        let (sa, sb) = (v4(pa), v4(pb));
        assert_eq!((a.rbind)(x, sp(&sa), SIN_LEN), 0);
        assert_eq!((a.rbind)(y, sp(&sb), SIN_LEN), 0);
        assert_eq!((a.rsend)(x, b"no".as_ptr().cast(), 2, 0), -1);
        assert_eq!(errno(), libc::EDESTADDRREQ);
        let big = [0u8; 3000];
        assert_eq!(
            (a.rsendto)(x, big.as_ptr().cast(), 3000, 0, sp(&sb), SIN_LEN),
            -1
        );
        assert_eq!(errno(), libc::EMSGSIZE);
        for i in 0..3u8 {
            let m = [i; 100];
            assert_eq!(
                (a.rsendto)(x, m.as_ptr().cast(), 100, 0, sp(&sb), SIN_LEN),
                100
            );
            let mut b = [0u8; 200];
            let mut from: sockaddr_in = std::mem::zeroed();
            let mut fl = SIN_LEN;
            let n = (a.rrecvfrom)(
                y,
                b.as_mut_ptr().cast(),
                200,
                0,
                (&raw mut from).cast(),
                &mut fl,
            );
            assert_eq!(n, 100);
            assert_eq!((b[0], u16::from_be(from.sin_port)), (i, pa));
        }
        // Connected: rsend/rrecv, and a truncated datagram reports MSG_TRUNC.
        assert_eq!((a.rconnect)(y, sp(&sa), SIN_LEN), 0);
        assert_eq!((a.rsend)(y, [7u8; 50].as_ptr().cast(), 50, 0), 50);
        let mut small = [0u8; 10];
        let iov = [iovec {
            iov_base: small.as_mut_ptr().cast(),
            iov_len: 10,
        }];
        let mut m: msghdr = std::mem::zeroed();
        m.msg_iov = iov.as_ptr() as *mut iovec;
        m.msg_iovlen = 1;
        assert_eq!((a.rrecvmsg)(x, &mut m, 0), 10);
        assert_eq!((small, m.msg_flags), ([7u8; 10], libc::MSG_TRUNC));
        assert_eq!((a.rfcntl)(x, libc::F_SETFL, libc::O_NONBLOCK), 0);
        assert_eq!((a.rrecv)(x, small.as_mut_ptr().cast(), 10, 0), -1);
        assert_eq!(errno(), libc::EWOULDBLOCK);
        let mut p = pollfd {
            fd: y,
            events: libc::POLLOUT,
            revents: 0,
        };
        assert_eq!((a.rpoll)(&mut p, 1, 10_000), 1);
        assert_eq!((a.rshutdown)(x, libc::SHUT_RDWR), 0);
        assert_eq!((a.rclose)(x), 0);
        assert_eq!((a.rclose)(y), 0);
    }
}

#[test]
fn rdma_cm_entry_points() {
    let _one = common::serial();
    let a = api();
    // SAFETY: C calls with live arguments throughout.
    unsafe {
        let mut hints: RdmaAddrinfo = std::mem::zeroed();
        hints.ai_flags = 2; // RAI_NUMERICHOST
        hints.ai_port_space = 0x0106; // RDMA_PS_TCP
        let mut res: *mut RdmaAddrinfo = std::ptr::null_mut();
        let r = (a.rdma_getaddrinfo)(
            c"127.0.0.1".as_ptr(),
            c"7471".as_ptr(),
            (&raw const hints).cast(),
            &mut res,
        );
        assert_eq!(r, 0);
        let e = &*res;
        assert_eq!(e.ai_family, libc::AF_INET);
        assert!(e.ai_next.is_null() && e.ai_src_addr.is_null());
        assert_eq!(e.ai_dst_len, SIN_LEN);
        let dst = &*e.ai_dst_addr.cast::<sockaddr_in>();
        assert_eq!(u16::from_be(dst.sin_port), 7471);
        (a.rdma_freeaddrinfo)(res);
        (a.rdma_freeaddrinfo)(std::ptr::null_mut());
        // The event channel is the system librdmacm's: where it has no RDMA CM device it
        // fails as that library does (null, ENODEV or EPERM), else it is a real channel.
        let ch = (a.rdma_create_event_channel)();
        if ch.is_null() {
            let e = std::io::Error::last_os_error().raw_os_error();
            assert!(
                matches!(e, Some(libc::ENODEV | libc::EPERM | libc::ENOENT)),
                "rdma_create_event_channel failed with {e:?}"
            );
        } else {
            assert!(is_open(*ch));
            (a.rdma_destroy_event_channel)(ch);
        }
    }
}

/// Several threads at once: two connections through one listener, each echoed by a server
/// thread, and each client socket written by one thread while another reads it.
#[test]
fn threads_share_the_library() {
    let _one = common::serial();
    let a = api();
    let port = common::port(9);
    let l = listener(port);
    const BYTES: usize = 4 << 20;
    let pattern = |conn: usize, i: usize| (i * 31 + conn * 7 + i / 4096) as u8;
    let mut threads = Vec::new();
    for conn in 0..2usize {
        threads.push(std::thread::spawn(move || {
            // SAFETY: C calls with live arguments.
            let c = unsafe { (api().rsocket)(libc::AF_INET, libc::SOCK_STREAM, 0) };
            let sa = v4(port);
            // SAFETY: as above.
            assert_eq!(unsafe { (api().rconnect)(c, sp(&sa), SIN_LEN) }, 0);
            let writer = std::thread::spawn(move || {
                let data: Vec<u8> = (0..BYTES).map(|i| pattern(conn, i)).collect();
                // Uneven pieces, so messages and ring wrap-arounds fall everywhere.
                let mut at = 0;
                let mut step = 1usize;
                while at < BYTES {
                    let n = step.min(BYTES - at);
                    send_all(c, &data[at..at + n]);
                    at += n;
                    step = (step * 3 + 1) % 70_000 + 1;
                }
            });
            let echoed = recv_exact(c, BYTES);
            writer.join().expect("writer");
            assert!(
                echoed
                    .iter()
                    .enumerate()
                    .all(|(i, &b)| b == pattern(conn, i)),
                "connection {conn}: echo differs"
            );
            // SAFETY: as above.
            assert_eq!(unsafe { (api().rclose)(c) }, 0);
        }));
    }
    for _ in 0..2 {
        // SAFETY: C calls with live arguments.
        let s = unsafe { (a.raccept)(l, std::ptr::null_mut(), std::ptr::null_mut()) };
        assert!(s >= 0, "raccept: errno {}", errno());
        threads.push(std::thread::spawn(move || {
            let mut b = vec![0u8; 100_000];
            loop {
                // SAFETY: a live buffer and its length.
                let n = unsafe { (api().rrecv)(s, b.as_mut_ptr().cast(), b.len(), 0) };
                assert!(n >= 0, "echo rrecv: errno {}", errno());
                if n == 0 {
                    break;
                }
                send_all(s, &b[..n as usize]);
            }
            // SAFETY: as above.
            assert_eq!(unsafe { (api().rclose)(s) }, 0);
        }));
    }
    let t0 = Instant::now();
    while !threads.iter().all(|t| t.is_finished()) {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "threads still running after 120 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    for t in threads {
        t.join().expect("thread");
    }
    // SAFETY: as above.
    assert_eq!(unsafe { (a.rclose)(l) }, 0);
}

/// `rclose` of a stream holding sends buffered for want of credits ends its wait as soon
/// as the peer disconnects: nothing more can be delivered (TCP would have been reset). It
/// used to wait out the whole close timeout (10 s), which every program whose server
/// closes without reading to the end paid (qperf's `tcp_bw` through a preload).
#[test]
fn rclose_stops_waiting_for_buffered_sends_when_the_peer_disconnects() {
    let _one = common::serial();
    let a = api();
    let port = common::port(13);
    let l = listener(port);
    let (c, s) = pair(l, port);
    // SAFETY: C calls with live arguments throughout.
    unsafe {
        assert_eq!((a.rfcntl)(c, libc::F_SETFL, libc::O_NONBLOCK), 0);
        let buf = vec![7u8; 65536];
        let mut total = 0usize;
        loop {
            let n = (a.rsend)(c, buf.as_ptr().cast(), buf.len(), 0);
            if n < 0 {
                assert_eq!(errno(), libc::EAGAIN, "rsend");
                break;
            }
            total += n as usize;
            assert!(total < 1 << 30, "the peer never stopped taking bytes");
        }
        assert_eq!((a.rfcntl)(c, libc::F_SETFL, 0), 0);
        // The peer closes, unread, while this side waits in its close.
        let peer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            // s is the accepted rsocket, used by this thread alone from now on.
            (api().rclose)(s)
        });
        let t0 = Instant::now();
        assert_eq!((a.rclose)(c), 0, "rclose: errno {}", errno());
        let took = t0.elapsed();
        assert_eq!(peer.join().expect("the peer's close"), 0);
        assert!(
            took < Duration::from_secs(5),
            "rclose waited {took:?} after the peer disconnected (the close timeout is 10 s)"
        );
        assert_eq!((a.rclose)(l), 0);
    }
}
