//! The command line as clap reads it: the `drivelet` subcommands and the `kubectl
//! drivelet` plugin, every argument with its help.
//!
//! Rule: the `///` comments here are the help the binary prints (`--help`), so they are
//! written for its users and a field without one has no help on purpose; the bodies
//! that run a subcommand live beside its client ([`super::ctl::run`],
//! [`super::csi::run`], [`super::bench::run`], [`super::kubectl::run`]) and `main.rs`
//! only dispatches.
#![allow(missing_docs)]

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

/// drivelet: turns this node's local drives into CSI volumes and watches over them.
///
/// Run one per node (a DaemonSet pod) as root. Configuration is a TOML file
/// (see config/drivelet.toml for every key) with DRIVELET__SECTION__KEY environment
/// overrides; the node name comes from NODE_NAME when not configured.
#[derive(Parser)]
#[command(name = "drivelet", version, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Run the agent: drive inventory, CSI socket, admin socket. Stops cleanly on
    /// SIGTERM or SIGINT.
    Run {
        /// Configuration file (TOML).
        #[arg(long, short)]
        config: PathBuf,
    },
    /// The watchdog of one freeze, started by the agent (not for people): thaws the
    /// mount it was handed when the agent goes away without thawing it, or at the limit.
    #[command(hide = true)]
    FreezeWatch {
        /// The frozen mount's descriptor, inherited from the agent.
        #[arg(long)]
        fd: i32,
        /// The freeze's limit, in milliseconds.
        #[arg(long)]
        limit_ms: u64,
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
pub struct BenchArgs {
    /// CSI socket to measure, as PATH or LABEL=PATH (repeatable: endpoints run one
    /// after another, never at once, and are reported side by side).
    #[arg(long = "endpoint", required = true)]
    pub endpoints: Vec<String>,
    /// Concurrent callers.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// One connection per caller, or one shared channel (HTTP/2 multiplexing).
    #[arg(long, value_enum, default_value_t = crate::cli::bench::Connections::PerCaller)]
    pub connections: crate::cli::bench::Connections,
    /// Time limit of each call, e.g. 30s (running out counts as DEADLINE_EXCEEDED).
    #[arg(long, default_value = "60s")]
    pub timeout: String,
    /// Worker threads of the load generator (it shares the machine with the driver).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Output format.
    #[arg(long, short, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

#[derive(Subcommand)]
pub enum BenchMode {
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
        rpcs: Vec<crate::cli::bench::Rpc>,
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
pub struct AccessArgs {
    /// Block access (the raw partition) instead of a filesystem.
    #[arg(long)]
    pub block: bool,
    /// Filesystem for mount access: ext4 or xfs (default: the driver's).
    #[arg(long, default_value = "")]
    pub fs: String,
    /// Mount flag (repeatable), e.g. --mount-flag noatime.
    #[arg(long = "mount-flag")]
    pub mount_flags: Vec<String>,
    /// Access mode: single-node-writer, single-node-reader-only,
    /// single-node-single-writer, single-node-multi-writer.
    #[arg(long, default_value = "single-node-writer")]
    pub mode: String,
}

impl AccessArgs {
    pub fn access(&self) -> crate::cli::csi::Access {
        crate::cli::csi::Access {
            block: self.block,
            fs_type: self.fs.clone(),
            mount_flags: self.mount_flags.clone(),
            mode: self.mode.clone(),
        }
    }
}

#[derive(Subcommand)]
pub enum CsiCmd {
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
        /// A file of the call's secrets, one `key=value` per line (the key-encryption
        /// key a clone of or into an encrypted volume needs: `key=...`).
        #[arg(long)]
        secrets_file: Option<PathBuf>,
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
        /// A file of the call's secrets, one `key=value` per line (an encrypted volume's
        /// key-encryption key: `key=...`, `previous-key=...`), read from a file so
        /// they never show in a process list.
        #[arg(long)]
        secrets_file: Option<PathBuf>,
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
pub struct KubectlCli {
    #[command(flatten)]
    pub args: KubectlArgs,
}

#[derive(clap::Args)]
pub struct KubectlArgs {
    /// The kubeconfig to use (default: $KUBECONFIG, else ~/.kube/config).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, global = true)]
    pub context: Option<String>,
    #[command(subcommand)]
    pub cmd: KubectlCmd,
}

#[derive(Subcommand)]
pub enum KubectlCmd {
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
pub enum KubectlDriveCmd {
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
pub struct ActionArgs {
    /// The drive: NODE/DRIVE (the node and id `kubectl drivelet drives` lists), or its
    /// Drive object's name.
    pub drive: String,
    /// Wait this long (e.g. 30s, 5m) for the node to report the action complete;
    /// exit 4 if it is not.
    #[arg(long, visible_alias = "timeout", value_parser = crate::config::parse_duration)]
    pub wait: Option<std::time::Duration>,
    /// Output format.
    #[arg(long, short, value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    /// A table with more columns (the pods using each volume).
    Wide,
    Json,
    Yaml,
}

#[derive(Subcommand)]
pub enum CtlCmd {
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
pub enum DriveCmd {
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
    /// disk is written. A volume whose PV and claim are both gone gets no new claim
    /// from here: that is `kubectl drivelet drive adopt NODE/DRIVE --restore-claims`
    /// (the Drive object's `spec.restoreClaims`).
    Adopt {
        /// Drive id, as `drivelet ctl drives` shows it.
        id: String,
    },
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Output {
    Table,
    Json,
}
