//! The `drivelet` command line: thin dispatch to the library. The arguments are
//! [`drivelet::cli::args`]; each subcommand's body is the `run` of its client in
//! `drivelet::cli`; here are only the agent's start (`run`) and the exit code.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use drivelet::cli::args::{Cli, Cmd, KubectlCli};
use drivelet::config::Config;

fn fatal(err: &anyhow::Error) {
    let msg = format!("drivelet: {err:#}");
    eprintln!("{msg}");
    // Kubernetes shows this file's content as the container's termination message.
    if std::path::Path::new("/dev/termination-log").exists() {
        let _ = std::fs::write("/dev/termination-log", &msg);
    }
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()
}

fn run(config: PathBuf) -> anyhow::Result<()> {
    // Before any other thread exists: freed memory goes back to the kernel.
    drivelet::agent::tune_allocator();
    let cfg = Config::load(Some(&config))?;
    drivelet::logging::init(&cfg.log);
    // Before the runtime's threads and any child: they all inherit it.
    drivelet::seccomp::install(cfg.security.seccomp)?;
    if cfg.security.seccomp != drivelet::seccomp::SeccompMode::Off {
        tracing::info!(seccomp = cfg.security.seccomp.as_str(), syscalls = drivelet::seccomp::allowed_numbers().len(), "seccomp filter installed");
    }
    // Staging and target paths are opened and mounted by descriptor: a kernel without
    // the calls for it is refused here, in words.
    drivelet::disk::beneath::check_kernel().map_err(anyhow::Error::msg)?;
    // Disks are written through nodes of drivelet's own, where udev's watch does not
    // see them (disk::writer); without this directory, through the disks' own nodes.
    let devices = cfg.paths.state_dir.join("devices");
    if let Err(e) = drivelet::disk::writer::init(&devices) {
        tracing::warn!(dir = %devices.display(), error = %e, "no private directory for device nodes; disks are written through their own nodes");
    }
    // Crash and fail points for tests (`FAILPOINTS`); compiled out unless built with
    // the `failpoints` feature.
    let _crash_points = drivelet::failpoint::from_env();
    let system = actix_rt::System::with_tokio_rt(|| runtime().expect("tokio runtime"));
    system.block_on(drivelet::agent::run(cfg))?;
    Ok(())
}

/// Whether the binary runs as the kubectl plugin (`kubectl-drivelet` on the PATH).
fn is_kubectl_plugin() -> bool {
    std::env::args_os()
        .next()
        .and_then(|a| std::path::Path::new(&a).file_name().map(|f| f.to_string_lossy().starts_with("kubectl-drivelet")))
        .unwrap_or(false)
}

fn main() -> ExitCode {
    if is_kubectl_plugin() {
        // SAFETY: sets a signal disposition before any thread is started.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
        return drivelet::cli::kubectl::run(KubectlCli::parse().args);
    }
    let cli = Cli::parse();
    if !matches!(cli.cmd, Cmd::Run { .. } | Cmd::Bench { .. }) {
        // A command that prints for people ends quietly when its reader goes away
        // (`drivelet csi list | head`), as other Unix tools do, instead of failing on
        // the broken pipe. The agent and the benches keep SIGPIPE ignored.
        // SAFETY: sets a signal disposition before any thread is started.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let res = match cli.cmd {
        // In a container drivelet is started as PID 1: it stays there as the agent's
        // guardian, so the agent's freeze watchdogs outlive the agent (drivelet::guardian).
        Cmd::Run { .. } if drivelet::guardian::is_init() => return drivelet::guardian::supervise(),
        Cmd::Run { config } => run(config),
        Cmd::FreezeWatch { fd, limit_ms } => {
            let code = drivelet::disk::freeze::watch(fd, std::time::Duration::from_millis(limit_ms));
            return ExitCode::from(u8::try_from(code).unwrap_or(1));
        }
        Cmd::CheckConfig { file } => Config::load(Some(&file)).map(|c| {
            println!("{}: valid (node {}, driver {})", file.display(), c.driver.node_name, c.driver.name);
        }).map_err(Into::into),
        Cmd::Kubectl(args) => return drivelet::cli::kubectl::run(args),
        Cmd::Ctl { config, socket, cmd } => drivelet::cli::ctl::run(config, socket, cmd).map_err(Into::into),
        Cmd::Csi { config, endpoint, output, cmd } => drivelet::cli::csi::run(config, endpoint, output, cmd).map_err(Into::into),
        Cmd::Bench { mode } => drivelet::cli::bench::run(mode).map_err(Into::into),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            fatal(&e);
            ExitCode::from(1)
        }
    }
}
