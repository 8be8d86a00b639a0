//! PID 1 of a container: the agent runs as its child, so that what the agent starts to
//! outlive it (a freeze's watchdog, `crate::disk::freeze`) is not killed with it. When
//! the init process of a PID namespace dies, the kernel kills every other process in
//! it; the guardian is that init process, and it does nothing that could make it die.
//!
//! Rules:
//! - only `drivelet run` started as PID 1 becomes a guardian; anywhere else (a host
//!   process, the demo, the tests) the agent runs itself;
//! - the guardian starts the same binary with the same arguments as its child (that
//!   child is not PID 1, so it runs the agent), forwards SIGTERM, SIGINT, SIGHUP and
//!   SIGQUIT to it, and reaps every process that ends under it (orphans included: the
//!   tools an agent killed mid-way left);
//! - when the agent ends, the guardian waits up to [`DRAIN`] for what is left (a
//!   watchdog thawing a filesystem ends at once), then exits as the agent did (its code,
//!   or 128 + the signal that killed it), so the kubelet restarts the container as before.

use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// How long the guardian waits, once the agent ended, for the processes left under it.
pub const DRAIN: Duration = Duration::from_secs(10);

/// The agent's pid, for the signal handler.
static AGENT: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: libc::c_int) {
    let pid = AGENT.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill(2) is async-signal-safe.
        unsafe { libc::kill(pid, sig) };
    }
}

/// Whether this process is the init process of its PID namespace.
pub fn is_init() -> bool {
    std::process::id() == 1
}

/// Runs the agent as a child of this PID 1 and exits as it did (see the rules).
pub fn supervise() -> ExitCode {
    use std::os::unix::process::CommandExt;
    let mut argv = std::env::args_os();
    let arg0 = argv.next().unwrap_or_else(|| "drivelet".into());
    let args: Vec<std::ffi::OsString> = argv.collect();
    // The same binary, arguments and name (its command line reads as PID 1's).
    let child = match Command::new("/proc/self/exe").arg0(&arg0).args(&args).spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("drivelet: cannot start the agent under its guardian (PID 1): {e}");
            return ExitCode::from(1);
        }
    };
    let agent = child.id() as i32;
    AGENT.store(agent, Ordering::Relaxed);
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT] {
        // SAFETY: the handler only reads an atomic and calls kill(2).
        unsafe { libc::signal(sig, forward as *const () as libc::sighandler_t) };
    }
    let mut ended: Option<u8> = None;
    let mut drain_until: Option<Instant> = None;
    loop {
        let flags = drain_until.map(|_| WaitPidFlag::WNOHANG);
        match waitpid(Pid::from_raw(-1), flags) {
            Ok(WaitStatus::Exited(pid, code)) if pid.as_raw() == agent => ended = Some(u8::try_from(code).unwrap_or(1)),
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid.as_raw() == agent => ended = Some(128u8.saturating_add(sig as u8)),
            Ok(WaitStatus::StillAlive) => {
                if drain_until.is_some_and(|d| Instant::now() >= d) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => {}
            // No child left.
            Err(_) => break,
        }
        if ended.is_some() && drain_until.is_none() {
            AGENT.store(0, Ordering::Relaxed);
            drain_until = Some(Instant::now() + DRAIN);
        }
    }
    ExitCode::from(ended.unwrap_or(1))
}
