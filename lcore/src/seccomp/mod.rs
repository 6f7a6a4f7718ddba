//! Proving "no syscalls on the fast path": a per-thread seccomp trap filter and a child-process
//! test harness.
//!
//! Linux on x86_64 and aarch64 only. Used by this crate's tests and by the dataplane crate's.
//!
//! # How it works
//!
//! [`install_trap_filter`] installs, on the **calling thread only** (no `TSYNC`), a classic-BPF
//! seccomp filter that
//!
//! 1. kills the process if the syscall's architecture is not the build's (x32 and compat calls
//!    included),
//! 2. allows `rt_sigreturn` (needed to return from the SIGSYS handler),
//! 3. returns `SECCOMP_RET_TRAP` for every other syscall.
//!
//! A trapped syscall is not executed. The kernel raises SIGSYS on the thread; the handler, which
//! [`install_sigsys_handler`] installs process-wide beforehand, records the syscall number in a
//! static table ([`trapped_syscalls`], [`trapped_count`]) and makes the syscall return
//! `-ENOSYS`. The handler only does atomic stores into statics: no allocation, no locks.
//!
//! # A filtered thread can never leave
//!
//! After the filter is installed the thread cannot make another syscall, including the `munmap`
//! and `exit` that ending a thread needs, so it must finish its measured work and then
//! [`park_forever`]. Run such tests in a child process with [`run_in_child`]: the test body runs
//! in a re-executed copy of the test binary, whose unfiltered test thread reports the result and
//! ends the whole process with `exit_group` (via [`std::process::exit`]), which also ends the
//! parked thread.
//!
//! ```no_run
//! use lcore::seccomp;
//!
//! #[test]
//! fn my_fast_path_makes_no_syscalls() {
//!     let report = seccomp::run_in_child("my_fast_path_makes_no_syscalls", || {
//!         // Runs only in the child: spawn a thread that warms up, calls
//!         // seccomp::install_trap_filter(), runs the fast path, publishes its results
//!         // through atomics and then calls seccomp::park_forever().
//!         Ok("did 100000 iterations".to_owned())
//!     })
//!     .expect("child ran");
//!     report.assert_ok_without_syscalls();
//! }
//! ```

mod child;

pub use child::{CHILD_ENV, CHILD_TIMEOUT, ChildError, ChildReport, is_child, run_in_child};

use std::io;
use std::sync::Once;
use std::sync::atomic::{AtomicI32, AtomicI64, AtomicUsize, Ordering};

/// Number of trapped syscall numbers kept; later ones are only counted.
pub const MAX_RECORDED: usize = 64;

static TRAP_COUNT: AtomicUsize = AtomicUsize::new(0);
#[allow(clippy::declare_interior_mutable_const)]
const UNSET: AtomicI64 = AtomicI64::new(-1);
static TRAPPED: [AtomicI64; MAX_RECORDED] = [UNSET; MAX_RECORDED];

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E; // AUDIT_ARCH_X86_64 = EM_X86_64 | __AUDIT_ARCH_64BIT | LE
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7; // AUDIT_ARCH_AARCH64 = EM_AARCH64 | __AUDIT_ARCH_64BIT | LE

/// `SIGSYS` `siginfo_t` layout on 64-bit Linux (`_sigsys` member of the union), which the libc
/// crate does not expose for glibc targets.
#[repr(C)]
struct SigsysInfo {
    si_signo: libc::c_int,
    si_errno: libc::c_int,
    si_code: libc::c_int,
    _pad: libc::c_int,
    call_addr: *mut libc::c_void,
    syscall: libc::c_int,
    arch: libc::c_uint,
}

const _: () = assert!(core::mem::offset_of!(SigsysInfo, call_addr) == 16);
const _: () = assert!(core::mem::offset_of!(SigsysInfo, syscall) == 24);
const _: () = assert!(size_of::<SigsysInfo>() <= size_of::<libc::siginfo_t>());

extern "C" fn on_sigsys(_sig: libc::c_int, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo_t for SIGSYS, whose `_sigsys` member has the
    // layout of `SigsysInfo` on 64-bit Linux (checked by the asserts above).
    let nr = unsafe { (*info.cast::<SigsysInfo>()).syscall };
    // Relaxed: the claim index only needs to be unique; the recorded numbers are read after the
    // test's own Release/Acquire hand-off from the filtered thread (see `trapped_syscalls`).
    let idx = TRAP_COUNT.fetch_add(1, Ordering::Relaxed);
    if idx < MAX_RECORDED {
        // Relaxed: as above.
        TRAPPED[idx].store(i64::from(nr), Ordering::Relaxed);
    }
    // Make the trapped syscall return -ENOSYS instead of its own number.
    // SAFETY: with SA_SIGINFO the third argument is the interrupted thread's ucontext_t, which
    // the kernel restores on rt_sigreturn; writing the return register changes the syscall's
    // apparent result and nothing else.
    unsafe {
        let uc = uctx.cast::<libc::ucontext_t>();
        #[cfg(target_arch = "x86_64")]
        {
            (*uc).uc_mcontext.gregs[libc::REG_RAX as usize] = -i64::from(libc::ENOSYS);
        }
        #[cfg(target_arch = "aarch64")]
        {
            (*uc).uc_mcontext.regs[0] = (-i64::from(libc::ENOSYS)) as u64;
        }
    }
}

static HANDLER: Once = Once::new();
static HANDLER_ERRNO: AtomicI32 = AtomicI32::new(0);

/// Installs the process-wide SIGSYS handler that records trapped syscalls (idempotent).
///
/// # Errors
///
/// The OS error of `sigaction`.
pub fn install_sigsys_handler() -> io::Result<()> {
    HANDLER.call_once(|| {
        let mut errno = 0;
        // SAFETY: all-zero is a valid sigaction; the fields we need are set below.
        let mut act: libc::sigaction = unsafe { core::mem::zeroed() };
        act.sa_sigaction = on_sigsys
            as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
            as libc::sighandler_t;
        act.sa_flags = libc::SA_SIGINFO;
        // SAFETY: `act.sa_mask` is a valid sigset_t to initialise.
        unsafe { libc::sigemptyset(&mut act.sa_mask) };
        // SAFETY: `act` is a valid sigaction whose handler only touches statics atomically.
        if unsafe { libc::sigaction(libc::SIGSYS, &act, core::ptr::null_mut()) } != 0 {
            errno = io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EINVAL);
        }
        // Relaxed: `call_once` orders this store before every return from `call_once`.
        HANDLER_ERRNO.store(errno, Ordering::Relaxed);
    });
    // Relaxed: ordered by `call_once`, see above.
    let result = HANDLER_ERRNO.load(Ordering::Relaxed);
    if result != 0 {
        Err(io::Error::from_raw_os_error(result))
    } else {
        Ok(())
    }
}

const fn stmt(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

const fn jump(code: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// Offsets in `struct seccomp_data`.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;

/// The filter program; see the [module docs](self).
fn program() -> [libc::sock_filter; 7] {
    use libc::{BPF_ABS, BPF_JEQ, BPF_JMP, BPF_K, BPF_LD, BPF_RET, BPF_W};
    [
        stmt(BPF_LD | BPF_W | BPF_ABS, DATA_ARCH),
        jump(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH, 1, 0),
        stmt(BPF_RET | BPF_K, libc::SECCOMP_RET_KILL_PROCESS),
        stmt(BPF_LD | BPF_W | BPF_ABS, DATA_NR),
        jump(
            BPF_JMP | BPF_JEQ | BPF_K,
            libc::SYS_rt_sigreturn as u32,
            0,
            1,
        ),
        stmt(BPF_RET | BPF_K, libc::SECCOMP_RET_ALLOW),
        stmt(BPF_RET | BPF_K, libc::SECCOMP_RET_TRAP),
    ]
}

/// Installs the trap filter on the calling thread (after the SIGSYS handler). From the moment
/// this returns `Ok`, every syscall of this thread except `rt_sigreturn` fails with `ENOSYS`
/// and is recorded; the thread must end in [`park_forever`].
///
/// # Errors
///
/// The OS error of `sigaction`, `prctl(PR_SET_NO_NEW_PRIVS)` or `seccomp(2)`; the thread is
/// unfiltered if this fails.
pub fn install_trap_filter() -> io::Result<()> {
    install_sigsys_handler()?;
    let filter = program();
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr().cast_mut(),
    };
    // SAFETY: PR_SET_NO_NEW_PRIVS takes an integer flag and no pointers.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `prog` points at a valid filter array that outlives the call (the kernel copies
    // it); flags 0 means no TSYNC, so only this thread is filtered.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0 as libc::c_uint,
            &prog as *const libc::sock_fprog,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Number of syscalls trapped so far in this process.
pub fn trapped_count() -> usize {
    // Relaxed: see `on_sigsys`; callers order this after the filtered work themselves.
    TRAP_COUNT.load(Ordering::Relaxed)
}

/// The first [`MAX_RECORDED`] trapped syscall numbers.
///
/// Call it after the filtered thread has handed its results over with a Release store that
/// the caller read with Acquire: the handler runs synchronously on that thread before its
/// hand-off, which orders the recorded numbers before this read.
pub fn trapped_syscalls() -> Vec<i64> {
    let n = trapped_count().min(MAX_RECORDED);
    // Relaxed: ordered by the caller's hand-off, see above.
    TRAPPED[..n]
        .iter()
        .map(|a| a.load(Ordering::Relaxed))
        .collect()
}

/// Spins forever without making a syscall; the only way a filtered thread can end its work.
/// The process ends it with `exit_group` from an unfiltered thread.
pub fn park_forever() -> ! {
    loop {
        core::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_shape() {
        let p = program();
        assert_eq!(p.len(), 7);
        assert_eq!(p[1].k, AUDIT_ARCH);
        assert_eq!(p[4].k, libc::SYS_rt_sigreturn as u32);
        assert_eq!(p[6].k, libc::SECCOMP_RET_TRAP);
    }
}
