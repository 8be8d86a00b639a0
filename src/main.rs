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
    /// The kubectl plugin (`kubectl drivelet ...` when installed as kubectl-drivelet):
    /// drives and volumes across the cluster, drive actions.
    Kubectl(KubectlArgs),
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
    /// A CSI client for any CSI endpoint (this driver's or another's): run a volume
    /// lifecycle by hand. Example:
    /// `drivelet csi -c config/demo.toml create pvc-1 --size 1Gi`, then `stage`,
    /// `publish`, `unpublish`, `unstage`, `delete`.
    Csi {
        /// Configuration file, to find the CSI socket.
        #[arg(long, short, global = true)]
        config: Option<PathBuf>,
        /// CSI socket path (overrides the config).
        #[arg(long, global = true)]
        endpoint: Option<PathBuf>,
        /// Output format.
        #[arg(long, short, value_enum, default_value_t = Output::Table, global = true)]
        output: Output,
        #[command(subcommand)]
        cmd: CsiCmd,
    },
    /// A CSI load generator for any CSI endpoint (this driver's or another's): cheap
    /// RPCs (`rpc`) or whole volume lifecycles (`lifecycle`), with throughput, latency
    /// percentiles and errors by code. Several `--endpoint LABEL=PATH` are measured one
    /// after another and reported side by side. Example:
    /// `drivelet bench rpc --endpoint drivelet=/tmp/drivelet-demo/csi.sock --duration 5s`.
    Bench {
        #[command(subcommand)]
        mode: BenchMode,
    },
}

/// Settings of both bench modes.
#[derive(clap::Args)]
struct BenchArgs {
    /// CSI socket to measure, as PATH or LABEL=PATH (repeatable: endpoints run one
    /// after another, never at once, and are reported side by side).
    #[arg(long = "endpoint", required = true)]
    endpoints: Vec<String>,
    /// Concurrent callers.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// One connection per caller, or one shared channel (HTTP/2 multiplexing).
    #[arg(long, value_enum, default_value_t = drivelet::cli::bench::Connections::PerCaller)]
    connections: drivelet::cli::bench::Connections,
    /// Time limit of each call, e.g. 30s (running out counts as DEADLINE_EXCEEDED).
    #[arg(long, default_value = "60s")]
    timeout: String,
    /// Worker threads of the load generator (it shares the machine with the driver).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Output format.
    #[arg(long, short, value_enum, default_value_t = Output::Table)]
    output: Output,
}

#[derive(Subcommand)]
enum BenchMode {
    /// N callers call each cheap RPC back to back for --duration (one phase per RPC):
    /// GetPluginInfo (the no-op baseline), Probe, NodeGetInfo, NodeGetCapabilities,
    /// GetCapacity, ListVolumes (first page).
    Rpc {
        #[command(flatten)]
        args: BenchArgs,
        /// How long each RPC is called, e.g. 5s.
        #[arg(long, default_value = "5s")]
        duration: String,
        /// Only these RPCs (repeatable; default: all four).
        #[arg(long = "rpc", value_enum)]
        rpcs: Vec<drivelet::cli::bench::Rpc>,
        /// max_entries of ListVolumes.
        #[arg(long, default_value_t = 100)]
        page_size: i32,
    },
    /// N workers run whole volume lifecycles: create, (controller publish,) stage,
    /// publish, write and read a small file through the target path, unpublish,
    /// unstage, (controller unpublish,) delete. Failed lifecycles are cleaned up.
    Lifecycle {
        #[command(flatten)]
        args: BenchArgs,
        /// Lifecycles per endpoint (default: as many as fit in --duration).
        #[arg(long)]
        count: Option<u64>,
        /// Time limit when no --count is given, e.g. 30s.
        #[arg(long, default_value = "30s")]
        duration: String,
        /// Volume size, e.g. 64Mi (0: the driver's default).
        #[arg(long, default_value = "64Mi")]
        size: String,
        /// Filesystem, e.g. ext4 or xfs (default: the driver's).
        #[arg(long, default_value = "")]
        fs: String,
        /// Block volumes instead of filesystems.
        #[arg(long)]
        block: bool,
        /// StorageClass parameter key=value (repeatable), e.g. --param media=ssd.
        #[arg(long = "param")]
        params: Vec<String>,
        /// Staging paths go under this directory; it must lie under the driver's
        /// allowed roots (drivelet: volumes.allowed_roots).
        #[arg(long)]
        staging_dir: PathBuf,
        /// Target paths go under this directory (same rule as --staging-dir).
        #[arg(long)]
        target_dir: PathBuf,
    },
}

/// How a volume is accessed, for `drivelet csi` commands.
#[derive(clap::Args, Clone, Default)]
struct AccessArgs {
    /// Block access (the raw partition) instead of a filesystem.
    #[arg(long)]
    block: bool,
    /// Filesystem for mount access: ext4 or xfs (default: the driver's).
    #[arg(long, default_value = "")]
    fs: String,
    /// Mount flag (repeatable), e.g. --mount-flag noatime.
    #[arg(long = "mount-flag")]
    mount_flags: Vec<String>,
    /// Access mode: single-node-writer, single-node-reader-only,
    /// single-node-single-writer, single-node-multi-writer.
    #[arg(long, default_value = "single-node-writer")]
    mode: String,
}

impl AccessArgs {
    fn access(&self) -> drivelet::cli::csi::Access {
        drivelet::cli::csi::Access {
            block: self.block,
            fs_type: self.fs.clone(),
            mount_flags: self.mount_flags.clone(),
            mode: self.mode.clone(),
        }
    }
}

#[derive(Subcommand)]
enum CsiCmd {
    /// Plugin info, capabilities, readiness, node id and topology.
    Info,
    /// CreateVolume NAME.
    Create {
        /// Volume name (idempotency key).
        name: String,
        /// Required size, e.g. 1Gi (0: the driver's default).
        #[arg(long, default_value = "0")]
        size: String,
        /// Size limit, e.g. 2Gi (0: none).
        #[arg(long, default_value = "0")]
        limit: String,
        /// StorageClass parameter key=value (repeatable), e.g. --param media=ssd.
        #[arg(long = "param")]
        params: Vec<String>,
        /// Clone this volume (its id): the new volume starts with a copy of its data.
        #[arg(long)]
        source: Option<String>,
        #[command(flatten)]
        access: AccessArgs,
    },
    /// DeleteVolume ID.
    Delete {
        /// Volume id.
        id: String,
    },
    /// ControllerGetVolume ID: the volume, where it is published and its condition.
    Get {
        /// Volume id.
        id: String,
    },
    /// ListVolumes, every page: each volume with its published nodes and condition.
    List,
    /// ValidateVolumeCapabilities ID.
    Validate {
        /// Volume id.
        id: String,
        #[command(flatten)]
        access: AccessArgs,
    },
    /// GetCapacity.
    Capacity {
        /// StorageClass parameter key=value (repeatable).
        #[arg(long = "param")]
        params: Vec<String>,
    },
    /// NodeStageVolume ID --staging PATH.
    Stage {
        /// Volume id.
        id: String,
        /// Staging path.
        #[arg(long)]
        staging: PathBuf,
        #[command(flatten)]
        access: AccessArgs,
    },
    /// NodeUnstageVolume ID --staging PATH.
    Unstage {
        /// Volume id.
        id: String,
        /// Staging path.
        #[arg(long)]
        staging: PathBuf,
    },
    /// NodePublishVolume ID --staging PATH --target PATH.
    Publish {
        /// Volume id.
        id: String,
        /// Staging path.
        #[arg(long)]
        staging: PathBuf,
        /// Target path.
        #[arg(long)]
        target: PathBuf,
        /// Publish read-only.
        #[arg(long)]
        readonly: bool,
        #[command(flatten)]
        access: AccessArgs,
    },
    /// NodeUnpublishVolume ID --target PATH.
    Unpublish {
        /// Volume id.
        id: String,
        /// Target path.
        #[arg(long)]
        target: PathBuf,
    },
    /// ControllerExpandVolume ID --size SIZE: grow the volume.
    Expand {
        /// Volume id.
        id: String,
        /// New size, e.g. 2Gi.
        #[arg(long)]
        size: String,
    },
    /// NodeExpandVolume ID --path PATH: grow its filesystem (staging or target path).
    NodeExpand {
        /// Volume id.
        id: String,
        /// The volume's staging or target path.
        #[arg(long)]
        path: PathBuf,
    },
    /// NodeGetVolumeStats ID --path PATH: usage in bytes and inodes, and the condition.
    Stats {
        /// Volume id.
        id: String,
        /// A path of the volume: its staging or a target path, or (block) a device node of it.
        #[arg(long)]
        path: PathBuf,
    },
    /// CSI v1.13 volume health: of ID (ControllerGetVolumeHealth, or with --node
    /// NodeGetVolumeHealth), or without ID every volume with an adverse condition
    /// (ControllerListVolumeHealth); each condition with its status, reason and message.
    Health {
        /// Volume id; none lists every unhealthy volume.
        id: Option<String>,
        /// Ask the node service (NodeGetVolumeHealth) instead of the controller.
        #[arg(long)]
        node: bool,
        /// With --node: where the volume is or was staged.
        #[arg(long, requires = "node")]
        staging: Option<PathBuf>,
        /// With --node: where the volume is or was published.
        #[arg(long, requires = "node")]
        target: Option<PathBuf>,
    },
    /// CSI v1.13 NodeGetStorageHealth: missing, failing or suspect drives of the node.
    StorageHealth,
}

/// kubectl drivelet: drives and volumes across the cluster, and drive actions.
///
/// Reads the Drive objects every node's drivelet publishes with your kubeconfig
/// ($KUBECONFIG or ~/.kube/config), and asks drive actions by patching a Drive's
/// spec.action; the node's drivelet carries them out. Install this binary as
/// `kubectl-drivelet` on your PATH. Exit codes: 0 done, 1 failed or refused, 2 bad
/// arguments, 3 no such drive, 4 not complete within --wait.
#[derive(Parser)]
#[command(name = "kubectl drivelet", bin_name = "kubectl drivelet", version, about, long_about)]
struct KubectlCli {
    #[command(flatten)]
    args: KubectlArgs,
}

#[derive(clap::Args)]
struct KubectlArgs {
    /// The kubeconfig to use (default: $KUBECONFIG, else ~/.kube/config).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, global = true)]
    context: Option<String>,
    #[command(subcommand)]
    cmd: KubectlCmd,
}

#[derive(Subcommand)]
enum KubectlCmd {
    /// Every drive of every node: size, media, class, health, usage, free space,
    /// volumes and why (the columns of `drivelet ctl drives`, node first).
    Drives {
        /// Only this node's drives.
        #[arg(long)]
        node: Option<String>,
        /// Output format.
        #[arg(long, short, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// Every volume of every node: drive, size, used bytes, state, health and why.
    Volumes {
        /// Only this node's volumes.
        #[arg(long)]
        node: Option<String>,
        /// Only the volumes on this drive (its id).
        #[arg(long)]
        drive: Option<String>,
        /// Output format.
        #[arg(long, short, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// Ask a drive action of a node's drivelet: `drive cordon NODE/DRIVE`.
    Drive {
        #[command(subcommand)]
        cmd: KubectlDriveCmd,
    },
}

#[derive(Subcommand)]
enum KubectlDriveCmd {
    /// No new volumes on the drive; its volumes stay and are served.
    Cordon(ActionArgs),
    /// Lift a cordon: the drive takes new volumes again (a release is not undone).
    Uncordon(ActionArgs),
    /// No new volumes on the drive; it is released (may be pulled) once its volumes are
    /// deleted.
    Release(ActionArgs),
    /// Move the drive's volumes to other drives of its node (same ids: claims and pods
    /// need no change); a volume a pod uses moves once the pod is deleted. Released (may
    /// be pulled) once it holds none. With --wait, prints each step; exit 1 if a move
    /// failed (asking again retries it). Refused, moving nothing, when the node has no
    /// room for all of it.
    Evacuate(ActionArgs),
    /// Make a drive owned elsewhere (another node's, another cluster's, or nobody's
    /// drivelet can tell) its node's: its volumes are served there and the PVs of their
    /// claims are pinned to that node, bound to the same claims. Data is never touched.
    /// Refused for a drive of any other class.
    Adopt {
        #[command(flatten)]
        args: ActionArgs,
        /// Also give back the claims that are gone (a rebuilt cluster): each volume
        /// whose PV and claim are both gone gets its claim (namespace, name, size and
        /// class from the disk's note) and a PV bound to it.
        #[arg(long)]
        restore_claims: bool,
    },
}

#[derive(clap::Args)]
struct ActionArgs {
    /// The drive: NODE/DRIVE (the node and id `kubectl drivelet drives` lists), or its
    /// Drive object's name.
    drive: String,
    /// Wait this long (e.g. 30s, 5m) for the node to report the action complete;
    /// exit 4 if it is not.
    #[arg(long, visible_alias = "timeout", value_parser = drivelet::config::parse_duration)]
    wait: Option<std::time::Duration>,
    /// Output format.
    #[arg(long, short, value_enum, default_value_t = Format::Table)]
    output: Format,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    Table,
    /// A table with more columns (the pods using each volume).
    Wide,
    Json,
    Yaml,
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
    /// List every volume with its drive, size, state, staging and target paths.
    Volumes {
        /// Output format.
        #[arg(long, short, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// List every snapshot with its source volume, drive, size, state and time taken.
    Snapshots {
        /// Output format.
        #[arg(long, short, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Where each drive evacuation stands: the volumes moved, waiting, failed.
    Evacuations {
        /// Output format.
        #[arg(long, short, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Drive replacement: `drive evacuate ID` moves its volumes to other drives and then
    /// releases it; `drive release ID` stops new volumes on a drive and marks it
    /// released once its volumes are deleted; `drive cordon ID` only stops new volumes
    /// (`drive uncordon ID` undoes it).
    Drive {
        #[command(subcommand)]
        cmd: DriveCmd,
    },
    /// Migrate an in-tree `kubernetes.io/local-volume` PV: print it translated to a
    /// drivelet CSI PV (dry run), and with --apply adopt its data on this node. Needs
    /// `[migration] local = true` in the config.
    Migrate {
        /// The PV as YAML or JSON (`-` for stdin).
        #[arg(long, short = 'f', conflicts_with = "from_cluster")]
        file: Option<PathBuf>,
        /// Read the PV from the cluster (needs `[kubernetes] enabled = true`).
        #[arg(long)]
        from_cluster: Option<String>,
        /// Adopt the volume on this node (default: dry run, nothing changes).
        #[arg(long)]
        apply: bool,
    },
}

#[derive(Subcommand)]
enum DriveCmd {
    /// Release a drive for replacement: no new volumes go on it; it is marked released
    /// (safe to pull) once its volumes are deleted. With --force it is released at once
    /// and the volumes still on it are marked failed.
    Release {
        /// Drive id, as `drivelet ctl drives` shows it.
        id: String,
        /// Release now, failing the volumes still on the drive.
        #[arg(long)]
        force: bool,
    },
    /// Cordon a drive: no new volumes go on it; its volumes stay and are served.
    Cordon {
        /// Drive id, as `drivelet ctl drives` shows it.
        id: String,
    },
    /// Evacuate a drive: move every volume on it to other drives of this node (same ids;
    /// a volume in use moves once its pods stop), then release it. Refused, moving
    /// nothing, when the other drives cannot hold it all.
    Evacuate {
        /// Drive id, as `drivelet ctl drives` shows it.
        id: String,
        /// Move volumes with unreadable blocks anyway (those blocks read as zeros).
        #[arg(long)]
        force: bool,
    },
    /// Uncordon a cordoned drive: it takes new volumes again (a release is not undone).
    Uncordon {
        /// Drive id, as `drivelet ctl drives` shows it.
        id: String,
    },
    /// Adopt a drivelet disk owned elsewhere (class owned-elsewhere: another node's,
    /// another cluster's, or one whose owner cannot be read): this node owns it from
    /// now on and serves its volumes, as its note describes them. Nothing else on the
    /// disk is written.
    Adopt {
        /// Drive id, as `drivelet ctl drives` shows it.
        id: String,
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
    // Crash and fail points for tests (`FAILPOINTS`); compiled out unless built with
    // the `failpoints` feature.
    let _crash_points = drivelet::failpoint::from_env();
    let system = actix_rt::System::with_tokio_rt(|| runtime().expect("tokio runtime"));
    system.block_on(drivelet::agent::run(cfg))?;
    Ok(())
}

fn ctl(config: Option<PathBuf>, socket: Option<PathBuf>, cmd: CtlCmd) -> anyhow::Result<()> {
    if let CtlCmd::Migrate { file, from_cluster, apply } = cmd {
        let source = match (file, from_cluster) {
            (Some(f), None) => Some(drivelet::cli::migrate::Source::File(f)),
            (None, Some(name)) => Some(drivelet::cli::migrate::Source::Cluster(name)),
            _ => None,
        };
        return Ok(drivelet::cli::migrate::run(config.as_deref(), socket, source, apply)?);
    }
    let socket = match socket {
        Some(s) => s,
        None => Config::load(config.as_deref())?.paths.admin_socket,
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    match cmd {
        CtlCmd::Drives { output } => {
            let drives = rt.block_on(drivelet::cli::ctl::drives(&socket))?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&drives).context("encode")?),
                Output::Table => print!("{}", drivelet::cli::ctl::drives_table(&drives)),
            }
        }
        CtlCmd::Drive { cmd: DriveCmd::Release { id, force } } => {
            let u = rt.block_on(drivelet::cli::ctl::release(&socket, &id, force))?;
            println!("drive {}: {} ({})", u.drive_id, u.state.as_str(), u.reason);
        }
        CtlCmd::Drive { cmd: DriveCmd::Adopt { id } } => {
            let a = rt.block_on(drivelet::cli::ctl::adopt_drive(&socket, &id))?;
            print!("{}", drivelet::cli::ctl::adopted_words(&a));
        }
        CtlCmd::Drive { cmd: DriveCmd::Evacuate { id, force } } => {
            let e = rt.block_on(drivelet::cli::ctl::evacuate(&socket, &id, force))?;
            print!("{}", drivelet::cli::ctl::evacuations_table(std::slice::from_ref(&e)));
        }
        CtlCmd::Evacuations { output } => {
            let list = rt.block_on(drivelet::cli::ctl::evacuations(&socket))?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&list).context("encode")?),
                Output::Table => print!("{}", drivelet::cli::ctl::evacuations_table(&list)),
            }
        }
        CtlCmd::Drive { cmd: cordon @ (DriveCmd::Cordon { .. } | DriveCmd::Uncordon { .. }) } => {
            let (id, on) = match cordon {
                DriveCmd::Cordon { id } => (id, true),
                DriveCmd::Uncordon { id } | DriveCmd::Release { id, .. } | DriveCmd::Evacuate { id, .. } | DriveCmd::Adopt { id } => (id, false),
            };
            let u = rt.block_on(drivelet::cli::ctl::cordon(&socket, &id, on))?;
            match u {
                Some(u) => println!("drive {}: {} ({})", u.drive_id, u.state.as_str(), u.reason),
                None => println!("drive {id}: active"),
            }
        }
        CtlCmd::Volumes { output } => {
            let vols = rt.block_on(drivelet::cli::ctl::volumes(&socket))?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&vols).context("encode")?),
                Output::Table => {
                    let details = rt.block_on(drivelet::cli::ctl::volume_details(&socket))?;
                    print!("{}", drivelet::cli::ctl::volumes_table(&vols, &details))
                }
            }
        }
        CtlCmd::Snapshots { output } => {
            let snaps = rt.block_on(drivelet::cli::ctl::snapshots(&socket))?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&snaps).context("encode")?),
                Output::Table => print!("{}", drivelet::cli::ctl::snapshots_table(&snaps)),
            }
        }
        CtlCmd::Migrate { .. } => {}
    }
    Ok(())
}

fn size_arg(s: &str) -> anyhow::Result<u64> {
    drivelet::config::parse_size(s).map_err(|e| anyhow::anyhow!(e))
}

fn csi(config: Option<PathBuf>, endpoint: Option<PathBuf>, output: Output, cmd: CsiCmd) -> anyhow::Result<()> {
    use drivelet::cli::csi as csicli;
    let socket = match endpoint {
        Some(s) => s,
        None => Config::load(config.as_deref())?.paths.csi_socket,
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let answer = rt.block_on(async {
        let ch = csicli::connect(&socket).await?;
        match cmd {
            CsiCmd::Info => csicli::info(ch).await,
            CsiCmd::Create { name, size, limit, params, source, access } => {
                let (size, limit) = match (size_arg(&size), size_arg(&limit)) {
                    (Ok(s), Ok(l)) => (s, l),
                    (Err(e), _) | (_, Err(e)) => return Err(csicli::CsiCliError::Usage(e.to_string())),
                };
                csicli::create(ch, &name, size, limit, &access.access(), csicli::parse_params(&params)?, source.as_deref()).await
            }
            CsiCmd::Delete { id } => csicli::delete(ch, &id).await,
            CsiCmd::Get { id } => csicli::get(ch, &id).await,
            CsiCmd::List => csicli::list(ch).await,
            CsiCmd::Validate { id, access } => csicli::validate(ch, &id, &access.access()).await,
            CsiCmd::Capacity { params } => csicli::capacity(ch, csicli::parse_params(&params)?).await,
            CsiCmd::Stage { id, staging, access } => csicli::stage(ch, &id, &staging, &access.access()).await,
            CsiCmd::Unstage { id, staging } => csicli::unstage(ch, &id, &staging).await,
            CsiCmd::Publish { id, staging, target, readonly, access } => {
                csicli::publish(ch, &id, &staging, &target, &access.access(), readonly).await
            }
            CsiCmd::Unpublish { id, target } => csicli::unpublish(ch, &id, &target).await,
            CsiCmd::Expand { id, size } => {
                let size = size_arg(&size).map_err(|e| csicli::CsiCliError::Usage(e.to_string()))?;
                csicli::expand(ch, &id, size).await
            }
            CsiCmd::NodeExpand { id, path } => csicli::node_expand(ch, &id, &path).await,
            CsiCmd::Stats { id, path } => csicli::stats(ch, &id, &path).await,
            CsiCmd::Health { id: Some(id), node, staging, target } => {
                csicli::health(ch, &id, node, staging.as_deref(), target.as_deref()).await
            }
            CsiCmd::Health { id: None, node: true, .. } => {
                Err(drivelet::cli::csi::CsiCliError::Usage("--node needs a volume id: NodeGetVolumeHealth asks about one volume".into()))
            }
            CsiCmd::Health { id: None, .. } => csicli::unhealthy(ch).await,
            CsiCmd::StorageHealth => csicli::storage_health(ch).await,
        }
    })?;
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&answer).context("encode")?),
        Output::Table => print!("{}", csicli::plain(&answer)),
    }
    Ok(())
}

fn bench(mode: BenchMode) -> anyhow::Result<()> {
    use drivelet::cli::bench::{self, Common};
    let duration = |s: &str| drivelet::config::parse_duration(s).map_err(|e| anyhow::anyhow!(e));
    let common = |a: &BenchArgs| -> anyhow::Result<Common> {
        Ok(Common {
            endpoints: a.endpoints.iter().map(|e| bench::parse_endpoint(e)).collect::<Result<_, _>>()?,
            concurrency: a.concurrency,
            connections: a.connections,
            timeout: duration(&a.timeout)?,
        })
    };
    let args = match &mode {
        BenchMode::Rpc { args, .. } | BenchMode::Lifecycle { args, .. } => args,
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(args.threads.max(1)).enable_all().build()?;
    let report = match &mode {
        BenchMode::Rpc { args, duration: d, rpcs, page_size } => {
            let o = bench::RpcOptions { common: common(args)?, duration: duration(d)?, rpcs: rpcs.clone(), page_size: *page_size };
            rt.block_on(bench::run_rpc(&o))?
        }
        BenchMode::Lifecycle { args, count, duration: d, size, fs, block, params, staging_dir, target_dir } => {
            let o = bench::LifecycleOptions {
                common: common(args)?,
                count: *count,
                duration: duration(d)?,
                size: size_arg(size)?,
                access: drivelet::cli::csi::Access { block: *block, fs_type: fs.clone(), mount_flags: Vec::new(), mode: String::new() },
                params: drivelet::cli::csi::parse_params(params)?,
                staging_dir: staging_dir.clone(),
                target_dir: target_dir.clone(),
            };
            rt.block_on(bench::run_lifecycle(&o))?
        }
    };
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&report).context("encode")?),
        Output::Table => print!("{}", bench::render_table(&report)),
    }
    let left = report.left_behind();
    if !left.is_empty() {
        anyhow::bail!("{} volume(s) could not be cleaned up and are left behind: {}", left.len(), left.join(", "));
    }
    Ok(())
}

fn print_as<T: serde::Serialize>(format: Format, value: &T, table: impl FnOnce() -> String) -> anyhow::Result<()> {
    match format {
        Format::Table | Format::Wide => print!("{}", table()),
        Format::Json => println!("{}", serde_json::to_string_pretty(value).context("encode")?),
        Format::Yaml => print!("{}", serde_norway::to_string(value).context("encode")?),
    }
    Ok(())
}

/// `kubectl drivelet`: its own exit codes (see `KubectlCli`).
fn kubectl(args: KubectlArgs) -> ExitCode {
    use drivelet::cli::kubectl as k;
    let run = async {
        let client = k::client(args.kubeconfig.as_deref(), args.context).await?;
        let res = match args.cmd {
            KubectlCmd::Drives { node, output } => {
                let rows = k::drives(&client, node.as_deref()).await?;
                print_as(output, &rows, || k::drives_table(&rows))
            }
            KubectlCmd::Volumes { node, drive, output } => {
                let rows = k::volumes(&client, node.as_deref(), drive.as_deref()).await?;
                print_as(output, &rows, || k::volumes_table(&rows, output == Format::Wide))
            }
            KubectlCmd::Drive { cmd } => {
                let (action, a) = match cmd {
                    KubectlDriveCmd::Cordon(a) => (k::Action::Cordon, a),
                    KubectlDriveCmd::Uncordon(a) => (k::Action::Uncordon, a),
                    KubectlDriveCmd::Release(a) => (k::Action::Release, a),
                    KubectlDriveCmd::Evacuate(a) => (k::Action::Evacuate, a),
                    KubectlDriveCmd::Adopt { args, restore_claims } => (k::Action::Adopt { restore_claims }, args),
                };
                let (table, drive) = (matches!(a.output, Format::Table | Format::Wide), a.drive.clone());
                let mut progress = |m: &str| {
                    if table {
                        println!("drive {drive}: {m}");
                    }
                };
                let o = k::act(&client, &a.drive, action, a.wait, &mut progress).await?;
                let done = if o.complete { "done" } else { "asked" };
                print_as(a.output, &o, || format!("drive {}: {} {done}: {}\n", o.drive, o.action, o.message))
            }
        };
        Ok::<_, k::KubectlError>(res)
    };
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kubectl drivelet: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run) {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("kubectl drivelet: {e:#}");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("kubectl drivelet: {e}");
            ExitCode::from(e.exit_code())
        }
    }
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
        return kubectl(KubectlCli::parse().args);
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
        Cmd::Run { config } => run(config),
        Cmd::CheckConfig { file } => Config::load(Some(&file)).map(|c| {
            println!("{}: valid (node {}, driver {})", file.display(), c.driver.node_name, c.driver.name);
        }).map_err(Into::into),
        Cmd::Kubectl(args) => return kubectl(args),
        Cmd::Ctl { config, socket, cmd } => ctl(config, socket, cmd),
        Cmd::Csi { config, endpoint, output, cmd } => csi(config, endpoint, output, cmd),
        Cmd::Bench { mode } => bench(mode),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            fatal(&e);
            ExitCode::from(1)
        }
    }
}
