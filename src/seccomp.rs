//! drivelet's own seccomp filter: the system calls the agent and the tools it runs
//! make, and no other.
//!
//! drivelet's container must be privileged (Bidirectional mount propagation and every
//! block device of the node, hot-plugged ones too), and container runtimes apply no
//! seccomp profile to a privileged container whatever its `seccompProfile` says
//! (containerd and CRI-O both skip it; measured on containerd 1.6.20: `Seccomp: 0` in
//! the process's `/proc/PID/status` with `RuntimeDefault` set). So the agent installs
//! its filter itself, first thing in `drivelet run`, before any thread or child
//! exists; the tools it runs (mkfs, e2fsck, resize2fs, xfs_growfs, blkid, smartctl,
//! udevadm, losetup, unshare, sh) inherit it, so they are in the list as well.
//!
//! The rules:
//! - a call of another architecture's ABI (x32 on x86_64, or any arch but the one
//!   drivelet was built for) kills the process: nothing of drivelet makes one;
//! - a call in [`ALLOWED`] is allowed; the list is what the agent and its tools were
//!   traced making (`strace -f` of the agent through the integration tier and the
//!   end-to-end suite, see deploy/README.md), plus the new mount API and `openat2` that
//!   race-free path handling uses;
//! - any other call fails with `EPERM` in [`SeccompMode::Enforce`] (and the kernel logs
//!   it, `audit: type=1326 ... syscall=N`, in the node's kernel log), or is allowed and
//!   logged in [`SeccompMode::Log`] (for finding what a new kernel or tool version
//!   needs). What that keeps from a compromised agent: loading kernel code
//!   (`init_module`, `finit_module`, `kexec_load`, `bpf`), reading other processes
//!   (`ptrace`, `process_vm_readv`), opening files by handle past any mount
//!   (`open_by_handle_at`), joining other namespaces (`setns`), the kernel keyring,
//!   swap, reboot, clocks, `perf_event_open`, `userfaultfd`, `io_uring`.
//!
//! Arguments are not inspected (ioctl numbers, mount flags): the list narrows which
//! kernel interfaces are reachable, not how drivelet uses the ones it needs. One
//! exception: `mknodat` is allowed for block device nodes only (its mode argument says
//! `S_IFBLK`), which drivelet makes in its private directory to write a disk where
//! udev's watch does not see it (`disk::writer`); the privileged container has every
//! block device of the node in `/dev` already, so this opens nothing new, and a
//! character device (memory, terminals) or a FIFO cannot be made.

use thiserror::Error;

/// What the filter does with a call that is not in [`ALLOWED`] (`[security] seccomp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SeccompMode {
    /// It fails with `EPERM`, and the kernel logs it.
    Enforce,
    /// It runs, and the kernel logs it: to learn what is missing from the list.
    Log,
    /// No filter.
    Off,
}

impl SeccompMode {
    /// Its name in the configuration file.
    pub fn as_str(self) -> &'static str {
        match self {
            SeccompMode::Enforce => "enforce",
            SeccompMode::Log => "log",
            SeccompMode::Off => "off",
        }
    }
}

/// Installing the filter failed.
#[derive(Debug, Error)]
pub enum SeccompError {
    /// `prctl(PR_SET_NO_NEW_PRIVS)` failed.
    #[error("cannot set no_new_privs: {0}")]
    NoNewPrivs(std::io::Error),
    /// `seccomp(SECCOMP_SET_MODE_FILTER)` refused the filter.
    #[error("cannot install the seccomp filter ({syscalls} system calls allowed): {source}")]
    Install {
        /// How many calls the filter allows.
        syscalls: usize,
        /// The kernel's answer.
        source: std::io::Error,
    },
}

macro_rules! syscalls {
    ($($name:ident),* $(,)?) => {
        &[$((stringify!($name), libc::$name as i64)),*]
    };
}

/// The calls drivelet and its tools make, by name (without `SYS_`) and number, on every
/// architecture drivelet is built for.
const COMMON: &[(&str, i64)] = syscalls!(
    // Memory, threads, signals: the Rust runtime, tokio, glibc.
    SYS_brk, SYS_mmap, SYS_munmap, SYS_mremap, SYS_mprotect, SYS_madvise, SYS_membarrier,
    SYS_clone, SYS_clone3, SYS_set_tid_address, SYS_set_robust_list, SYS_get_robust_list,
    SYS_rseq, SYS_restart_syscall, SYS_futex, SYS_sched_yield, SYS_sched_getaffinity,
    SYS_getpid, SYS_getppid, SYS_gettid, SYS_getpgid, SYS_setpgid, SYS_getsid, SYS_setsid,
    SYS_getuid, SYS_geteuid, SYS_getgid, SYS_getegid, SYS_getgroups, SYS_getresuid, SYS_getresgid,
    SYS_capget, SYS_prctl, SYS_prlimit64, SYS_getrlimit, SYS_setrlimit, SYS_getrusage, SYS_uname, SYS_sysinfo,
    SYS_getcpu, SYS_getrandom, SYS_umask,
    SYS_rt_sigaction, SYS_rt_sigprocmask, SYS_rt_sigreturn, SYS_rt_sigtimedwait, SYS_rt_sigsuspend,
    SYS_sigaltstack, SYS_kill, SYS_tgkill, SYS_tkill,
    SYS_execve, SYS_exit, SYS_exit_group, SYS_wait4, SYS_waitid,
    SYS_pidfd_open, SYS_pidfd_send_signal,
    SYS_clock_gettime, SYS_clock_getres, SYS_clock_nanosleep, SYS_nanosleep, SYS_gettimeofday,
    SYS_times, SYS_timerfd_create, SYS_timerfd_settime, SYS_timerfd_gettime,
    // Files and directories: the store, the state dir, sysfs, udev's database, /dev.
    SYS_openat, SYS_openat2, SYS_close, SYS_close_range, SYS_read, SYS_write, SYS_pread64, SYS_pwrite64,
    SYS_readv, SYS_writev, SYS_preadv, SYS_pwritev, SYS_preadv2, SYS_pwritev2, SYS_lseek,
    SYS_fstat, SYS_newfstatat, SYS_statx, SYS_statfs, SYS_fstatfs, SYS_faccessat, SYS_faccessat2,
    SYS_getdents64, SYS_getcwd, SYS_chdir, SYS_fchdir, SYS_readlinkat,
    SYS_mkdirat, SYS_unlinkat, SYS_renameat, SYS_renameat2, SYS_linkat, SYS_symlinkat,
    SYS_fchmod, SYS_fchmodat, SYS_fchown, SYS_fchownat, SYS_utimensat, SYS_ftruncate, SYS_truncate,
    SYS_fallocate, SYS_fadvise64, SYS_fsync, SYS_fdatasync, SYS_sync, SYS_syncfs, SYS_sync_file_range,
    SYS_flock, SYS_fcntl, SYS_dup, SYS_dup3, SYS_pipe2, SYS_ioctl, SYS_copy_file_range,
    SYS_getxattr, SYS_lgetxattr, SYS_fgetxattr, SYS_listxattr, SYS_flistxattr, SYS_llistxattr,
    // A copy into an encrypted volume (`cp -a`) keeps extended attributes and ACLs.
    SYS_setxattr, SYS_lsetxattr, SYS_fsetxattr,
    SYS_inotify_init1, SYS_inotify_add_watch, SYS_inotify_rm_watch,
    // Event loops: tokio, udevadm settle.
    SYS_epoll_create1, SYS_epoll_ctl, SYS_epoll_pwait, SYS_epoll_pwait2, SYS_eventfd2,
    SYS_ppoll, SYS_pselect6, SYS_signalfd4,
    // Sockets: the CSI, admin and registration sockets, the API server, the probes'
    // HTTP port, udev's netlink monitor.
    SYS_socket, SYS_socketpair, SYS_bind, SYS_listen, SYS_accept4, SYS_connect,
    SYS_getsockname, SYS_getpeername, SYS_setsockopt, SYS_getsockopt, SYS_shutdown,
    SYS_sendto, SYS_recvfrom, SYS_sendmsg, SYS_recvmsg, SYS_sendmmsg, SYS_recvmmsg,
    // Mounts: staging, publishing, read-only remounts, snapshot and clone copies in a
    // private namespace (`unshare --mount`), and the new mount API.
    SYS_mount, SYS_umount2, SYS_unshare, SYS_open_tree, SYS_move_mount, SYS_mount_setattr,
    SYS_fsopen, SYS_fsconfig, SYS_fsmount, SYS_fspick,
    // Block I/O: O_DIRECT reads of drives, aio of the xfs tools.
    SYS_io_setup, SYS_io_destroy, SYS_io_submit, SYS_io_getevents,
    SYS_ioprio_get, SYS_ioprio_set,
);

/// The same for calls x86_64 has and newer architectures left out.
#[cfg(target_arch = "x86_64")]
const ARCH: &[(&str, i64)] = syscalls!(
    SYS_arch_prctl, SYS_open, SYS_stat, SYS_lstat, SYS_access, SYS_readlink, SYS_pipe, SYS_poll,
    SYS_select, SYS_dup2, SYS_fork, SYS_vfork, SYS_mkdir, SYS_rmdir, SYS_unlink, SYS_rename,
    SYS_chmod, SYS_chown, SYS_lchown, SYS_getdents, SYS_epoll_wait, SYS_epoll_create,
    SYS_eventfd, SYS_getpgrp, SYS_alarm, SYS_time, SYS_symlink, SYS_link, SYS_creat,
    SYS_utimes,
);
#[cfg(not(target_arch = "x86_64"))]
const ARCH: &[(&str, i64)] = &[];

/// Every allowed call: [`COMMON`] and the architecture's own.
pub const ALLOWED: &[&[(&str, i64)]] = &[COMMON, ARCH];

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7; // AUDIT_ARCH_AARCH64

/// x32 system calls are x86_64's numbers with this bit set.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

const BPF_LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const BPF_JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const BPF_JGE_K: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const BPF_RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
const BPF_AND_K: u16 = (libc::BPF_ALU | libc::BPF_AND | libc::BPF_K) as u16;
/// `offsetof(struct seccomp_data, nr)` and `arch`.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;
/// The low 32 bits of `mknodat`'s third argument, its mode (`args[2]`, little-endian).
const DATA_MKNODAT_MODE: u32 = 16 + 2 * 8;

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt: 0, jf: 0, k }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The allowed numbers, sorted, without repeats.
pub fn allowed_numbers() -> Vec<u32> {
    let mut nrs: Vec<u32> = ALLOWED.iter().flat_map(|l| l.iter()).map(|&(_, nr)| nr as u32).collect();
    nrs.sort_unstable();
    nrs.dedup();
    nrs
}

/// The filter program for `mode` (not [`SeccompMode::Off`]): check the architecture,
/// refuse x32, allow each listed number and `mknodat` of a block device node, and
/// otherwise the mode's action.
pub fn program(mode: SeccompMode) -> Vec<libc::sock_filter> {
    let nrs = allowed_numbers();
    let other = match mode {
        SeccompMode::Log => libc::SECCOMP_RET_LOG,
        _ => libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
    };
    // A conditional jump reaches at most 255 instructions ahead: one comparison per
    // number, then the two returns.
    assert!(nrs.len() < 250, "too many system calls for one run of comparisons");
    let n = nrs.len() as u8;
    // After the n comparisons: the mknodat check (4 instructions), "other", "allow".
    let mut p = vec![
        stmt(BPF_LD_W_ABS, DATA_ARCH),
        jump(BPF_JEQ_K, AUDIT_ARCH, 1, 0),
        stmt(BPF_RET_K, libc::SECCOMP_RET_KILL_PROCESS),
        stmt(BPF_LD_W_ABS, DATA_NR),
    ];
    if cfg!(target_arch = "x86_64") {
        // To the "other" return, past the n comparisons and the mknodat check.
        p.push(jump(BPF_JGE_K, X32_SYSCALL_BIT, n + 4, 0));
    }
    for (i, &nr) in nrs.iter().enumerate() {
        // Past the comparisons left, the mknodat check and the "other" return, to "allow".
        p.push(jump(BPF_JEQ_K, nr, n + 4 - i as u8, 0));
    }
    p.push(jump(BPF_JEQ_K, libc::SYS_mknodat as u32, 0, 3));
    p.push(stmt(BPF_LD_W_ABS, DATA_MKNODAT_MODE));
    p.push(stmt(BPF_AND_K, libc::S_IFMT));
    p.push(jump(BPF_JEQ_K, libc::S_IFBLK, 1, 0));
    p.push(stmt(BPF_RET_K, other));
    p.push(stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW));
    p
}

/// Installs the filter on every thread of this process and on all its future children
/// (it cannot be removed). Sets `no_new_privs`, which an unprivileged process needs to
/// install a filter and which changes nothing for root.
pub fn install(mode: SeccompMode) -> Result<(), SeccompError> {
    if mode == SeccompMode::Off {
        return Ok(());
    }
    let prog = program(mode);
    // SAFETY: plain prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(SeccompError::NoNewPrivs(std::io::Error::last_os_error()));
    }
    let fprog = libc::sock_fprog { len: prog.len() as u16, filter: prog.as_ptr() as *mut libc::sock_filter };
    let flags = libc::SECCOMP_FILTER_FLAG_TSYNC | libc::SECCOMP_FILTER_FLAG_LOG;
    // SAFETY: `fprog` points at `prog`, which outlives the call; the kernel copies it.
    let rc = unsafe { libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, flags, &fprog as *const libc::sock_fprog) };
    match rc {
        0 => Ok(()),
        // TSYNC: the id of a thread that could not be synchronised.
        r if r > 0 => Err(SeccompError::Install {
            syscalls: allowed_numbers().len(),
            source: std::io::Error::other(format!("thread {r} could not take the filter")),
        }),
        _ => Err(SeccompError::Install { syscalls: allowed_numbers().len(), source: std::io::Error::last_os_error() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_allowed_name_is_listed_once() {
        let mut names: Vec<&str> = ALLOWED.iter().flat_map(|l| l.iter()).map(|&(n, _)| n).collect();
        let all = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all, "a system call listed twice");
    }

    #[test]
    fn calls_that_would_let_a_compromised_agent_take_the_host_are_not_allowed() {
        let nrs = allowed_numbers();
        for (name, nr) in [
            ("init_module", libc::SYS_init_module),
            ("finit_module", libc::SYS_finit_module),
            ("delete_module", libc::SYS_delete_module),
            ("kexec_load", libc::SYS_kexec_load),
            ("kexec_file_load", libc::SYS_kexec_file_load),
            ("bpf", libc::SYS_bpf),
            ("ptrace", libc::SYS_ptrace),
            ("process_vm_readv", libc::SYS_process_vm_readv),
            ("process_vm_writev", libc::SYS_process_vm_writev),
            ("open_by_handle_at", libc::SYS_open_by_handle_at),
            ("setns", libc::SYS_setns),
            ("pivot_root", libc::SYS_pivot_root),
            ("chroot", libc::SYS_chroot),
            ("keyctl", libc::SYS_keyctl),
            ("add_key", libc::SYS_add_key),
            ("swapon", libc::SYS_swapon),
            ("reboot", libc::SYS_reboot),
            ("settimeofday", libc::SYS_settimeofday),
            ("clock_settime", libc::SYS_clock_settime),
            ("perf_event_open", libc::SYS_perf_event_open),
            ("userfaultfd", libc::SYS_userfaultfd),
            ("io_uring_setup", libc::SYS_io_uring_setup),
            ("acct", libc::SYS_acct),
            ("syslog", libc::SYS_syslog),
            ("mknodat", libc::SYS_mknodat),
            ("setuid", libc::SYS_setuid),
            ("capset", libc::SYS_capset),
        ] {
            assert!(!nrs.contains(&(nr as u32)), "{name} is allowed");
        }
    }

    #[test]
    fn the_new_mount_api_and_openat2_are_allowed() {
        let nrs = allowed_numbers();
        for nr in [
            libc::SYS_open_tree,
            libc::SYS_move_mount,
            libc::SYS_mount_setattr,
            libc::SYS_fsopen,
            libc::SYS_fsconfig,
            libc::SYS_fsmount,
            libc::SYS_openat2,
        ] {
            assert!(nrs.contains(&(nr as u32)));
        }
    }

    /// Runs the filter program over one call the way the kernel does: returns the
    /// action.
    fn run(prog: &[libc::sock_filter], arch: u32, nr: u32) -> u32 {
        run_with(prog, arch, nr, 0)
    }

    /// The same, for a call whose `args[2]` (a mode, for `mknodat`) is `mode`.
    fn run_with(prog: &[libc::sock_filter], arch: u32, nr: u32, mode: u32) -> u32 {
        let (mut acc, mut pc) = (0u32, 0usize);
        loop {
            let i = prog[pc];
            match i.code {
                BPF_LD_W_ABS => {
                    acc = match i.k {
                        DATA_ARCH => arch,
                        DATA_NR => nr,
                        DATA_MKNODAT_MODE => mode,
                        k => panic!("a load of offset {k}"),
                    }
                }
                BPF_AND_K => acc &= i.k,
                BPF_JEQ_K => pc += if acc == i.k { i.jt } else { i.jf } as usize,
                BPF_JGE_K => pc += if acc >= i.k { i.jt } else { i.jf } as usize,
                BPF_RET_K => return i.k,
                c => panic!("unexpected instruction {c:#x}"),
            }
            pc += 1;
        }
    }

    #[test]
    fn the_program_allows_exactly_the_list_and_refuses_the_rest_with_eperm() {
        let prog = program(SeccompMode::Enforce);
        let allowed = allowed_numbers();
        let eperm = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
        for nr in 0..600u32 {
            let want = if allowed.contains(&nr) { libc::SECCOMP_RET_ALLOW } else { eperm };
            assert_eq!(run(&prog, AUDIT_ARCH, nr), want, "system call {nr}");
        }
        assert_eq!(run(&prog, AUDIT_ARCH ^ 1, allowed[0]), libc::SECCOMP_RET_KILL_PROCESS, "another architecture");
        if cfg!(target_arch = "x86_64") {
            assert_eq!(run(&prog, AUDIT_ARCH, X32_SYSCALL_BIT | allowed[0]), eperm, "x32");
        }
        let log = program(SeccompMode::Log);
        assert_eq!(run(&log, AUDIT_ARCH, libc::SYS_init_module as u32), libc::SECCOMP_RET_LOG);
    }

    #[test]
    fn mknodat_makes_block_device_nodes_only() {
        let prog = program(SeccompMode::Enforce);
        let eperm = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
        let nr = libc::SYS_mknodat as u32;
        assert_eq!(run_with(&prog, AUDIT_ARCH, nr, libc::S_IFBLK | 0o600), libc::SECCOMP_RET_ALLOW);
        for (what, mode) in [("a character device", libc::S_IFCHR), ("a FIFO", libc::S_IFIFO), ("a file", libc::S_IFREG), ("a socket", libc::S_IFSOCK), ("no type", 0)] {
            assert_eq!(run_with(&prog, AUDIT_ARCH, nr, mode | 0o600), eperm, "{what}");
        }
        // The check reads the mode of mknodat alone: another call with such an argument is not let through.
        assert_eq!(run_with(&prog, AUDIT_ARCH, libc::SYS_init_module as u32, libc::S_IFBLK), eperm);
        if cfg!(target_arch = "x86_64") {
            assert_eq!(run_with(&prog, AUDIT_ARCH, X32_SYSCALL_BIT | nr, libc::S_IFBLK), eperm, "x32");
        }
        let log = program(SeccompMode::Log);
        assert_eq!(run_with(&log, AUDIT_ARCH, nr, libc::S_IFCHR), libc::SECCOMP_RET_LOG);
        assert_eq!(run_with(&log, AUDIT_ARCH, nr, libc::S_IFBLK), libc::SECCOMP_RET_ALLOW);
    }
}
