//! The `drivelet` command line: thin dispatch to the library.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use drivelet::config::Config;

/// drivelet: turns this node's local drives into CSI volumes and watches over them.
///
/// Run one per node (a DaemonSet pod) as root. Configuration is a TOML file
/// (see config/drivelet.toml for every key) with DRIVELET__SECTION__KEY environment
/// overrides; the node name comes from NODE_NAME when not configured.
#[derive(Parser)]
#[command(name = "drivelet", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the agent: drive inventory, CSI socket, admin socket. Stops cleanly on
    /// SIGTERM or SIGINT.
    Run {
        /// Configuration file (TOML).
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Validate a configuration file and exit 0 (valid) or 1 (with the key to fix).
    CheckConfig {
        /// Configuration file (TOML).
        file: PathBuf,
    },
    /// Ask a running agent, over its admin socket.
    Ctl {
        /// Configuration file, to find the admin socket.
        #[arg(long, short, global = true)]
        config: Option<PathBuf>,
        /// Admin socket path (overrides the config).
        #[arg(long, global = true)]
        socket: Option<PathBuf>,
        #[command(subcommand)]
        cmd: CtlCmd,
    },
}

#[derive(Subcommand)]
enum CtlCmd {
    /// List every disk with its classification (managed, system, foreign, excluded)
    /// and the reason: the answer to "why is my disk not used?".
    Drives {
        /// Output format.
        #[arg(long, short, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
}

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
    let cfg = Config::load(Some(&config))?;
    drivelet::logging::init(&cfg.log);
    // Crash points for tests (`FAILPOINTS`); compiled out unless built with the
    // `failpoints` feature.
    let _crash_points = fail::FailScenario::setup();
    let system = actix_rt::System::with_tokio_rt(|| runtime().expect("tokio runtime"));
    system.block_on(drivelet::agent::run(cfg))?;
    Ok(())
}

fn ctl(config: Option<PathBuf>, socket: Option<PathBuf>, cmd: CtlCmd) -> anyhow::Result<()> {
    let socket = match socket {
        Some(s) => s,
        None => Config::load(config.as_deref())?.paths.admin_socket,
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    match cmd {
        CtlCmd::Drives { output } => {
            let drives = rt.block_on(drivelet::ctl::drives(&socket))?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&drives).context("encode")?),
                Output::Table => print!("{}", drivelet::ctl::drives_table(&drives)),
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Run { config } => run(config),
        Cmd::CheckConfig { file } => Config::load(Some(&file)).map(|c| {
            println!("{}: valid (node {}, driver {})", file.display(), c.driver.node_name, c.driver.name);
        }).map_err(Into::into),
        Cmd::Ctl { config, socket, cmd } => ctl(config, socket, cmd),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            fatal(&e);
            ExitCode::from(1)
        }
    }
}
