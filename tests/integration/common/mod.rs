//! Test harness: the real `drivelet` binary against real loop devices and udev.
//!
//! Preconditions are checked, never skipped: a test that cannot run (not root, no
//! udevd, no loop devices) fails and says why.
#![allow(dead_code)]

use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use drivelet::grpc::proto::csi;
use tonic::transport::Channel;

/// The one set of CSI request builders every test uses.
pub mod requests;
#[allow(unused_imports)]
pub use requests::*;

/// Fails the test with a reason when the machine cannot run integration tests.
pub fn require_host() {
    assert!(nix::unistd::geteuid().is_root(), "integration tests need root (loop devices, mkfs, mount); run as root");
    let udevd = Command::new("pgrep").arg("-x").arg("systemd-udevd").output().expect("pgrep");
    assert!(udevd.status.success(), "systemd-udevd is not running; start it with scripts/setup-host.sh");
    assert!(Path::new("/dev/loop-control").exists(), "no /dev/loop-control: the kernel has no loop device support");
}

/// Runs a command and returns stdout; panics with stderr on failure.
pub fn sh(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(out.status.success(), "{cmd} {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A loop device over a sparse file; detached on drop.
pub struct LoopDrive {
    pub file: PathBuf,
    pub dev: PathBuf,
}

impl LoopDrive {
    pub fn new(dir: &Path, name: &str, size: u64) -> LoopDrive {
        let file = dir.join(name);
        let f = std::fs::File::create(&file).unwrap();
        f.set_len(size).unwrap();
        drop(f);
        let dev = PathBuf::from(sh("losetup", &["--find", "--show", "--partscan", file.to_str().unwrap()]));
        LoopDrive { file, dev }
    }

    pub fn name(&self) -> String {
        self.dev.file_name().unwrap().to_string_lossy().into_owned()
    }

    /// Detaches the loop device and waits until the kernel has let it go: a device
    /// still open somewhere (udev probing it, the agent's lock lingering after a write)
    /// is released at its last close, and a drive pulled is gone before another one
    /// comes.
    pub fn detach(&mut self) {
        if !self.dev.as_os_str().is_empty() {
            let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
            let backing = PathBuf::from("/sys/block").join(self.name()).join("loop/backing_file");
            let t0 = std::time::Instant::now();
            let ours = || std::fs::read_to_string(&backing).is_ok_and(|b| Path::new(b.trim()) == self.file);
            while ours() && t0.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(5));
            }
            self.dev = PathBuf::new();
        }
    }
}

impl Drop for LoopDrive {
    fn drop(&mut self) {
        self.detach();
    }
}

/// sha256 of a file, to prove it was not touched.
pub fn digest(p: &Path) -> String {
    sh("sha256sum", &[p.to_str().unwrap()]).split_whitespace().next().unwrap().to_string()
}

/// A temporary directory with a short path (unix socket paths are limited).
pub fn short_tempdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("dlt").tempdir_in("/tmp").unwrap()
}

/// Options for a test agent.
pub struct AgentOpts {
    /// Extra TOML appended to the generated config.
    pub extra_toml: String,
    /// Extra `[drives.filters]` lines.
    pub filters: String,
}

impl Default for AgentOpts {
    fn default() -> Self {
        AgentOpts { extra_toml: String::new(), filters: String::new() }
    }
}

/// A running agent under test.
pub struct Agent {
    pub dir: PathBuf,
    pub config: PathBuf,
    pub csi_socket: PathBuf,
    pub admin_socket: PathBuf,
    pub child: Option<Child>,
    pub log: PathBuf,
}

pub const NODE: &str = "test-node";

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_drivelet")
}

impl Agent {
    /// Arms the fail or crash point `name` of the running agent with `actions` (`return`
    /// kills it there) through its admin socket; panics unless the agent says it is armed.
    pub fn arm(&self, name: &str, actions: &str) {
        use std::io::{BufRead, Write};
        let mut s = std::os::unix::net::UnixStream::connect(&self.admin_socket).expect("admin socket");
        let req = serde_json::json!({"cmd": "fail-point", "name": name, "actions": actions});
        writeln!(s, "{req}").unwrap();
        let mut line = String::new();
        std::io::BufReader::new(s).read_line(&mut line).unwrap();
        let answer: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert_eq!(answer["armed"], name, "arming {name}: {answer}");
    }

    /// Writes a config that manages only `*.img` loop drives under `dir` and starts
    /// the binary; returns once Probe says ready.
    pub fn start(dir: &Path, opts: AgentOpts) -> Agent {
        Agent::start_env(dir, opts, &[])
    }

    /// [`Agent::start`], the first process started with `env` added (config overrides
    /// such as `DRIVELET__VOLUMES__...` that must hold from the very start).
    pub fn start_env(dir: &Path, opts: AgentOpts, env: &[(&str, &str)]) -> Agent {
        let config = dir.join("drivelet.toml");
        let csi_socket = dir.join("csi.sock");
        let admin_socket = dir.join("admin.sock");
        let toml = format!(
            r#"
[driver]
node_name = "{NODE}"
[driver.topology]
"topology.kubernetes.io/zone" = "zone-a"
[paths]
csi_socket = "{csi}"
admin_socket = "{admin}"
state_dir = "{state}"
[drives]
allow_loop = true
rescan_interval = "1m"
[drives.filters]
include_paths = ["{dir}/*.img"]
{filters}
[volumes]
allowed_roots = ["{dir}/kubelet"]
[log]
format = "json"
level = "debug"
{extra}
"#,
            csi = csi_socket.display(),
            admin = admin_socket.display(),
            state = dir.join("state").display(),
            dir = dir.display(),
            filters = opts.filters,
            extra = opts.extra_toml,
        );
        std::fs::write(&config, toml).unwrap();
        let mut a = Agent { dir: dir.to_path_buf(), config, csi_socket, admin_socket, child: None, log: dir.join("agent.log") };
        a.spawn_with(env);
        a.wait_ready();
        a.wait_drives_clean();
        a
    }

    /// Waits (60 s at most) until no drive has space being cleaned: a fresh agent zeroes
    /// the blank drives it takes before they offer their space (issue 24), and a test
    /// starts from drives that offer all of it.
    pub fn wait_drives_clean(&self) {
        let start = Instant::now();
        loop {
            let out = Command::new(bin())
                .args(["ctl", "--socket", self.admin_socket.to_str().unwrap(), "drives", "--output", "json"])
                .output()
                .unwrap();
            let drives: Option<serde_json::Value> = out.status.success().then(|| serde_json::from_slice(&out.stdout).ok()).flatten();
            let cleaning = drives.as_ref().and_then(|d| d.as_array()).map(|l| l.iter().any(|d| d.get("cleaning").is_some()));
            if cleaning == Some(false) {
                return;
            }
            assert!(start.elapsed() < Duration::from_secs(60), "drives still being cleaned 60 s after start: {drives:?}; log:\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts (or restarts) the process and waits for readiness.
    pub fn spawn(&mut self) {
        self.spawn_with(&[]);
        self.wait_ready();
    }

    /// Starts the process with extra environment, without waiting.
    pub fn spawn_with(&mut self, env: &[(&str, &str)]) {
        self.launch(Command::new(bin()), env);
    }

    /// Starts (or restarts) the process with the capabilities `caps` (as setpriv names
    /// them: `sys_resource`) taken from its bounding and inheritable sets, as a machine
    /// that withholds them from root runs it, and waits for readiness. setpriv execs the
    /// binary, so the child's pid is drivelet's.
    pub fn spawn_without(&mut self, caps: &[&str]) {
        let drop: Vec<String> = caps.iter().map(|c| format!("-{c}")).collect();
        let mut cmd = Command::new("setpriv");
        cmd.arg(format!("--inh-caps={}", drop.join(","))).arg(format!("--bounding-set={}", drop.join(","))).arg("--").arg(bin());
        self.launch(cmd, &[]);
        self.wait_ready();
    }

    /// Runs `cmd` (drivelet, or a launcher that execs it) as the agent.
    fn launch(&mut self, mut cmd: Command, env: &[(&str, &str)]) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap();
        let child = cmd
            .args(["run", "--config", self.config.to_str().unwrap()])
            .env_remove("RUST_LOG")
            .env_remove("FAILPOINTS")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn drivelet");
        self.child = Some(child);
    }

    /// Waits until Probe says ready (30 s at most).
    pub fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let rt = rt();
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("drivelet exited early with {status}; log:\n{}", self.logs());
            }
            // One attempt is bounded: the path may still name a socket nobody serves
            // (a stale one the agent is about to replace), which accepts and never answers.
            let ready = is_socket(&self.csi_socket)
                && rt.block_on(async {
                    let attempt = async {
                        let ch = channel(&self.csi_socket).await.ok()?;
                        let r = csi::identity_client::IdentityClient::new(ch).probe(csi::ProbeRequest {}).await.ok()?;
                        r.into_inner().ready
                    };
                    tokio::time::timeout(Duration::from_secs(2), attempt).await.ok().flatten()
                }) == Some(true);
            if ready {
                return;
            }
            assert!(Instant::now() < deadline, "drivelet not ready after 30s; log:\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends SIGTERM and waits for exit; returns the exit code.
    pub fn stop(&mut self) -> i32 {
        let mut child = self.child.take().expect("running");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(s) = child.try_wait().unwrap() {
                return s.code().unwrap_or(-1);
            }
            assert!(Instant::now() < deadline, "drivelet did not stop within 20s of SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// kill -9.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `drivelet ctl drives -o json` through the real CLI.
    pub fn ctl_drives(&self) -> serde_json::Value {
        let out = Command::new(bin())
            .args(["ctl", "--socket", self.admin_socket.to_str().unwrap(), "drives", "--output", "json"])
            .output()
            .unwrap();
        assert!(out.status.success(), "ctl drives failed: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("ctl json")
    }

    /// `drivelet ctl volumes -o json`.
    pub fn ctl_volumes(&self) -> serde_json::Value {
        let out = Command::new(bin())
            .args(["ctl", "--socket", self.admin_socket.to_str().unwrap(), "volumes", "--output", "json"])
            .output()
            .unwrap();
        assert!(out.status.success(), "ctl volumes failed: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("ctl json")
    }

    /// An agent with kubelet registration on (so it serves both gRPC sockets) and
    /// kubelet's directory under `dir`; returns it with the registration socket path.
    pub fn start_registering(dir: &Path) -> (Agent, PathBuf) {
        let kubelet = dir.join("kubelet");
        let opts = AgentOpts {
            extra_toml: format!("[kubelet]\nregistration = true\ndir = \"{}\"\n", kubelet.display()),
            ..Default::default()
        };
        let agent = Agent::start(dir, opts);
        (agent, kubelet.join("plugins_registry/csi.drivelet.io-reg.sock"))
    }

    pub async fn csi(&self) -> Channel {
        channel(&self.csi_socket).await.expect("connect CSI socket")
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
        // DRIVELET_TEST_KEEP_LOGS=DIR keeps a copy of every agent's log (for a flake
        // under load, whose failure shows only the tail).
        if let Ok(d) = std::env::var("DRIVELET_TEST_KEEP_LOGS") {
            let _ = std::fs::create_dir_all(&d);
            let n = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
            let _ = std::fs::copy(&self.log, format!("{d}/{n}.log"));
        }
    }
}

pub fn is_socket(p: &Path) -> bool {
    std::fs::symlink_metadata(p).map(|m| m.file_type().is_socket()).unwrap_or(false)
}

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// A gRPC channel over a unix socket (the library's own CSI client connector).
pub async fn channel(path: &Path) -> Result<Channel, drivelet::cli::csi::CsiCliError> {
    drivelet::cli::csi::connect(path).await
}

/// The drive entry whose path is `dev`, from ctl JSON.
pub fn drive_by_path<'a>(drives: &'a serde_json::Value, dev: &Path) -> Option<&'a serde_json::Value> {
    drives.as_array().unwrap().iter().find(|d| d["path"].as_str() == dev.to_str())
}

/// The block device backing `/`, as a whole-disk kernel path.
pub fn root_disk() -> PathBuf {
    let src = sh("findmnt", &["-n", "-o", "SOURCE", "/"]);
    let pk = sh("lsblk", &["-n", "-d", "-o", "PKNAME", &src]);
    if pk.is_empty() {
        PathBuf::from(src)
    } else {
        PathBuf::from(format!("/dev/{pk}"))
    }
}

/// CSI clients over one channel (the request builders are in [`requests`]).
pub struct Csi {
    pub ctrl: csi::controller_client::ControllerClient<Channel>,
    pub node: csi::node_client::NodeClient<Channel>,
    pub id: csi::identity_client::IdentityClient<Channel>,
}

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

impl Csi {
    /// Clients of the agent's CSI socket.
    pub async fn connect(agent: &Agent) -> Csi {
        Csi::connect_path(&agent.csi_socket).await
    }

    /// Clients of the CSI socket at `sock`, on a connection of their own.
    pub async fn connect_path(sock: &Path) -> Csi {
        let ch = channel(sock).await.expect("connect CSI socket");
        Csi {
            ctrl: csi::controller_client::ControllerClient::new(ch.clone()),
            node: csi::node_client::NodeClient::new(ch.clone()),
            id: csi::identity_client::IdentityClient::new(ch),
        }
    }
}

/// Mount points under `dir`, from the live mountinfo.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    drivelet::disk::mounts::read_mountinfo()
        .unwrap()
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(dir))
        .collect()
}

/// Partitions of a loop device, from sysfs: (name, start bytes, size bytes).
pub fn kernel_parts(dev: &Path) -> Vec<(String, u64, u64)> {
    drivelet::disk::blkpg::kernel_partitions(dev).unwrap().into_iter().map(|p| (p.name, p.start, p.size)).collect()
}

/// Unmounts everything under `dir` (test cleanup after a failure).
pub fn unmount_under(dir: &Path) {
    let mut ms = mounts_under(dir);
    ms.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    for m in ms {
        let _ = Command::new("umount").arg("-l").arg(&m).status();
    }
}

/// Unmounts whatever a failed test left under its directory; declare it after the
/// agent and before the loop drives so it runs before they are detached.
pub struct Unmounter(pub PathBuf);

impl Drop for Unmounter {
    fn drop(&mut self) {
        unmount_under(&self.0);
    }
}

impl Agent {
    /// Like [`Agent::start`], but the running process has `env` (e.g. an armed
    /// `FAILPOINTS`): the config is written by a plain start, which is stopped cleanly
    /// and replaced by one started with `env`, once that one is ready.
    pub fn start_with(dir: &Path, opts: AgentOpts, env: &[(&str, &str)]) -> Agent {
        let mut a = Agent::start(dir, opts);
        assert_eq!(a.stop(), 0, "the plain agent did not stop cleanly; log:\n{}", a.logs());
        a.spawn_with(env);
        a.wait_ready();
        a
    }

    /// Waits up to `within` for the process to exit on its own (it killed itself at a
    /// crash point) and returns how it ended; `None` when it still runs.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        let child = self.child.as_mut().expect("the agent was started");
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `drivelet ctl volumes -o json` through the real CLI: the ids of every volume
    /// record the agent holds. `None` when this build's CLI has no `volumes` command
    /// yet; callers then check through CSI instead.
    pub fn ctl_volume_ids(&self) -> Option<Vec<String>> {
        let out = Command::new(bin())
            .args(["ctl", "--socket", self.admin_socket.to_str().unwrap(), "volumes", "--output", "json"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() && stderr.contains("unrecognized subcommand") {
            return None;
        }
        assert!(out.status.success(), "ctl volumes failed: {stderr}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ctl volumes json");
        let list = v.as_array().unwrap_or_else(|| panic!("ctl volumes is not a JSON list: {v}"));
        Some(list.iter().map(|r| r["id"].as_str().unwrap_or_default().to_string()).collect())
    }
}

/// One entry of a GPT as `sfdisk --json` reads it from the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GptEntry {
    /// Partition GUID (upper case, as sfdisk prints it).
    pub uuid: String,
    /// Start, bytes.
    pub start: u64,
    /// Size, bytes.
    pub size: u64,
    /// Partition name (label).
    pub name: String,
}

/// The partitions the on-disk partition table of `dev` lists (none when it has no
/// table at all), read by `sfdisk --json`, independent of drivelet's own GPT code.
pub fn gpt_entries(dev: &Path) -> Vec<GptEntry> {
    let out = Command::new("sfdisk").arg("--json").arg(dev).output().expect("sfdisk");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && stderr.contains("does not contain a recognized partition table") {
        return Vec::new();
    }
    assert!(out.status.success(), "sfdisk --json {} failed: {stderr}", dev.display());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("sfdisk json");
    let t = &v["partitiontable"];
    let sector = t["sectorsize"].as_u64().unwrap_or(512);
    t["partitions"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .map(|p| GptEntry {
                    uuid: p["uuid"].as_str().unwrap_or_default().to_string(),
                    start: p["start"].as_u64().unwrap() * sector,
                    size: p["size"].as_u64().unwrap() * sector,
                    name: p["name"].as_str().unwrap_or_default().to_string(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Where the first volume on a blank drive of `size` bytes starts: the lowest aligned
/// offset a partition may take.
pub fn first_volume_start(size: u64) -> u64 {
    drivelet::disk::gpt::usable_region(size, 512).expect("drive big enough").0
}

impl Agent {
    /// The last `n` lines of the agent log, without the gRPC transport's frame chatter:
    /// the excerpt a failure message shows.
    pub fn log_tail(&self, n: usize) -> String {
        let logs = self.logs();
        let lines: Vec<&str> = logs
            .lines()
            .filter(|l| !["\"target\":\"h2::", "\"target\":\"hyper", "\"target\":\"tower", "\"target\":\"tonic::transport"].iter().any(|t| l.contains(t)))
            .collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

/// Every crash point (`crash_point!("name")`) named under `src/`, sorted; fails when
/// there is none.
pub fn crash_points() -> Vec<String> {
    let mut found = std::collections::BTreeSet::new();
    let mut dirs = vec![PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let src = std::fs::read_to_string(&p).unwrap();
                for piece in src.split("crash_point!(\"").skip(1) {
                    found.insert(piece.split('"').next().unwrap().to_string());
                }
            }
        }
    }
    assert!(!found.is_empty(), "no crash_point!(\"...\") found under src/");
    found.into_iter().collect()
}

// ---------------------------------------------------------------------------------
// SMART and drives as ctl shows them

/// Where the smartctl JSON fixtures live.
pub const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/smartctl");

/// The smartctl error drivelet sees for a device it cannot open (bit 1 of the exit
/// status): what a loop device, a RAID volume or a vanished disk gives.
pub const OPEN_FAILED: &str = "error-open-failed-megaraid.json";

/// A stand-in for `smartctl`: a shell script that prints the fixture chosen for the
/// device it is asked about and exits with that fixture's `smartctl.exit_status`, as
/// smartctl does. The choice for `/dev/loopN` is the file `<dir>/smart/loopN`
/// (`<fixture path> <exit status>`), else `<dir>/smart/default`; a test changes a
/// drive's SMART verdict by rewriting its file.
pub struct SmartStandIn {
    pub program: PathBuf,
    pub choices: PathBuf,
}

impl SmartStandIn {
    /// Writes the script under `dir`; every drive starts with the open-failed output.
    pub fn install(dir: &Path) -> SmartStandIn {
        let choices = dir.join("smart");
        std::fs::create_dir_all(&choices).unwrap();
        let program = dir.join("smartctl");
        let script = format!(
            r#"#!/bin/sh
# smartctl stand-in for drivelet's health tests: `smartctl --json -a DEVICE`.
for a in "$@"; do dev="$a"; done
choice="{choices}/$(basename "$dev")"
[ -f "$choice" ] || choice="{choices}/default"
read -r fixture code < "$choice"
cat "$fixture"
exit "$code"
"#,
            choices = choices.display()
        );
        std::fs::write(&program, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        let s = SmartStandIn { program, choices };
        s.choose("default", OPEN_FAILED);
        s
    }

    /// From now on, `smartctl` on the device `name` (e.g. `loop3`) prints `fixture`.
    pub fn choose(&self, name: &str, fixture: &str) {
        let path = Path::new(FIXTURES).join(fixture);
        let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let code = json["smartctl"]["exit_status"].as_i64().unwrap_or_else(|| panic!("{fixture} has no smartctl.exit_status"));
        // Written aside and renamed, so the script never reads half a line.
        let tmp = self.choices.join(format!(".{name}.new"));
        std::fs::write(&tmp, format!("{} {code}\n", path.display())).unwrap();
        std::fs::rename(&tmp, self.choices.join(name)).unwrap();
    }
}

/// The drive entry with stable id `id`, from `drivelet ctl drives -o json`.
pub fn ctl_drive(agent: &Agent, id: &str) -> serde_json::Value {
    let all = agent.ctl_drives();
    all.as_array().unwrap().iter().find(|d| d["id"].as_str() == Some(id)).cloned().unwrap_or_else(|| panic!("drive {id} not listed: {all}"))
}

/// Waits until ctl shows drive `id` with health `health`; returns its entry.
pub fn wait_drive_health(agent: &Agent, id: &str, health: &str, within: Duration) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let d = ctl_drive(agent, id);
        if d["health"]["health"].as_str() == Some(health) {
            return d;
        }
        assert!(
            start.elapsed() < within,
            "drive {id} health did not become {health} within {within:?}: {}\nlog:\n{}",
            d["health"],
            agent.log_tail(40)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The stable drive id of a loop drive, from ctl.
pub fn drive_id_of(agent: &Agent, d: &LoopDrive) -> String {
    let all = agent.ctl_drives();
    drive_by_path(&all, &d.dev).unwrap_or_else(|| panic!("{} not listed: {all}", d.dev.display()))["id"].as_str().unwrap().to_string()
}

/// The ListVolumes entry of `id` (all pages).
pub async fn listed(c: &mut Csi, id: &str) -> csi::list_volumes_response::Entry {
    let mut token = String::new();
    loop {
        let r = c
            .ctrl
            .list_volumes(csi::ListVolumesRequest { max_entries: 0, starting_token: token })
            .await
            .unwrap()
            .into_inner();
        if let Some(e) = r.entries.into_iter().find(|e| e.volume.as_ref().is_some_and(|v| v.volume_id == id)) {
            return e;
        }
        assert!(!r.next_token.is_empty(), "ListVolumes does not list volume {id}");
        token = r.next_token;
    }
}

/// The volume condition a ListVolumes entry carries.
pub fn listed_condition(e: &csi::list_volumes_response::Entry) -> csi::VolumeCondition {
    e.status.as_ref().and_then(|s| s.volume_condition.clone()).expect("ListVolumes entries carry a volume condition")
}

/// Agent options with `[health]` tuned for tests (SMART every second, volume checks
/// every 200 ms, commands bounded at 3 s) and smartctl replaced by `smart`; `more` is
/// TOML appended after those keys (more `[health]` keys, then other tables).
pub fn health_opts(smart: &SmartStandIn, more: &str) -> AgentOpts {
    AgentOpts {
        extra_toml: format!(
            "\n[health]\ninterval = \"1s\"\njitter_percent = 0\nvolume_check_interval = \"200ms\"\ncommand_timeout = \"3s\"\nsmartctl = \"{}\"\n{more}\n",
            smart.program.display()
        ),
        ..AgentOpts::default()
    }
}

/// The test directory's kubelet root, the smartctl stand-in and an agent started with
/// [`health_opts`].
pub fn start_health_agent(dir: &Path, more: &str) -> (Agent, SmartStandIn) {
    std::fs::create_dir_all(dir.join("kubelet")).unwrap();
    let smart = SmartStandIn::install(dir);
    let agent = Agent::start(dir, health_opts(&smart, more));
    (agent, smart)
}

// ---------------------------------------------------------------------------------
// Clean extents: patterns written and read straight to and from devices

/// The byte a tenant fills its volume with, to be looked for after it left.
pub const PATTERN: u8 = 0xa5;

/// A 4 KiB-aligned buffer of `len` bytes (for `O_DIRECT`).
pub struct Aligned {
    raw: Vec<u8>,
    at: usize,
    len: usize,
}

impl Aligned {
    pub fn new(len: usize, fill: u8) -> Aligned {
        let raw = vec![fill; len + 4096];
        let at = raw.as_ptr().align_offset(4096);
        Aligned { raw, at, len }
    }
    pub fn buf(&mut self) -> &mut [u8] {
        &mut self.raw[self.at..self.at + self.len]
    }
}

/// Writes `byte` over `[from, to)` of `dev`, straight to the device.
pub fn fill(dev: &Path, from: u64, to: u64, byte: u8) {
    let f = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(dev).unwrap();
    let mut b = Aligned::new(4 * MIB as usize, byte);
    let mut at = from;
    while at < to {
        let n = (to - at).min(4 * MIB) as usize;
        f.write_all_at(&b.buf()[..n], at).unwrap_or_else(|e| panic!("write {} at {at}: {e}", dev.display()));
        at += n as u64;
    }
    f.sync_all().unwrap();
}

/// The first byte of `[from, to)` of `dev` that is not zero, read straight from the
/// device; `None` when all are zero.
pub fn first_nonzero(dev: &Path, from: u64, to: u64) -> Option<(u64, u8)> {
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(dev).unwrap();
    let mut b = Aligned::new(4 * MIB as usize, 0xff);
    let mut at = from;
    while at < to {
        let n = (to - at).min(4 * MIB) as usize;
        let buf = &mut b.buf()[..n];
        f.read_exact_at(buf, at).unwrap_or_else(|e| panic!("read {} at {at}: {e}", dev.display()));
        if let Some(i) = buf.iter().position(|&x| x != 0) {
            return Some((at + i as u64, buf[i]));
        }
        at += n as u64;
    }
    None
}

/// Size of a block device.
pub fn dev_size(dev: &Path) -> u64 {
    sh("blockdev", &["--getsize64", dev.to_str().unwrap()]).parse().unwrap()
}

/// The kernel partition of volume `id` on `drive`.
pub fn volume_dev(drive: &LoopDrive, id: &str) -> PathBuf {
    let entry = gpt_entries(&drive.dev).into_iter().find(|e| e.uuid.eq_ignore_ascii_case(id)).unwrap_or_else(|| panic!("no GPT entry of {id}"));
    let parts = kernel_parts(&drive.dev);
    let (name, _, _) = parts.iter().find(|(_, s, _)| *s == entry.start).unwrap_or_else(|| panic!("no kernel partition at {}: {parts:?}", entry.start));
    Path::new("/dev").join(name)
}

/// Asserts the volume `id` reads back only zeros, all of it.
pub fn assert_zeros(drive: &LoopDrive, id: &str, what: &str) {
    let dev = volume_dev(drive, id);
    let size = dev_size(&dev);
    if let Some((at, b)) = first_nonzero(&dev, 0, size) {
        panic!("{what}: volume {id} ({} bytes) shows byte {b:#x} at {at}, which its tenant never wrote", size);
    }
}

/// The drive's entry in `ctl drives`.
pub fn drive_listed(agent: &Agent, d: &LoopDrive) -> serde_json::Value {
    drive_by_path(&agent.ctl_drives(), &d.dev).cloned().unwrap_or_else(|| panic!("{} not listed", d.dev.display()))
}

/// Waits (60 s at most) until nothing is being cleaned on the drive.
pub fn wait_clean(agent: &Agent, d: &LoopDrive) {
    let start = Instant::now();
    loop {
        let v = drive_listed(agent, d);
        if v.get("cleaning").is_none() {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "still cleaning after 60s: {v}; log:\n{}", agent.log_tail(30));
        std::thread::sleep(Duration::from_millis(50));
    }
}


/// Sectors of 512 bytes written to a whole disk so far (`/sys/block/<dev>/stat`, field 7).
pub fn sectors_written(dev: &Path) -> u64 {
    let name = dev.file_name().unwrap().to_string_lossy().into_owned();
    let stat = std::fs::read_to_string(format!("/sys/block/{name}/stat")).expect("disk stat");
    stat.split_whitespace().nth(6).expect("field 7").parse().expect("a number")
}
