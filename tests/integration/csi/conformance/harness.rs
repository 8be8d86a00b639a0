//! The conformance suite's harness: one agent over a few loop drives, the host state a
//! refused request must not change, a report that collects every violation, request
//! builders and the spec's well-formedness rules for names and topology.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;
use drivelet::grpc::proto::csi;
use tonic::{Code, Response, Status};

/// Topology key naming the node every volume lives on.
pub(crate) const NODE_KEY: &str = "topology.drivelet.io/node";
/// Topology key the harness configures with `zone-a`.
pub(crate) const ZONE_KEY: &str = "topology.kubernetes.io/zone";
/// A volume id no test ever creates.
pub(crate) const UNKNOWN_ID: &str = "3d1f00c7-0000-4000-8000-00000000dead";

pub(crate) const MIB_I: i64 = MIB as i64;
pub(crate) const GIB_I: i64 = GIB as i64;

// ---------------------------------------------------------------------------------
// Harness: one agent over a few loop drives, the host state a refusal must not change,
// and a report that collects every violation.
// ---------------------------------------------------------------------------------

/// One agent over loop drives in a temporary directory. Fields drop in order: the agent
/// first, then every mount under the directory, then the drives, then the directory.
pub(crate) struct Fixture {
    pub(crate) agent: Agent,
    pub(crate) _unmount: Unmounter,
    pub(crate) drives: Vec<LoopDrive>,
    /// The allowed root (`volumes.allowed_roots`).
    pub(crate) kubelet: PathBuf,
    /// A directory outside the allowed root; `kubelet/escape` is a symlink to it.
    pub(crate) outside: PathBuf,
    pub(crate) tmp: tempfile::TempDir,
}

impl Fixture {
    pub(crate) fn start(sizes: &[u64]) -> Fixture {
        require_host();
        let tmp = short_tempdir();
        let drives: Vec<LoopDrive> =
            sizes.iter().enumerate().map(|(i, s)| LoopDrive::new(tmp.path(), &format!("d{i}.img"), *s)).collect();
        sh("udevadm", &["settle"]);
        let kubelet = tmp.path().join("kubelet");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(kubelet.join("plugins")).unwrap();
        std::fs::create_dir_all(kubelet.join("pods")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, kubelet.join("escape")).unwrap();
        let unmount = Unmounter(tmp.path().to_path_buf());
        let agent = Agent::start(tmp.path(), AgentOpts::default());
        Fixture { agent, _unmount: unmount, drives, kubelet, outside, tmp }
    }

    /// A staging path (the CO creates the directory).
    pub(crate) fn staging(&self, name: &str) -> PathBuf {
        let p = self.kubelet.join("plugins/staging").join(name);
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    /// A target path whose parent exists (the CO's duty); the target itself does not.
    pub(crate) fn target(&self, pod: &str, name: &str) -> PathBuf {
        let dir = self.kubelet.join("pods").join(pod).join("volumes");
        std::fs::create_dir_all(&dir).unwrap();
        dir.join(name)
    }

    pub(crate) fn state(&self) -> HostState {
        let mut mounts = mounts_under(self.tmp.path());
        mounts.sort();
        let mut outside = Vec::new();
        walk(&self.outside, &mut outside);
        outside.sort();
        HostState { parts: self.drives.iter().map(|d| kernel_parts(&d.dev)).collect(), mounts, outside }
    }

    /// Kernel device node of the one partition `after` has and `before` had not.
    pub(crate) fn new_partition(&self, before: &HostState, after: &HostState) -> Option<(usize, PathBuf, u64)> {
        let mut added = Vec::new();
        for (i, (b, a)) in before.parts.iter().zip(&after.parts).enumerate() {
            for p in a.iter().filter(|p| !b.contains(p)) {
                added.push((i, PathBuf::from(format!("/dev/{}", p.0)), p.2));
            }
        }
        (added.len() == 1).then(|| added.remove(0))
    }
}

pub(crate) fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        out.push(p.clone());
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            walk(&p, out);
        }
    }
}

/// What a refused request must leave as it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostState {
    /// Kernel partitions of each test drive.
    pub(crate) parts: Vec<Vec<(String, u64, u64)>>,
    /// Mount points under the test directory.
    pub(crate) mounts: Vec<PathBuf>,
    /// Everything under the directory outside the allowed root.
    pub(crate) outside: Vec<PathBuf>,
}

/// The filesystem signature on a device, if any (`blkid -p` reads the device itself).
pub(crate) fn fs_signature(dev: &Path) -> Option<String> {
    let out = Command::new("blkid").args(["-p", "-o", "value", "-s", "TYPE"]).arg(dev).output().expect("blkid");
    let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!s.is_empty()).then_some(s)
}

/// Every violated rule of one test, reported together at the end.
pub(crate) struct Report(Vec<String>);

impl Report {
    pub(crate) fn new() -> Report {
        Report(Vec::new())
    }

    pub(crate) fn fail(&mut self, msg: String) {
        self.0.push(msg);
    }

    pub(crate) fn check(&mut self, cond: bool, msg: impl FnOnce() -> String) -> bool {
        if !cond {
            self.0.push(msg());
        }
        cond
    }

    /// Expects `got` to fail with `want`, with a message and without details [Error
    /// Scheme]. True when it did.
    pub(crate) fn code<T>(&mut self, what: &str, got: Result<T, Status>, want: Code) -> bool {
        match got {
            Ok(_) => {
                self.fail(format!("{what}: want {want:?}, got OK"));
                false
            }
            Err(s) if s.code() == want => {
                self.check(!s.message().is_empty(), || format!("{what}: {want:?} without a message"));
                self.check(s.details().is_empty(), || format!("{what}: status details must be empty"));
                true
            }
            Err(s) => {
                self.fail(format!("{what}: want {want:?}, got {:?}: {}", s.code(), s.message()));
                false
            }
        }
    }

    /// Like [`Report::code`], and the message names each of `words` (the value asked
    /// for and what would be accepted).
    pub(crate) fn code_naming<T>(&mut self, what: &str, got: Result<T, Status>, want: Code, words: &[&str]) -> bool {
        let message = got.as_ref().err().map(|s| s.message().to_string()).unwrap_or_default();
        if !self.code(what, got, want) {
            return false;
        }
        let missing: Vec<&str> = words.iter().copied().filter(|w| !message.contains(w)).collect();
        self.check(missing.is_empty(), || format!("{what}: the message {message:?} does not name {missing:?}"))
    }

    /// Expects `got` to fail with one of `want`, where the spec's tables overlap.
    pub(crate) fn code_any<T>(&mut self, what: &str, got: Result<T, Status>, want: &[Code]) -> bool {
        match got {
            Err(s) if want.contains(&s.code()) => {
                let code = s.code();
                self.code(what, Err::<T, _>(s), code)
            }
            Ok(_) => {
                self.fail(format!("{what}: want one of {want:?}, got OK"));
                false
            }
            Err(s) => {
                self.fail(format!("{what}: want one of {want:?}, got {:?}: {}", s.code(), s.message()));
                false
            }
        }
    }

    /// Expects `got` to succeed.
    pub(crate) fn ok<T>(&mut self, what: &str, got: Result<Response<T>, Status>) -> Option<T> {
        match got {
            Ok(r) => Some(r.into_inner()),
            Err(s) => {
                self.fail(format!("{what}: want OK, got {:?}: {}", s.code(), s.message()));
                None
            }
        }
    }

    /// Expects the host to be as it was.
    pub(crate) fn unchanged(&mut self, what: &str, fx: &Fixture, before: &HostState) {
        let now = fx.state();
        self.check(now == *before, || format!("{what}: a refused request changed the host:\n    before {before:?}\n    after  {now:?}"));
    }

    /// Fails the test listing every violation, with the tail of the agent's log.
    pub(crate) fn finish(self, fx: &Fixture) {
        if self.0.is_empty() {
            return;
        }
        let log = fx.agent.logs();
        let lines: Vec<&str> = log.lines().filter(|l| !l.contains(r#""level":"DEBUG""#)).collect();
        let tail = lines[lines.len().saturating_sub(15)..].join("\n");
        panic!("{} conformance violation(s):\n  - {}\n\nagent log tail (info and above):\n{tail}", self.0.len(), self.0.join("\n  - "));
    }
}

/// A step the rest of a test depends on: it must succeed.
pub(crate) fn must<T>(what: &str, got: Result<Response<T>, Status>) -> T {
    match got {
        Ok(r) => r.into_inner(),
        Err(s) => panic!("{what}: {:?}: {}", s.code(), s.message()),
    }
}

/// Polls GetCapacity until `want` holds or 10 s pass; returns the last answer and whether
/// it held. The drive inventory learns of partition changes from udev, after the RPC
/// that made them returned, so capacity is checked as eventually right, not at once.
pub(crate) async fn capacity_settles(
    c: &mut Csi,
    req: csi::GetCapacityRequest,
    want: impl Fn(&csi::GetCapacityResponse) -> bool,
) -> (csi::GetCapacityResponse, bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let got = must("GetCapacity", c.ctrl.get_capacity(req.clone()).await);
        if want(&got) || std::time::Instant::now() > deadline {
            let held = want(&got);
            return (got, held);
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
}

/// Checks the fields of a created volume [CreateVolume, Volume] and returns it.
pub(crate) fn created(r: &mut Report, what: &str, resp: Option<csi::CreateVolumeResponse>, required: i64, limit: i64) -> Option<csi::Volume> {
    let resp = resp?;
    let Some(v) = resp.volume else {
        r.fail(format!("{what}: the response has no volume"));
        return None;
    };
    r.check(!v.volume_id.is_empty() && v.volume_id.len() <= 128, || format!("{what}: volume_id {:?} is empty or too long", v.volume_id));
    r.check(v.capacity_bytes > 0, || format!("{what}: capacity_bytes {} is not positive", v.capacity_bytes));
    if required > 0 {
        r.check(v.capacity_bytes >= required, || format!("{what}: capacity {} below required_bytes {required}", v.capacity_bytes));
    }
    if limit > 0 {
        r.check(v.capacity_bytes <= limit, || format!("{what}: capacity {} above limit_bytes {limit}", v.capacity_bytes));
    }
    r.check(
        v.accessible_topology.iter().any(|t| t.segments.get(NODE_KEY).map(String::as_str) == Some(NODE)),
        || format!("{what}: accessible_topology {:?} does not name node {NODE}", v.accessible_topology),
    );
    r.check(v.content_source.is_none(), || format!("{what}: content_source set on an empty volume"));
    Some(v)
}

/// A plugin name in domain notation, 63 characters at most [GetPluginInfo].
pub(crate) fn valid_plugin_name(n: &str) -> bool {
    let b = n.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'.')
}

/// A topology key: optional DNS prefix (lower case) and a name, each at most 63
/// characters [Topology].
pub(crate) fn valid_topology_key(k: &str) -> bool {
    let word = |s: &str, lower: bool, extra: &[u8]| {
        let b = s.as_bytes();
        let edge = |c: u8| c.is_ascii_digit() || if lower { c.is_ascii_lowercase() } else { c.is_ascii_alphabetic() };
        !b.is_empty()
            && b.len() <= 63
            && edge(b[0])
            && edge(b[b.len() - 1])
            && b.iter().all(|c| edge(*c) || extra.contains(c))
    };
    match k.rsplit_once('/') {
        Some((prefix, name)) => word(prefix, true, b"-.") && word(name, false, b"-_."),
        None => word(k, false, b"-_."),
    }
}

/// A topology value: 1 to 63 characters, alphanumeric at both ends [Topology].
pub(crate) fn valid_topology_value(v: &str) -> bool {
    let b = v.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
}

/// Usable bytes of a blank drive: 1 MiB aligned, GPT at both ends.
pub(crate) fn usable(size: u64) -> i64 {
    let (start, end) = drivelet::disk::gpt::usable_region(size, 512).expect("a drive big enough for a GPT");
    (end - start) as i64
}

// ---------------------------------------------------------------------------------

/// Runs one conformance test: an agent over fresh loop drives of `sizes`, a client of
/// its CSI socket, and a report that fails the test with every violation (and the
/// agent's log) once `test` is done.
pub(crate) fn conform(sizes: &[u64], test: impl AsyncFnOnce(&Fixture, &mut Csi, &mut Report)) {
    let fx = Fixture::start(sizes);
    let mut r = Report::new();
    rt().block_on(async {
        let mut c = Csi::connect(&fx.agent).await;
        test(&fx, &mut c, &mut r).await;
    });
    r.finish(&fx);
}
