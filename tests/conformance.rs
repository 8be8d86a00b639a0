//! Our conformance suite: the CSI v1.12 MUSTs drivelet serves, checked over the real
//! socket against real loop drives, in the spirit of the community's csi-sanity.
//!
//! Rules this suite holds drivelet to (spec sections in brackets):
//! - a request missing a REQUIRED field, or with an invalid or unsupported value, is
//!   INVALID_ARGUMENT [Error Scheme]; every error carries a message and no details;
//! - every RPC is idempotent: repeating a call that succeeded succeeds with the same
//!   result [CreateVolume, DeleteVolume, NodeStage/Unstage/Publish/UnpublishVolume];
//! - each RPC's own error table: NOT_FOUND for unknown volumes, ALREADY_EXISTS for an
//!   incompatible repeat, FAILED_PRECONDITION for a volume in the wrong state or asked
//!   for a capability it does not have, OUT_OF_RANGE for a capacity range that can never
//!   be met, RESOURCE_EXHAUSTED for topology or space that cannot be had;
//! - what is advertised is served and everything else is UNIMPLEMENTED
//!   [ControllerGetCapabilities, NodeGetCapabilities, GetPluginCapabilities];
//! - response fields: ids present, capacity within the requested range, topology naming
//!   this node, plugin name in domain notation;
//! - access modes and `readonly` are enforced on the node, not just recorded;
//! - a refused request changes nothing: no new kernel partition, no new mount, no
//!   filesystem made, nothing created outside the allowed roots.
//!
//! Each test walks a table of cases and reports every violated rule at its end, so one
//! bug does not hide the next; steps the rest depends on fail at once. Where the spec
//! is ambiguous the suite expects what csi-sanity expects, or accepts either reading
//! where csi-sanity has no case, and says so at the case. Capacity is checked as
//! eventually right: the drive inventory hears of partition changes from udev.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use drivelet::grpc::proto::csi;
use drivelet::grpc::proto::csi::volume_capability::access_mode::Mode;
use drivelet::grpc::proto::csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use tonic::{Code, Response, Status};

/// Topology key naming the node every volume lives on.
const NODE_KEY: &str = "topology.drivelet.io/node";
/// Topology key the harness configures with `zone-a`.
const ZONE_KEY: &str = "topology.kubernetes.io/zone";
/// A volume id no test ever creates.
const UNKNOWN_ID: &str = "3d1f00c7-0000-4000-8000-00000000dead";

const MIB_I: i64 = MIB as i64;
const GIB_I: i64 = GIB as i64;

// ---------------------------------------------------------------------------------
// Harness: one agent over a few loop drives, the host state a refusal must not change,
// and a report that collects every violation.
// ---------------------------------------------------------------------------------

/// One agent over loop drives in a temporary directory. Fields drop in order: the agent
/// first, then every mount under the directory, then the drives, then the directory.
struct Fixture {
    agent: Agent,
    _unmount: Unmounter,
    drives: Vec<LoopDrive>,
    /// The allowed root (`volumes.allowed_roots`).
    kubelet: PathBuf,
    /// A directory outside the allowed root; `kubelet/escape` is a symlink to it.
    outside: PathBuf,
    tmp: tempfile::TempDir,
}

impl Fixture {
    fn start(sizes: &[u64]) -> Fixture {
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
    fn staging(&self, name: &str) -> PathBuf {
        let p = self.kubelet.join("plugins/staging").join(name);
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    /// A target path whose parent exists (the CO's duty); the target itself does not.
    fn target(&self, pod: &str, name: &str) -> PathBuf {
        let dir = self.kubelet.join("pods").join(pod).join("volumes");
        std::fs::create_dir_all(&dir).unwrap();
        dir.join(name)
    }

    fn state(&self) -> HostState {
        let mut mounts = mounts_under(self.tmp.path());
        mounts.sort();
        let mut outside = Vec::new();
        walk(&self.outside, &mut outside);
        outside.sort();
        HostState { parts: self.drives.iter().map(|d| kernel_parts(&d.dev)).collect(), mounts, outside }
    }

    /// Kernel device node of the one partition `after` has and `before` had not.
    fn new_partition(&self, before: &HostState, after: &HostState) -> Option<(usize, PathBuf, u64)> {
        let mut added = Vec::new();
        for (i, (b, a)) in before.parts.iter().zip(&after.parts).enumerate() {
            for p in a.iter().filter(|p| !b.contains(p)) {
                added.push((i, PathBuf::from(format!("/dev/{}", p.0)), p.2));
            }
        }
        (added.len() == 1).then(|| added.remove(0))
    }
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
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
struct HostState {
    /// Kernel partitions of each test drive.
    parts: Vec<Vec<(String, u64, u64)>>,
    /// Mount points under the test directory.
    mounts: Vec<PathBuf>,
    /// Everything under the directory outside the allowed root.
    outside: Vec<PathBuf>,
}

/// The filesystem signature on a device, if any (`blkid -p` reads the device itself).
fn fs_signature(dev: &Path) -> Option<String> {
    let out = Command::new("blkid").args(["-p", "-o", "value", "-s", "TYPE"]).arg(dev).output().expect("blkid");
    let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!s.is_empty()).then_some(s)
}

/// Every violated rule of one test, reported together at the end.
struct Report(Vec<String>);

impl Report {
    fn new() -> Report {
        Report(Vec::new())
    }

    fn fail(&mut self, msg: String) {
        self.0.push(msg);
    }

    fn check(&mut self, cond: bool, msg: impl FnOnce() -> String) -> bool {
        if !cond {
            self.0.push(msg());
        }
        cond
    }

    /// Expects `got` to fail with `want`, with a message and without details [Error
    /// Scheme]. True when it did.
    fn code<T>(&mut self, what: &str, got: Result<T, Status>, want: Code) -> bool {
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

    /// Expects `got` to fail with one of `want`, where the spec's tables overlap.
    fn code_any<T>(&mut self, what: &str, got: Result<T, Status>, want: &[Code]) -> bool {
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
    fn ok<T>(&mut self, what: &str, got: Result<Response<T>, Status>) -> Option<T> {
        match got {
            Ok(r) => Some(r.into_inner()),
            Err(s) => {
                self.fail(format!("{what}: want OK, got {:?}: {}", s.code(), s.message()));
                None
            }
        }
    }

    /// Expects the host to be as it was.
    fn unchanged(&mut self, what: &str, fx: &Fixture, before: &HostState) {
        let now = fx.state();
        self.check(now == *before, || format!("{what}: a refused request changed the host:\n    before {before:?}\n    after  {now:?}"));
    }

    /// Fails the test listing every violation, with the tail of the agent's log.
    fn finish(self, fx: &Fixture) {
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
fn must<T>(what: &str, got: Result<Response<T>, Status>) -> T {
    match got {
        Ok(r) => r.into_inner(),
        Err(s) => panic!("{what}: {:?}: {}", s.code(), s.message()),
    }
}

/// Polls GetCapacity until `want` holds or 10 s pass; returns the last answer and whether
/// it held. The drive inventory learns of partition changes from udev, after the RPC
/// that made them returned, so capacity is checked as eventually right, not at once.
async fn capacity_settles(
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

fn layout_req(layout: &str) -> csi::GetCapacityRequest {
    csi::GetCapacityRequest { parameters: kv(&[("layout", layout)]), ..Default::default() }
}

// ---------------------------------------------------------------------------------
// Request builders.
// ---------------------------------------------------------------------------------

fn kv(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn topo(pairs: &[(&str, &str)]) -> csi::Topology {
    csi::Topology { segments: kv(pairs) }
}

fn mount(mode: Mode, fs: &str, flags: &[&str]) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs.into(),
            mount_flags: flags.iter().map(|f| f.to_string()).collect(),
            ..Default::default()
        })),
    }
}

fn block(mode: Mode) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    }
}

fn vol_req(name: &str, required: i64, limit: i64, caps: Vec<csi::VolumeCapability>, params: &[(&str, &str)]) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(csi::CapacityRange { required_bytes: required, limit_bytes: limit }),
        volume_capabilities: caps,
        parameters: kv(params),
        ..Default::default()
    }
}

fn del_req(id: &str) -> csi::DeleteVolumeRequest {
    csi::DeleteVolumeRequest { volume_id: id.into(), ..Default::default() }
}

fn unstage_req(id: &str, path: &Path) -> csi::NodeUnstageVolumeRequest {
    csi::NodeUnstageVolumeRequest { volume_id: id.into(), staging_target_path: path.display().to_string() }
}

fn unpublish_req(id: &str, target: &Path) -> csi::NodeUnpublishVolumeRequest {
    csi::NodeUnpublishVolumeRequest { volume_id: id.into(), target_path: target.display().to_string() }
}

fn validate_req(id: &str, caps: Vec<csi::VolumeCapability>) -> csi::ValidateVolumeCapabilitiesRequest {
    csi::ValidateVolumeCapabilitiesRequest { volume_id: id.into(), volume_capabilities: caps, ..Default::default() }
}

/// Checks the fields of a created volume [CreateVolume, Volume] and returns it.
fn created(r: &mut Report, what: &str, resp: Option<csi::CreateVolumeResponse>, required: i64, limit: i64) -> Option<csi::Volume> {
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
fn valid_plugin_name(n: &str) -> bool {
    let b = n.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'.')
}

/// A topology key: optional DNS prefix (lower case) and a name, each at most 63
/// characters [Topology].
fn valid_topology_key(k: &str) -> bool {
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
fn valid_topology_value(v: &str) -> bool {
    let b = v.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
}

/// Usable bytes of a blank drive: 1 MiB aligned, GPT at both ends.
fn usable(size: u64) -> i64 {
    (((size - 33 * 512) / MIB * MIB) - MIB) as i64
}

// ---------------------------------------------------------------------------------
// Identity, capabilities and everything not advertised.
// ---------------------------------------------------------------------------------

#[test]
fn capabilities_advertised_are_served_and_everything_else_is_unimplemented() {
    let fx = Fixture::start(&[GIB]);
    let mut r = Report::new();
    rt().block_on(async {
        let mut c = Csi::connect(&fx.agent).await;

        // GetPluginInfo: name in domain notation, a version, stable across calls.
        let info = must("GetPluginInfo", c.id.get_plugin_info(csi::GetPluginInfoRequest {}).await);
        r.check(valid_plugin_name(&info.name), || format!("GetPluginInfo name {:?} is not domain notation of <= 63 characters", info.name));
        r.check(!info.vendor_version.is_empty(), || "GetPluginInfo vendor_version is empty".into());
        let again = must("GetPluginInfo again", c.id.get_plugin_info(csi::GetPluginInfoRequest {}).await);
        r.check(again == info, || format!("GetPluginInfo changed between calls: {info:?} then {again:?}"));

        // Probe: ready (an unset `ready` also means ready), and again.
        for i in 0..2 {
            if let Some(p) = r.ok("Probe", c.id.probe(csi::ProbeRequest {}).await) {
                r.check(p.ready != Some(false), || format!("Probe #{i} says not ready after start-up"));
            }
        }

        // The three capability lists: known values only, stable across calls, and
        // including everything drivelet implements.
        use csi::controller_service_capability::{rpc::Type as CR, Type as CT};
        use csi::node_service_capability::{rpc::Type as NR, Type as NT};
        use csi::plugin_capability::{service::Type as S, Type as PT};
        let pc = must("GetPluginCapabilities", c.id.get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {}).await);
        let cc = must("ControllerGetCapabilities", c.ctrl.controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {}).await);
        let nc = must("NodeGetCapabilities", c.node.node_get_capabilities(csi::NodeGetCapabilitiesRequest {}).await);
        let pc2 = must("GetPluginCapabilities again", c.id.get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {}).await);
        let cc2 = must("ControllerGetCapabilities again", c.ctrl.controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {}).await);
        let nc2 = must("NodeGetCapabilities again", c.node.node_get_capabilities(csi::NodeGetCapabilitiesRequest {}).await);
        r.check(pc2 == pc && cc2 == cc && nc2 == nc, || "a capability list changed between calls".into());
        use csi::plugin_capability::volume_expansion::Type as VE;
        let mut plugin = Vec::new();
        let mut expansion = Vec::new();
        for cap in &pc.capabilities {
            match &cap.r#type {
                Some(PT::Service(s)) if S::try_from(s.r#type).is_ok_and(|t| t != S::Unknown) => plugin.push(S::try_from(s.r#type).unwrap()),
                Some(PT::VolumeExpansion(e)) if VE::try_from(e.r#type).is_ok_and(|t| t != VE::Unknown) => expansion.push(VE::try_from(e.r#type).unwrap()),
                other => r.fail(format!("GetPluginCapabilities lists {other:?}: an unknown service or expansion type")),
            }
        }
        let mut ctrl = Vec::new();
        for cap in &cc.capabilities {
            match &cap.r#type {
                Some(CT::Rpc(rpc)) if CR::try_from(rpc.r#type).is_ok_and(|t| t != CR::Unknown) => ctrl.push(CR::try_from(rpc.r#type).unwrap()),
                other => r.fail(format!("ControllerGetCapabilities lists {other:?}")),
            }
        }
        let mut node = Vec::new();
        for cap in &nc.capabilities {
            match &cap.r#type {
                Some(NT::Rpc(rpc)) if NR::try_from(rpc.r#type).is_ok_and(|t| t != NR::Unknown) => node.push(NR::try_from(rpc.r#type).unwrap()),
                other => r.fail(format!("NodeGetCapabilities lists {other:?}")),
            }
        }
        for s in [S::ControllerService, S::VolumeAccessibilityConstraints] {
            r.check(plugin.contains(&s), || format!("plugin capabilities {plugin:?} lack {s:?}"));
        }
        for t in [CR::CreateDeleteVolume, CR::GetCapacity, CR::SingleNodeMultiWriter, CR::CloneVolume] {
            r.check(ctrl.contains(&t), || format!("controller capabilities {ctrl:?} lack {t:?}"));
        }
        for t in [NR::StageUnstageVolume, NR::SingleNodeMultiWriter] {
            r.check(node.contains(&t), || format!("node capabilities {node:?} lack {t:?}"));
        }
        // Volume expansion: ONLINE (partitions grow while published), with both RPCs.
        r.check(expansion == [VE::Online], || format!("plugin volume expansion {expansion:?}, want [Online]"));
        r.check(ctrl.contains(&CR::ExpandVolume) && node.contains(&NR::ExpandVolume), || {
            format!("online expansion without EXPAND_VOLUME on both services: controller {ctrl:?}, node {node:?}")
        });

        // NodeGetInfo: an id, no negative limit, and a topology (VOLUME_ACCESSIBILITY_CONSTRAINTS)
        // with well-formed keys and values that names this node.
        let ni = must("NodeGetInfo", c.node.node_get_info(csi::NodeGetInfoRequest {}).await);
        let ni2 = must("NodeGetInfo again", c.node.node_get_info(csi::NodeGetInfoRequest {}).await);
        r.check(ni2 == ni, || format!("NodeGetInfo changed between calls: {ni:?} then {ni2:?}"));
        r.check(ni.node_id == NODE, || format!("NodeGetInfo node_id {:?}, want {NODE}", ni.node_id));
        r.check(ni.max_volumes_per_node >= 0, || format!("max_volumes_per_node {} is negative", ni.max_volumes_per_node));
        match &ni.accessible_topology {
            None => r.fail("NodeGetInfo has no accessible_topology though VOLUME_ACCESSIBILITY_CONSTRAINTS is advertised".into()),
            Some(t) => {
                r.check(t.segments.get(NODE_KEY).map(String::as_str) == Some(NODE), || format!("node topology {t:?} lacks {NODE_KEY}={NODE}"));
                for (k, v) in &t.segments {
                    r.check(valid_topology_key(k), || format!("topology key {k:?} is malformed"));
                    r.check(valid_topology_value(v), || format!("topology value {v:?} of {k} is malformed"));
                }
            }
        }

        // Advertisement matches behaviour: every RPC behind an advertised capability is
        // served (answers anything but UNIMPLEMENTED), every other one is UNIMPLEMENTED
        // with a message. A real volume, so "unimplemented" is not mistaken for "not found".
        let vol = must("CreateVolume", c.ctrl.create_volume(vol_req("conf-id-vol", 16 * MIB_I, 0, vec![block_cap()], &[])).await);
        let id = vol.volume.unwrap().volume_id;
        let range = Some(csi::CapacityRange { required_bytes: 32 * MIB_I, limit_bytes: 0 });
        let path = fx.kubelet.join("pods/p0/volumes/x").display().to_string();
        let mut served = |what: &str, advertised: bool, got: Result<(), Status>| {
            if advertised {
                if let Err(s) = &got {
                    r.check(s.code() != Code::Unimplemented, || format!("{what} is advertised but UNIMPLEMENTED: {}", s.message()));
                }
            } else {
                r.code(&format!("{what} (not advertised)"), got, Code::Unimplemented);
            }
        };
        let has = |t: CR| ctrl.contains(&t);
        served(
            "CreateVolume",
            has(CR::CreateDeleteVolume),
            c.ctrl.create_volume(vol_req("conf-id-vol", 16 * MIB_I, 0, vec![block_cap()], &[])).await.map(drop),
        );
        served("DeleteVolume", has(CR::CreateDeleteVolume), c.ctrl.delete_volume(del_req(UNKNOWN_ID)).await.map(drop));
        served(
            "ControllerPublishVolume",
            has(CR::PublishUnpublishVolume),
            c.ctrl
                .controller_publish_volume(csi::ControllerPublishVolumeRequest {
                    volume_id: id.clone(),
                    node_id: NODE.into(),
                    volume_capability: Some(block_cap()),
                    ..Default::default()
                })
                .await
                .map(drop),
        );
        served(
            "ControllerUnpublishVolume",
            has(CR::PublishUnpublishVolume),
            c.ctrl
                .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest { volume_id: id.clone(), node_id: NODE.into(), ..Default::default() })
                .await
                .map(drop),
        );
        served("ListVolumes", has(CR::ListVolumes), c.ctrl.list_volumes(csi::ListVolumesRequest::default()).await.map(drop));
        served("GetCapacity", has(CR::GetCapacity), c.ctrl.get_capacity(csi::GetCapacityRequest::default()).await.map(drop));
        served(
            "CreateSnapshot",
            has(CR::CreateDeleteSnapshot),
            c.ctrl
                .create_snapshot(csi::CreateSnapshotRequest { source_volume_id: id.clone(), name: "conf-snap".into(), ..Default::default() })
                .await
                .map(drop),
        );
        served(
            "DeleteSnapshot",
            has(CR::CreateDeleteSnapshot),
            c.ctrl.delete_snapshot(csi::DeleteSnapshotRequest { snapshot_id: "conf-snap".into(), ..Default::default() }).await.map(drop),
        );
        served("ListSnapshots", has(CR::ListSnapshots), c.ctrl.list_snapshots(csi::ListSnapshotsRequest::default()).await.map(drop));
        served(
            "GetSnapshot",
            has(CR::GetSnapshot),
            c.ctrl.get_snapshot(csi::GetSnapshotRequest { snapshot_id: "conf-snap".into(), ..Default::default() }).await.map(drop),
        );
        served(
            "ControllerExpandVolume",
            has(CR::ExpandVolume),
            c.ctrl
                .controller_expand_volume(csi::ControllerExpandVolumeRequest { volume_id: id.clone(), capacity_range: range, ..Default::default() })
                .await
                .map(drop),
        );
        served(
            "ControllerGetVolume",
            has(CR::GetVolume),
            c.ctrl.controller_get_volume(csi::ControllerGetVolumeRequest { volume_id: id.clone() }).await.map(drop),
        );
        served(
            "ControllerModifyVolume",
            has(CR::ModifyVolume),
            c.ctrl
                .controller_modify_volume(csi::ControllerModifyVolumeRequest {
                    volume_id: id.clone(),
                    mutable_parameters: kv(&[("media", "ssd")]),
                    ..Default::default()
                })
                .await
                .map(drop),
        );
        let hasn = |t: NR| node.contains(&t);
        served(
            "NodeUnstageVolume",
            hasn(NR::StageUnstageVolume),
            c.node.node_unstage_volume(unstage_req(&id, &fx.kubelet.join("plugins/none"))).await.map(drop),
        );
        served(
            "NodeGetVolumeStats",
            hasn(NR::GetVolumeStats) || hasn(NR::VolumeCondition),
            c.node
                .node_get_volume_stats(csi::NodeGetVolumeStatsRequest { volume_id: id.clone(), volume_path: path.clone(), ..Default::default() })
                .await
                .map(drop),
        );
        served(
            "NodeExpandVolume",
            hasn(NR::ExpandVolume),
            c.node
                .node_expand_volume(csi::NodeExpandVolumeRequest { volume_id: id.clone(), volume_path: path, capacity_range: range, ..Default::default() })
                .await
                .map(drop),
        );
        let ch = fx.agent.csi().await;
        let groups = plugin.contains(&S::GroupControllerService);
        let mut group = csi::group_controller_client::GroupControllerClient::new(ch.clone());
        served(
            "GroupControllerGetCapabilities",
            groups,
            group.group_controller_get_capabilities(csi::GroupControllerGetCapabilitiesRequest {}).await.map(drop),
        );
        served(
            "CreateVolumeGroupSnapshot",
            groups,
            group
                .create_volume_group_snapshot(csi::CreateVolumeGroupSnapshotRequest {
                    name: "conf-group".into(),
                    source_volume_ids: vec![id.clone()],
                    ..Default::default()
                })
                .await
                .map(drop),
        );
        served(
            "DeleteVolumeGroupSnapshot",
            groups,
            group.delete_volume_group_snapshot(csi::DeleteVolumeGroupSnapshotRequest { group_snapshot_id: "g".into(), ..Default::default() }).await.map(drop),
        );
        served(
            "GetVolumeGroupSnapshot",
            groups,
            group.get_volume_group_snapshot(csi::GetVolumeGroupSnapshotRequest { group_snapshot_id: "g".into(), ..Default::default() }).await.map(drop),
        );
        let metadata = plugin.contains(&S::SnapshotMetadataService);
        let mut meta = csi::snapshot_metadata_client::SnapshotMetadataClient::new(ch);
        served(
            "GetMetadataAllocated",
            metadata,
            meta.get_metadata_allocated(csi::GetMetadataAllocatedRequest { snapshot_id: "s".into(), ..Default::default() }).await.map(drop),
        );
        served(
            "GetMetadataDelta",
            metadata,
            meta.get_metadata_delta(csi::GetMetadataDeltaRequest {
                base_snapshot_id: "s1".into(),
                target_snapshot_id: "s2".into(),
                ..Default::default()
            })
            .await
            .map(drop),
        );

        must("DeleteVolume", c.ctrl.delete_volume(del_req(&id)).await);
    });
    r.finish(&fx);
}

// ---------------------------------------------------------------------------------
// CreateVolume, DeleteVolume, ValidateVolumeCapabilities, GetCapacity.
// ---------------------------------------------------------------------------------

#[test]
fn create_delete_validate_and_capacity_follow_the_controller_tables() {
    let fx = Fixture::start(&[GIB, 2 * GIB]);
    let (small, large) = (usable(GIB), usable(2 * GIB));
    let mut r = Report::new();
    rt().block_on(async {
        let mut c = Csi::connect(&fx.agent).await;
        let clean = fx.state();
        assert!(clean.parts.iter().all(|p| p.is_empty()), "test drives start blank: {clean:?}");

        // --- GetCapacity, and that its bounds are ones CreateVolume honours.
        let all = must("GetCapacity", c.ctrl.get_capacity(csi::GetCapacityRequest::default()).await);
        r.check(all.available_capacity == small + large, || format!("available_capacity {} of two blank drives, want {}", all.available_capacity, small + large));
        r.check(all.maximum_volume_size.is_none_or(|m| (0..=all.available_capacity).contains(&m)), || {
            format!("maximum_volume_size {:?} is negative or above available {}", all.maximum_volume_size, all.available_capacity)
        });
        if let Some(max) = all.maximum_volume_size {
            // The largest size that may be used as required_bytes [GetCapacityResponse].
            let v = r.ok("CreateVolume with required_bytes = maximum_volume_size", c.ctrl.create_volume(vol_req("conf-c-max", max, 0, vec![mount_cap("")], &[])).await);
            if let Some(v) = created(&mut r, "CreateVolume at maximum_volume_size", v, max, 0) {
                must("DeleteVolume", c.ctrl.delete_volume(del_req(&v.volume_id)).await);
            }
        }
        for (fs, cap) in [("block", block_cap()), ("ext4", mount_cap("ext4")), ("xfs", mount_cap("xfs"))] {
            // The smallest size that may be used as limit_bytes with these capabilities
            // [GetCapacityResponse: the plugin SHALL take the capabilities into account].
            let g = must("GetCapacity", c.ctrl.get_capacity(csi::GetCapacityRequest { volume_capabilities: vec![cap.clone()], ..Default::default() }).await);
            let Some(min) = g.minimum_volume_size else { continue };
            r.check(min >= 0, || format!("minimum_volume_size {min} is negative"));
            let what = format!("CreateVolume {fs} with limit_bytes = minimum_volume_size {min}");
            let v = r.ok(&what, c.ctrl.create_volume(vol_req(&format!("conf-c-min-{fs}"), 0, min, vec![cap], &[])).await);
            if let Some(v) = created(&mut r, &what, v, 0, min) {
                must("DeleteVolume", c.ctrl.delete_volume(del_req(&v.volume_id)).await);
            }
        }
        r.unchanged("GetCapacity bound checks", &fx, &clean);
        // Let the inventory catch up with those creates and deletes before placing more.
        let (now, settled) = capacity_settles(&mut c, csi::GetCapacityRequest::default(), |g| g.available_capacity == all.available_capacity).await;
        r.check(settled, || format!("available_capacity {} 10 s after the volumes were deleted, want {}", now.available_capacity, all.available_capacity));

        // --- CreateVolume: bad input is INVALID_ARGUMENT and changes nothing.
        let good = || vol_req("conf-c-bad", 64 * MIB_I, 0, vec![mount_cap("ext4")], &[]);
        let with = |f: &dyn Fn(&mut csi::CreateVolumeRequest)| {
            let mut q = good();
            f(&mut q);
            q
        };
        let caps = |v: Vec<csi::VolumeCapability>| with(&move |q| q.volume_capabilities = v.clone());
        let cap_with = |f: &dyn Fn(&mut csi::VolumeCapability)| {
            let mut cap = mount_cap("ext4");
            f(&mut cap);
            caps(vec![cap])
        };
        let src = |t: csi::volume_content_source::Type| with(&move |q| q.volume_content_source = Some(csi::VolumeContentSource { r#type: Some(t.clone()) }));
        let range = |req: i64, lim: i64| with(&move |q| q.capacity_range = Some(csi::CapacityRange { required_bytes: req, limit_bytes: lim }));
        let params = |p: &[(&str, &str)]| {
            let p = kv(p);
            with(&move |q| q.parameters = p.clone())
        };
        let named = |n: String| with(&move |q| q.name = n.clone());
        let invalid: Vec<(&str, csi::CreateVolumeRequest)> = vec![
            ("no name", named(String::new())),
            ("no volume_capabilities", caps(vec![])),
            ("a capability without access_mode", cap_with(&|c| c.access_mode = None)),
            ("a capability without access_type", cap_with(&|c| c.access_type = None)),
            ("access mode UNKNOWN", cap_with(&|c| c.access_mode = Some(AccessMode { mode: Mode::Unknown as i32 }))),
            ("access mode 99 (not in the enum)", cap_with(&|c| c.access_mode = Some(AccessMode { mode: 99 }))),
            ("MULTI_NODE_READER_ONLY", caps(vec![mount(Mode::MultiNodeReaderOnly, "ext4", &[])])),
            ("MULTI_NODE_SINGLE_WRITER", caps(vec![mount(Mode::MultiNodeSingleWriter, "ext4", &[])])),
            ("MULTI_NODE_MULTI_WRITER block", caps(vec![block(Mode::MultiNodeMultiWriter)])),
            // "If ANY of the specified volume capabilities are not supported ... MUST" fail.
            ("one supported and one MULTI_NODE capability", caps(vec![mount_cap("ext4"), mount(Mode::MultiNodeMultiWriter, "ext4", &[])])),
            ("fs_type btrfs", caps(vec![mount_cap("btrfs")])),
            ("block and mount access at once", caps(vec![block_cap(), mount_cap("ext4")])),
            ("two different filesystems", caps(vec![mount_cap("ext4"), mount_cap("xfs")])),
            (
                "a snapshot content source (no CREATE_DELETE_SNAPSHOT)",
                src(csi::volume_content_source::Type::Snapshot(csi::volume_content_source::SnapshotSource { snapshot_id: "snap-1".into() })),
            ),
            ("a content source naming nothing", with(&|q| q.volume_content_source = Some(csi::VolumeContentSource { r#type: None }))),
            (
                "a volume content source with an empty id",
                src(csi::volume_content_source::Type::Volume(csi::volume_content_source::VolumeSource { volume_id: String::new() })),
            ),
            ("negative required_bytes", range(-1, 0)),
            ("negative limit_bytes", range(0, -1)),
            // A malformed range (an invalid field value), not one the plugin cannot serve.
            ("limit_bytes below required_bytes", range(64 * MIB_I, 32 * MIB_I)),
            ("unknown parameter", params(&[("meda", "ssd")])),
            ("media=tape", params(&[("media", "tape")])),
            ("layout=stripe", params(&[("layout", "stripe")])),
            ("mutable_parameters (no MODIFY_VOLUME)", with(&|q| q.mutable_parameters = kv(&[("media", "ssd")]))),
            ("a name of 129 bytes", named("n".repeat(129))),
            ("a name with U+0001", named("conf-c-\u{1}".into())),
            ("a name with U+007F", named("conf-c-\u{7f}".into())),
            ("a name with U+0085", named("conf-c-\u{85}".into())),
        ];
        for (what, q) in invalid {
            r.code(&format!("CreateVolume with {what}"), c.ctrl.create_volume(q).await, Code::InvalidArgument);
            r.unchanged(&format!("CreateVolume with {what}"), &fx, &clean);
        }

        // --- A clone of a volume this node does not hold (CLONE_VOLUME): NOT_FOUND.
        let q = src(csi::volume_content_source::Type::Volume(csi::volume_content_source::VolumeSource { volume_id: UNKNOWN_ID.into() }));
        r.code("CreateVolume cloning an unknown volume", c.ctrl.create_volume(q).await, Code::NotFound);
        r.unchanged("CreateVolume cloning an unknown volume", &fx, &clean);

        // --- Requisite topology without this node: RESOURCE_EXHAUSTED.
        for (what, req) in [
            ("another node", vec![topo(&[(NODE_KEY, "other-node")])]),
            ("another zone", vec![topo(&[(ZONE_KEY, "zone-b")])]),
            ("this node in another zone", vec![topo(&[(NODE_KEY, NODE), (ZONE_KEY, "zone-b")])]),
            ("two other nodes", vec![topo(&[(NODE_KEY, "n1")]), topo(&[(NODE_KEY, "n2")])]),
        ] {
            let q = with(&|q| q.accessibility_requirements = Some(csi::TopologyRequirement { requisite: req.clone(), preferred: vec![] }));
            r.code(&format!("CreateVolume requisite {what}"), c.ctrl.create_volume(q).await, Code::ResourceExhausted);
            r.unchanged(&format!("CreateVolume requisite {what}"), &fx, &clean);
        }

        // --- A capacity range no drive can ever meet: OUT_OF_RANGE.
        for (what, q) in [
            ("3 GiB, more than the largest drive", range(3 * GIB_I, 0)),
            ("i64::MAX bytes", range(i64::MAX, 0)),
            ("exactly 64 MiB + 1 byte (1 MiB alignment)", range(64 * MIB_I + 1, 64 * MIB_I + 1)),
            ("xfs within 64 MiB (xfs needs 300 MiB)", with(&|q| {
                q.capacity_range = Some(csi::CapacityRange { required_bytes: 0, limit_bytes: 64 * MIB_I });
                q.volume_capabilities = vec![mount_cap("xfs")];
            })),
            ("a whole drive within 100 MiB", with(&|q| {
                q.capacity_range = Some(csi::CapacityRange { required_bytes: 0, limit_bytes: 100 * MIB_I });
                q.parameters = kv(&[("layout", "drive")]);
            })),
        ] {
            r.code(&format!("CreateVolume {what}"), c.ctrl.create_volume(q).await, Code::OutOfRange);
            r.unchanged(&format!("CreateVolume {what}"), &fx, &clean);
        }

        // --- Valid creates: response fields, the partition behind them, idempotency.
        let mut ids = Vec::new();
        let long_a = format!("conf-c-long-{}", "a".repeat(116));
        let long_b = format!("conf-c-long-{}b", "a".repeat(115));
        assert_eq!((long_a.len(), long_b.len()), (128, 128));
        let valid: Vec<(&str, csi::CreateVolumeRequest, i64, i64)> = vec![
            ("an unaligned required_bytes", vol_req("conf-c-a", 64 * MIB_I + 1, 0, vec![mount_cap("ext4")], &[]), 64 * MIB_I + 1, 0),
            ("required = limit", vol_req("conf-c-exact", 32 * MIB_I, 32 * MIB_I, vec![mount_cap("ext4"), mount_cap("")], &[]), 32 * MIB_I, 32 * MIB_I),
            ("only limit_bytes", vol_req("conf-c-limit", 0, 40 * MIB_I, vec![block_cap()], &[]), 0, 40 * MIB_I),
            ("a range", vol_req("conf-c-range", 20 * MIB_I + 1, 30 * MIB_I, vec![block(Mode::SingleNodeMultiWriter)], &[]), 20 * MIB_I + 1, 30 * MIB_I),
            (
                "no capacity_range",
                csi::CreateVolumeRequest { capacity_range: None, ..vol_req("conf-c-default", 0, 0, vec![mount_cap("")], &[]) },
                0,
                0,
            ),
            ("all single-node modes", vol_req("conf-c-modes", 16 * MIB_I, 0, vec![
                mount(Mode::SingleNodeWriter, "ext4", &[]),
                mount(Mode::SingleNodeReaderOnly, "ext4", &[]),
                mount(Mode::SingleNodeSingleWriter, "ext4", &[]),
                mount(Mode::SingleNodeMultiWriter, "ext4", &["noatime"]),
            ], &[("media", "any"), ("layout", "partition"), ("csi.storage.k8s.io/pvc/name", "data")]), 16 * MIB_I, 0),
            ("a 128-byte name (csi-sanity maxlen)", vol_req(&long_a, 16 * MIB_I, 0, vec![block_cap()], &[]), 16 * MIB_I, 0),
            ("a second 128-byte name with the same 127-byte prefix", vol_req(&long_b, 16 * MIB_I, 0, vec![block_cap()], &[]), 16 * MIB_I, 0),
            ("a non-ASCII name", vol_req("conf-c-名前-ü", 16 * MIB_I, 0, vec![block_cap()], &[]), 16 * MIB_I, 0),
            // Only U+0000-U+0008, U+000B, U+000C, U+000E-U+001F, U+007F-U+009F are banned.
            ("a name with tab and newline", vol_req("conf-c-tab\there\nand", 16 * MIB_I, 0, vec![block_cap()], &[]), 16 * MIB_I, 0),
        ];
        for (what, q, req, lim) in valid {
            let what = format!("CreateVolume with {what}");
            let before = fx.state();
            let first = r.ok(&what, c.ctrl.create_volume(q.clone()).await);
            let Some(v) = created(&mut r, &what, first, req, lim) else { continue };
            let after = fx.state();
            match fx.new_partition(&before, &after) {
                Some((_, _, size)) => {
                    r.check(size as i64 == v.capacity_bytes, || format!("{what}: capacity {} but partition {size} bytes", v.capacity_bytes));
                }
                None => r.fail(format!("{what}: want exactly one new kernel partition: {before:?} -> {after:?}")),
            }
            r.check(after.mounts == before.mounts, || format!("{what}: CreateVolume mounted something"));
            // The same call again: OK, the same volume, nothing new [CreateVolume MUST be idempotent].
            let again = r.ok(&format!("{what}, repeated"), c.ctrl.create_volume(q).await).and_then(|x| x.volume);
            r.check(again.as_ref() == Some(&v), || format!("{what}: repeating returned {again:?}, first {v:?}"));
            r.unchanged(&format!("{what}, repeated"), &fx, &after);
            ids.push(v.volume_id);
        }
        let distinct: std::collections::BTreeSet<&String> = ids.iter().collect();
        r.check(distinct.len() == ids.len(), || format!("distinct names got the same volume id: {ids:?}"));

        // --- The same name, incompatible: ALREADY_EXISTS, nothing changes.
        let base = vol_req("conf-c-a", 64 * MIB_I + 1, 0, vec![mount_cap("ext4")], &[]);
        let existing = must("CreateVolume conf-c-a again", c.ctrl.create_volume(base.clone()).await).volume.unwrap();
        let before = fx.state();
        let alter = |f: &dyn Fn(&mut csi::CreateVolumeRequest)| {
            let mut q = base.clone();
            f(&mut q);
            q
        };
        for (what, q) in [
            ("a larger required_bytes", alter(&|q| q.capacity_range = Some(csi::CapacityRange { required_bytes: 128 * MIB_I, limit_bytes: 0 }))),
            ("a limit_bytes below its size", alter(&|q| q.capacity_range = Some(csi::CapacityRange { required_bytes: 0, limit_bytes: 32 * MIB_I }))),
            ("block access", alter(&|q| q.volume_capabilities = vec![block_cap()])),
            ("xfs", alter(&|q| q.volume_capabilities = vec![mount_cap("xfs")])),
            ("layout=drive", alter(&|q| q.parameters = kv(&[("layout", "drive")]))),
            ("media=ssd", alter(&|q| q.parameters = kv(&[("media", "ssd")]))),
        ] {
            r.code(&format!("CreateVolume of an existing name with {what}"), c.ctrl.create_volume(q).await, Code::AlreadyExists);
            r.unchanged(&format!("CreateVolume of an existing name with {what}"), &fx, &before);
        }
        // Both the ALREADY_EXISTS row (incompatible accessibility_requirements) and the
        // RESOURCE_EXHAUSTED row (cannot provision in the topology) fit; csi-sanity has
        // no case, so either is accepted.
        let q = alter(&|q| {
            q.accessibility_requirements = Some(csi::TopologyRequirement { requisite: vec![topo(&[(NODE_KEY, "other-node")])], preferred: vec![] })
        });
        r.code_any(
            "CreateVolume of an existing name with a requisite topology without this node",
            c.ctrl.create_volume(q).await,
            &[Code::AlreadyExists, Code::ResourceExhausted],
        );
        r.unchanged("CreateVolume of an existing name with a requisite topology without this node", &fx, &before);
        // ... and compatible: OK with the same volume.
        for (what, q) in [
            ("secrets", alter(&|q| q.secrets = kv(&[("password", "hunter2")]))),
            ("a Kubernetes parameter", alter(&|q| q.parameters = kv(&[("csi.storage.k8s.io/pvc/name", "data")]))),
            ("SINGLE_NODE_MULTI_WRITER", alter(&|q| q.volume_capabilities = vec![mount(Mode::SingleNodeMultiWriter, "ext4", &[])])),
            ("the default filesystem", alter(&|q| q.volume_capabilities = vec![mount_cap("")])),
            ("its exact size as the range", alter(&|q| {
                q.capacity_range = Some(csi::CapacityRange { required_bytes: existing.capacity_bytes, limit_bytes: existing.capacity_bytes })
            })),
            ("no capacity_range", alter(&|q| q.capacity_range = None)),
            ("a requisite topology with this node", alter(&|q| {
                q.accessibility_requirements = Some(csi::TopologyRequirement { requisite: vec![topo(&[(NODE_KEY, NODE)])], preferred: vec![] })
            })),
        ] {
            let what = format!("CreateVolume of an existing name with {what}");
            let v = r.ok(&what, c.ctrl.create_volume(q).await).and_then(|x| x.volume);
            r.check(v.as_ref() == Some(&existing), || format!("{what}: got {v:?}, want the existing {existing:?}"));
            r.unchanged(&what, &fx, &before);
        }

        // --- ValidateVolumeCapabilities.
        let blk = must("CreateVolume block", c.ctrl.create_volume(vol_req("conf-c-blk", 16 * MIB_I, 0, vec![block_cap()], &[])).await).volume.unwrap();
        let before = fx.state();
        r.code("ValidateVolumeCapabilities without volume_id", c.ctrl.validate_volume_capabilities(validate_req("", vec![mount_cap("ext4")])).await, Code::InvalidArgument);
        r.code(
            "ValidateVolumeCapabilities without capabilities",
            c.ctrl.validate_volume_capabilities(validate_req(&existing.volume_id, vec![])).await,
            Code::InvalidArgument,
        );
        r.code("ValidateVolumeCapabilities of an unknown volume", c.ctrl.validate_volume_capabilities(validate_req(UNKNOWN_ID, vec![mount_cap("ext4")])).await, Code::NotFound);
        for (what, id, caps) in [
            ("ext4 SINGLE_NODE_WRITER", &existing.volume_id, vec![mount_cap("ext4")]),
            ("the default fs, two single-node modes", &existing.volume_id, vec![mount(Mode::SingleNodeMultiWriter, "", &[]), mount(Mode::SingleNodeReaderOnly, "", &[])]),
            ("block SINGLE_NODE_SINGLE_WRITER", &blk.volume_id, vec![block(Mode::SingleNodeSingleWriter)]),
        ] {
            let q = validate_req(id, caps.clone());
            let got = r.ok(&format!("ValidateVolumeCapabilities {what}"), c.ctrl.validate_volume_capabilities(q.clone()).await);
            if let Some(got) = got {
                let confirmed = got.confirmed.as_ref().map(|c| c.volume_capabilities.clone());
                r.check(confirmed.as_ref() == Some(&caps), || format!("ValidateVolumeCapabilities {what}: want {caps:?} confirmed, got {got:?}"));
                let again = r.ok(&format!("ValidateVolumeCapabilities {what}, repeated"), c.ctrl.validate_volume_capabilities(q).await);
                r.check(again.as_ref() == Some(&got), || format!("ValidateVolumeCapabilities {what}: repeat answered {again:?}, first {got:?}"));
            }
        }
        for (what, id, caps, params) in [
            ("MULTI_NODE_MULTI_WRITER", &existing.volume_id, vec![mount(Mode::MultiNodeMultiWriter, "ext4", &[])], vec![]),
            ("one good and one MULTI_NODE capability", &existing.volume_id, vec![mount_cap("ext4"), mount(Mode::MultiNodeReaderOnly, "ext4", &[])], vec![]),
            ("btrfs", &existing.volume_id, vec![mount_cap("btrfs")], vec![]),
            ("xfs on an ext4 volume", &existing.volume_id, vec![mount_cap("xfs")], vec![]),
            ("block on a mount volume", &existing.volume_id, vec![block_cap()], vec![]),
            ("mount on a block volume", &blk.volume_id, vec![mount_cap("")], vec![]),
            ("layout=drive on a partition volume", &existing.volume_id, vec![mount_cap("ext4")], vec![("layout", "drive")]),
        ] {
            let q = csi::ValidateVolumeCapabilitiesRequest { parameters: kv(&params), ..validate_req(id, caps) };
            if let Some(got) = r.ok(&format!("ValidateVolumeCapabilities {what}"), c.ctrl.validate_volume_capabilities(q).await) {
                r.check(got.confirmed.is_none(), || format!("ValidateVolumeCapabilities {what}: confirmed {:?}", got.confirmed));
                r.check(!got.message.is_empty(), || format!("ValidateVolumeCapabilities {what}: unconfirmed without a message"));
            }
        }
        r.unchanged("ValidateVolumeCapabilities", &fx, &before);
        ids.push(blk.volume_id.clone());

        // --- DeleteVolume.
        r.code("DeleteVolume without volume_id", c.ctrl.delete_volume(del_req("")).await, Code::InvalidArgument);
        for id in [UNKNOWN_ID, "not-a-volume-id"] {
            // csi-sanity: "should succeed when an invalid volume id is used".
            r.ok(&format!("DeleteVolume of unknown {id}"), c.ctrl.delete_volume(del_req(id)).await);
            r.ok(&format!("DeleteVolume of unknown {id}, repeated"), c.ctrl.delete_volume(del_req(id)).await);
        }
        r.unchanged("DeleteVolume of unknown volumes", &fx, &before);
        for id in &ids {
            r.ok("DeleteVolume", c.ctrl.delete_volume(del_req(id)).await);
            r.ok("DeleteVolume, repeated", c.ctrl.delete_volume(del_req(id)).await);
        }
        r.unchanged("every volume deleted", &fx, &clean);
        r.code(
            "ValidateVolumeCapabilities of a deleted volume",
            c.ctrl.validate_volume_capabilities(validate_req(&existing.volume_id, vec![mount_cap("ext4")])).await,
            Code::NotFound,
        );
        let (back, settled) = capacity_settles(&mut c, csi::GetCapacityRequest::default(), |g| g.available_capacity == all.available_capacity).await;
        r.check(settled, || format!("available_capacity {} 10 s after deleting everything, was {}", back.available_capacity, all.available_capacity));

        // --- No room now (but a drive could hold it): RESOURCE_EXHAUSTED.
        let fill_a = must("CreateVolume filling the small drive", c.ctrl.create_volume(vol_req("conf-c-fill-a", small - 22 * MIB_I, 0, vec![block_cap()], &[])).await);
        let fill_b = must("CreateVolume filling the large drive", c.ctrl.create_volume(vol_req("conf-c-fill-b", large - 46 * MIB_I, 0, vec![block_cap()], &[])).await);
        let full = fx.state();
        let (g, settled) = capacity_settles(&mut c, csi::GetCapacityRequest::default(), |g| g.available_capacity == 68 * MIB_I).await;
        r.check(settled, || format!("available_capacity {} 10 s after filling the drives to 22 + 46 MiB", g.available_capacity));
        r.check(g.maximum_volume_size == Some(46 * MIB_I), || format!("maximum_volume_size {:?} with 22 and 46 MiB free", g.maximum_volume_size));
        for (what, q, want) in [
            ("100 MiB with 22 and 46 MiB left", vol_req("conf-c-nr1", 100 * MIB_I, 0, vec![block_cap()], &[]), Code::ResourceExhausted),
            ("the large drive's size, taken", vol_req("conf-c-nr2", large, 0, vec![block_cap()], &[]), Code::ResourceExhausted),
            ("a whole drive, none empty", vol_req("conf-c-nr3", 0, 0, vec![block_cap()], &[("layout", "drive")]), Code::ResourceExhausted),
            ("3 GiB, still more than any drive", vol_req("conf-c-nr4", 3 * GIB_I, 0, vec![block_cap()], &[]), Code::OutOfRange),
        ] {
            r.code(&format!("CreateVolume {what}"), c.ctrl.create_volume(q).await, want);
            r.unchanged(&format!("CreateVolume {what}"), &fx, &full);
        }
        for v in [fill_a, fill_b] {
            must("DeleteVolume", c.ctrl.delete_volume(del_req(&v.volume.unwrap().volume_id)).await);
        }
        r.unchanged("the end", &fx, &clean);
    });
    r.finish(&fx);
}

// ---------------------------------------------------------------------------------
// Topology requirements and whole-drive volumes.
// ---------------------------------------------------------------------------------

#[test]
fn topology_requirements_and_whole_drive_volumes_are_honoured() {
    let fx = Fixture::start(&[GIB, 2 * GIB]);
    let (small, large) = (usable(GIB), usable(2 * GIB));
    let mut r = Report::new();
    rt().block_on(async {
        let mut c = Csi::connect(&fx.agent).await;
        let clean = fx.state();
        let this = topo(&[(NODE_KEY, NODE)]);
        let other = topo(&[(NODE_KEY, "other-node")]);
        let zone = topo(&[(ZONE_KEY, "zone-a")]);
        let full = topo(&[(NODE_KEY, NODE), (ZONE_KEY, "zone-a")]);
        let req = |requisite: Vec<csi::Topology>, preferred: Vec<csi::Topology>| csi::TopologyRequirement { requisite, preferred };

        // --- Requisite lists that include this node, and preferred in any order: OK.
        for (i, (what, t)) in [
            ("requisite: another node, then this one", req(vec![other.clone(), this.clone()], vec![])),
            ("requisite: this node's zone only", req(vec![zone.clone()], vec![])),
            ("requisite: this node's full topology", req(vec![full.clone()], vec![])),
            ("preferred: another node first, both requisite", req(vec![other.clone(), this.clone()], vec![other.clone(), this.clone()])),
            ("preferred: this node first, both requisite", req(vec![this.clone(), other.clone()], vec![this.clone(), other.clone()])),
            ("preferred only, naming another node", req(vec![], vec![other.clone()])),
        ]
        .into_iter()
        .enumerate()
        {
            let q = csi::CreateVolumeRequest {
                accessibility_requirements: Some(t.clone()),
                ..vol_req(&format!("conf-t-ok-{i}"), 16 * MIB_I, 0, vec![block_cap()], &[])
            };
            let what = format!("CreateVolume with {what}");
            let got = r.ok(&what, c.ctrl.create_volume(q.clone()).await);
            let Some(v) = created(&mut r, &what, got, 16 * MIB_I, 0) else { continue };
            // Accessible from at least one requisite topology [TopologyRequirement].
            if !t.requisite.is_empty() {
                let satisfied = t.requisite.iter().any(|want| {
                    v.accessible_topology.iter().any(|got| want.segments.iter().all(|(k, val)| got.segments.get(k) == Some(val)))
                });
                r.check(satisfied, || format!("{what}: accessible_topology {:?} meets none of {:?}", v.accessible_topology, t.requisite));
            }
            let again = r.ok(&format!("{what}, repeated"), c.ctrl.create_volume(q).await).and_then(|x| x.volume);
            r.check(again.as_ref() == Some(&v), || format!("{what}: repeat gave {again:?}, first {v:?}"));
            must("DeleteVolume", c.ctrl.delete_volume(del_req(&v.volume_id)).await);
        }
        r.unchanged("topology cases", &fx, &clean);
        let (now, settled) = capacity_settles(&mut c, layout_req("drive"), |g| g.available_capacity == small + large).await;
        r.check(settled, || format!("layout=drive available_capacity {} 10 s after the topology volumes were deleted", now.available_capacity));

        // --- Whole drives: each layout=drive volume takes one empty drive entirely.
        let whole = |name: &str, required: i64, limit: i64| vol_req(name, required, limit, vec![block_cap()], &[("layout", "drive")]);
        let g = must("GetCapacity layout=drive", c.ctrl.get_capacity(layout_req("drive")).await);
        r.check(g.maximum_volume_size == Some(large), || format!("layout=drive maximum_volume_size {:?}, want the larger drive {large}", g.maximum_volume_size));
        // (drive index, volume id) of each whole-drive volume.
        let mut wholes: Vec<(Option<usize>, String)> = Vec::new();
        for name in ["conf-t-whole-1", "conf-t-whole-2"] {
            let before = fx.state();
            let got = r.ok(&format!("CreateVolume {name} layout=drive"), c.ctrl.create_volume(whole(name, 0, 0)).await);
            let Some(v) = created(&mut r, name, got, 0, 0) else { continue };
            let after = fx.state();
            let drive = fx.new_partition(&before, &after).map(|(drive, _, size)| {
                let want = if fx.drives[drive].file.ends_with("d0.img") { small } else { large };
                r.check(after.parts[drive].len() == 1 && size as i64 == want && v.capacity_bytes == want, || {
                    format!("{name}: want the whole of drive {drive} ({want} bytes) as its only partition, got {:?} and capacity {}", after.parts[drive], v.capacity_bytes)
                });
                r.check(!wholes.iter().any(|w| w.0 == Some(drive)), || format!("{name}: placed on drive {drive}, already taken whole"));
                drive
            });
            r.check(drive.is_some(), || format!("{name}: want one new partition: {before:?} -> {after:?}"));
            let again = r.ok(&format!("CreateVolume {name} layout=drive, repeated"), c.ctrl.create_volume(whole(name, 0, 0)).await).and_then(|x| x.volume);
            r.check(again.as_ref() == Some(&v), || format!("{name}: repeat gave {again:?}, first {v:?}"));
            wholes.push((drive, v.volume_id));
        }
        let both = fx.state();
        for (what, q, want) in [
            ("a third layout=drive volume", whole("conf-t-whole-3", 0, 0), Code::ResourceExhausted),
            ("a partition volume with every drive taken whole", vol_req("conf-t-part", 16 * MIB_I, 0, vec![block_cap()], &[]), Code::ResourceExhausted),
            ("a 3 GiB layout=drive volume", whole("conf-t-huge", 3 * GIB_I, 0), Code::OutOfRange),
        ] {
            r.code(&format!("CreateVolume {what}"), c.ctrl.create_volume(q).await, want);
            r.unchanged(&format!("CreateVolume {what}"), &fx, &both);
        }
        let (none, settled) = capacity_settles(&mut c, layout_req("drive"), |g| g.available_capacity == 0).await;
        r.check(settled, || format!("layout=drive available_capacity {} 10 s after every drive was taken", none.available_capacity));

        // Free the small drive; a partition volume there makes it no longer empty.
        let small_idx = fx.drives.iter().position(|d| d.file.ends_with("d0.img")).unwrap();
        if let Some(i) = wholes.iter().position(|w| w.0 == Some(small_idx)) {
            must("DeleteVolume", c.ctrl.delete_volume(del_req(&wholes.remove(i).1)).await);
            // (Reusing freed space at once is checked on its own below.)
            capacity_settles(&mut c, layout_req("drive"), |g| g.available_capacity == small).await;
            let before = fx.state();
            r.code("CreateVolume layout=drive within 100 MiB", c.ctrl.create_volume(whole("conf-t-limited", 0, 100 * MIB_I)).await, Code::OutOfRange);
            r.unchanged("CreateVolume layout=drive within 100 MiB", &fx, &before);
            let part = must("CreateVolume partition", c.ctrl.create_volume(vol_req("conf-t-part", 16 * MIB_I, 0, vec![block_cap()], &[])).await).volume.unwrap();
            let before = fx.state();
            r.code(
                "CreateVolume layout=drive when the only free drive holds a partition",
                c.ctrl.create_volume(whole("conf-t-whole-3", 0, 0)).await,
                Code::ResourceExhausted,
            );
            r.unchanged("CreateVolume layout=drive when the only free drive holds a partition", &fx, &before);
            must("DeleteVolume", c.ctrl.delete_volume(del_req(&part.volume_id)).await);
        }
        for (_, id) in wholes {
            must("DeleteVolume", c.ctrl.delete_volume(del_req(&id)).await);
        }
        r.unchanged("whole drives deleted", &fx, &clean);
        let (now, settled) = capacity_settles(&mut c, layout_req("drive"), |g| g.available_capacity == small + large).await;
        r.check(settled, || format!("layout=drive available_capacity {} 10 s after the whole drives were freed", now.available_capacity));

        // --- Space DeleteVolume frees is usable by the very next CreateVolume: once the
        // inventory has seen a volume, deleting it must not leave a stale extent that
        // makes the next create RESOURCE_EXHAUSTED although the drive is empty. Only the
        // large drive can hold these, so nothing can fall back to the other one. The
        // window is a race with udev, so each case gets five tries; a correct driver
        // passes every one.
        for (what, params) in [("a whole drive", &[("layout", "drive")][..]), ("a partition as large as a drive", &[][..])] {
            let q = |name: &str| vol_req(name, large, 0, vec![block_cap()], params);
            let Some(first) = r.ok(&format!("CreateVolume {what}"), c.ctrl.create_volume(q("conf-t-reuse-0")).await) else { continue };
            let mut id = first.volume.expect("a volume").volume_id;
            for round in 1..=5 {
                let (_, seen) = capacity_settles(&mut c, layout_req("partition"), |g| g.available_capacity == small).await;
                r.check(seen, || format!("{what}: GetCapacity still offers its space 10 s after CreateVolume"));
                must("DeleteVolume", c.ctrl.delete_volume(del_req(&id)).await);
                let what = format!("CreateVolume {what} right after DeleteVolume freed the drive (try {round})");
                match r.ok(&what, c.ctrl.create_volume(q(&format!("conf-t-reuse-{round}"))).await) {
                    Some(v) => id = created(&mut r, &what, Some(v), large, 0).expect("a volume").volume_id,
                    None => {
                        id = String::new();
                        break;
                    }
                }
            }
            if !id.is_empty() {
                must("DeleteVolume", c.ctrl.delete_volume(del_req(&id)).await);
            }
            let (now, settled) = capacity_settles(&mut c, layout_req("drive"), |g| g.available_capacity == small + large).await;
            r.check(settled, || format!("{what}: GetCapacity {now:?} 10 s after its volumes were deleted, want both drives free"));
        }
        r.unchanged("the end", &fx, &clean);
    });
    r.finish(&fx);
}

// ---------------------------------------------------------------------------------
// NodeStageVolume, NodeUnstageVolume, NodePublishVolume, NodeUnpublishVolume.
// ---------------------------------------------------------------------------------

#[test]
fn node_stage_and_publish_follow_the_node_tables() {
    let fx = Fixture::start(&[GIB]);
    let mut r = Report::new();
    rt().block_on(async {
        let mut c = Csi::connect(&fx.agent).await;
        let created_before = fx.state();
        let fs = must("CreateVolume fs", c.ctrl.create_volume(vol_req("conf-n-fs", 64 * MIB_I, 0, vec![mount_cap("ext4")], &[])).await).volume.unwrap();
        let after_fs = fx.state();
        let (_, fs_dev, _) = fx.new_partition(&created_before, &after_fs).expect("one partition for the fs volume");
        let blk = must("CreateVolume block", c.ctrl.create_volume(vol_req("conf-n-blk", 16 * MIB_I, 0, vec![block_cap()], &[])).await).volume.unwrap();
        let other = must("CreateVolume other", c.ctrl.create_volume(vol_req("conf-n-other", 64 * MIB_I, 0, vec![mount_cap("ext4")], &[])).await).volume.unwrap();
        let (id, bid, oid) = (fs.volume_id.clone(), blk.volume_id.clone(), other.volume_id.clone());
        let stage = fx.staging("fs");
        let stage2 = fx.staging("fs-elsewhere");
        let t1 = fx.target("p1", "fs");
        let cap = mount_cap("ext4");
        let s = |id: &str, path: &Path, cap: csi::VolumeCapability| stage_req(id, path, cap);
        let p = |id: &str, staging: &Path, target: &Path, cap: csi::VolumeCapability, ro: bool| publish_req(id, staging, target, cap, ro);
        let clean = fx.state();

        // --- Missing required fields: INVALID_ARGUMENT (csi-sanity passes the earlier fields).
        let ia = Code::InvalidArgument;
        r.code("NodeStageVolume without volume_id", c.node.node_stage_volume(s("", &stage, cap.clone())).await, ia);
        r.code(
            "NodeStageVolume without staging_target_path",
            c.node.node_stage_volume(csi::NodeStageVolumeRequest { staging_target_path: String::new(), ..s(&id, &stage, cap.clone()) }).await,
            ia,
        );
        r.code(
            "NodeStageVolume without volume_capability",
            c.node.node_stage_volume(csi::NodeStageVolumeRequest { volume_capability: None, ..s(&id, &stage, cap.clone()) }).await,
            ia,
        );
        r.code("NodeUnstageVolume without volume_id", c.node.node_unstage_volume(unstage_req("", &stage)).await, ia);
        r.code("NodeUnstageVolume without staging_target_path", c.node.node_unstage_volume(unstage_req(&id, Path::new(""))).await, ia);
        r.code("NodePublishVolume without volume_id", c.node.node_publish_volume(csi::NodePublishVolumeRequest::default()).await, ia);
        r.code(
            "NodePublishVolume without target_path",
            c.node.node_publish_volume(csi::NodePublishVolumeRequest { volume_id: id.clone(), ..Default::default() }).await,
            ia,
        );
        r.code(
            "NodePublishVolume without volume_capability",
            c.node
                .node_publish_volume(csi::NodePublishVolumeRequest { volume_id: id.clone(), target_path: t1.display().to_string(), ..Default::default() })
                .await,
            ia,
        );
        r.code("NodeUnpublishVolume without volume_id", c.node.node_unpublish_volume(unpublish_req("", &t1)).await, ia);
        r.code("NodeUnpublishVolume without target_path", c.node.node_unpublish_volume(unpublish_req(&id, Path::new(""))).await, ia);
        r.unchanged("node calls missing fields", &fx, &clean);

        // --- Unknown volume: NOT_FOUND on every node call.
        let nf = Code::NotFound;
        r.code("NodeStageVolume of an unknown volume", c.node.node_stage_volume(s(UNKNOWN_ID, &stage, cap.clone())).await, nf);
        r.code("NodeUnstageVolume of an unknown volume", c.node.node_unstage_volume(unstage_req(UNKNOWN_ID, &stage)).await, nf);
        r.code("NodePublishVolume of an unknown volume", c.node.node_publish_volume(p(UNKNOWN_ID, &stage, &t1, cap.clone(), false)).await, nf);
        r.code("NodeUnpublishVolume of an unknown volume", c.node.node_unpublish_volume(unpublish_req(UNKNOWN_ID, &t1)).await, nf);
        r.unchanged("node calls on an unknown volume", &fx, &clean);

        // --- Publishing before staging: FAILED_PRECONDITION.
        r.code("NodePublishVolume of an unstaged volume", c.node.node_publish_volume(p(&id, &stage, &t1, cap.clone(), false)).await, Code::FailedPrecondition);
        r.unchanged("NodePublishVolume of an unstaged volume", &fx, &clean);
        r.check(!t1.exists(), || "NodePublishVolume of an unstaged volume created the target".into());

        // --- Staging refused: bad paths and mount flags are INVALID_ARGUMENT; capabilities
        // the volume does not have are FAILED_PRECONDITION ("Exceeds capabilities").
        // Each leaves the volume unformatted, nothing mounted, nothing made outside.
        let dotdot = fx.kubelet.join("plugins/../../outside/stage");
        let relative = PathBuf::from("kubelet/plugins/staging/rel");
        let mut refused: Vec<(String, csi::NodeStageVolumeRequest, Code)> = Vec::new();
        for (what, path) in [
            ("outside the allowed roots", fx.outside.join("stage")),
            ("with '..' escaping the roots", dotdot.clone()),
            ("under a symlink escaping the roots", fx.kubelet.join("escape/stage")),
            ("that is itself a symlink out of the roots", fx.kubelet.join("escape")),
            ("that is relative", relative.clone()),
            ("that is the allowed root itself", fx.kubelet.clone()),
        ] {
            refused.push((format!("NodeStageVolume at a path {what}"), s(&id, &path, cap.clone()), ia));
        }
        for flags in [&["rw,exec"][..], &["bind"], &["rbind"], &["remount"], &["nosuid nodev"], &[""], &["noatime", "x-mount.mkdir=0700"]] {
            refused.push((format!("NodeStageVolume with mount flags {flags:?}"), s(&id, &stage, mount(Mode::SingleNodeWriter, "ext4", flags)), ia));
        }
        let fp = Code::FailedPrecondition;
        // A capability drivelet never serves is an unsupported field (INVALID_ARGUMENT) as
        // much as one this volume lacks ("Exceeds capabilities", FAILED_PRECONDITION);
        // either is accepted. One drivelet serves but this volume lacks is the latter.
        for (what, cap) in [
            ("MULTI_NODE_MULTI_WRITER", mount(Mode::MultiNodeMultiWriter, "ext4", &[])),
            ("MULTI_NODE_READER_ONLY", mount(Mode::MultiNodeReaderOnly, "ext4", &[])),
            ("btrfs", mount_cap("btrfs")),
        ] {
            refused.push((format!("NodeStageVolume with {what}"), s(&id, &stage, cap), ia));
        }
        for (what, vid, cap) in [
            ("xfs on an ext4 volume", &id, mount_cap("xfs")),
            ("block access to a mount volume", &id, block_cap()),
            ("mount access to a block volume", &bid, mount_cap("")),
        ] {
            refused.push((format!("NodeStageVolume with {what}"), s(vid, &stage, cap), fp));
        }
        for (what, q, want) in refused {
            let vid = q.volume_id.clone();
            let path = PathBuf::from(&q.staging_target_path);
            let unsupported = q.volume_capability.as_ref().is_some_and(|c| {
                let multi = c.access_mode.as_ref().is_some_and(|m| m.mode >= Mode::MultiNodeReaderOnly as i32 && m.mode <= Mode::MultiNodeMultiWriter as i32);
                let btrfs = matches!(&c.access_type, Some(AccessType::Mount(m)) if m.fs_type == "btrfs");
                multi || btrfs
            });
            let got = c.node.node_stage_volume(q).await;
            if unsupported {
                r.code_any(&what, got, &[ia, fp]);
            } else {
                r.code(&what, got, want);
            }
            r.unchanged(&what, &fx, &clean);
            let sig = fs_signature(&fs_dev);
            r.check(sig.is_none(), || format!("{what}: a filesystem ({sig:?}) was made on the volume"));
            // Undo a wrongly accepted stage so the cases stay independent.
            let _ = c.node.node_unstage_volume(unstage_req(&vid, &path)).await;
        }
        // The agent runs in this process's working directory.
        r.check(!relative.exists(), || format!("a relative staging path was created at {}", relative.display()));

        // --- Stage, and again: OK, one mount.
        r.ok("NodeStageVolume", c.node.node_stage_volume(s(&id, &stage, cap.clone())).await);
        r.ok("NodeStageVolume, repeated", c.node.node_stage_volume(s(&id, &stage, cap.clone())).await);
        let staged = fx.state();
        r.check(staged.mounts == vec![stage.clone()], || format!("staged once at {}: mounts {:?}", stage.display(), staged.mounts));
        r.check(fs_signature(&fs_dev).as_deref() == Some("ext4"), || "the staged volume holds no ext4".into());

        // The same staging path, incompatible: ALREADY_EXISTS.
        for (what, cap) in [
            ("block access", block_cap()),
            ("other mount flags", mount(Mode::SingleNodeWriter, "ext4", &["noatime"])),
            ("SINGLE_NODE_READER_ONLY", mount(Mode::SingleNodeReaderOnly, "ext4", &[])),
        ] {
            let what = format!("NodeStageVolume again with {what}");
            r.code(&what, c.node.node_stage_volume(s(&id, &stage, cap)).await, Code::AlreadyExists);
            r.unchanged(&what, &fx, &staged);
        }
        // Another staging path while staged (one staging path per volume).
        r.code("NodeStageVolume at a second staging path", c.node.node_stage_volume(s(&id, &stage2, cap.clone())).await, fp);
        r.unchanged("NodeStageVolume at a second staging path", &fx, &staged);
        // Deleting a staged volume: FAILED_PRECONDITION ("Volume in use").
        r.code("DeleteVolume of a staged volume", c.ctrl.delete_volume(del_req(&id)).await, fp);
        r.unchanged("DeleteVolume of a staged volume", &fx, &staged);
        // Unstaging where it is not staged: OK, and the real staging stays.
        r.ok("NodeUnstageVolume at a path it is not staged at", c.node.node_unstage_volume(unstage_req(&id, &stage2)).await);
        r.unchanged("NodeUnstageVolume at a path it is not staged at", &fx, &staged);

        // --- Publishing refused.
        let mut refused: Vec<(String, csi::NodePublishVolumeRequest, Code)> = vec![
            // "Staging target path not set": FAILED_PRECONDITION when STAGE_UNSTAGE_VOLUME is set.
            (
                "NodePublishVolume without staging_target_path".into(),
                csi::NodePublishVolumeRequest { staging_target_path: String::new(), ..p(&id, &stage, &t1, cap.clone(), false) },
                fp,
            ),
            ("NodePublishVolume from a path it is not staged at".into(), p(&id, &stage2, &t1, cap.clone(), false), fp),
            ("NodePublishVolume with MULTI_NODE_MULTI_WRITER (either code)".into(), p(&id, &stage, &t1, mount(Mode::MultiNodeMultiWriter, "ext4", &[]), false), fp),
            ("NodePublishVolume with block access to a mount volume".into(), p(&id, &stage, &t1, block_cap(), false), fp),
        ];
        for (what, target) in [
            ("outside the allowed roots", fx.outside.join("target")),
            ("with '..' escaping the roots", fx.kubelet.join("pods/../../outside/target")),
            ("under a symlink escaping the roots", fx.kubelet.join("escape/target")),
            ("that is itself a symlink out of the roots", fx.kubelet.join("escape")),
            ("that is relative", PathBuf::from("kubelet/pods/p1/volumes/rel")),
        ] {
            refused.push((format!("NodePublishVolume to a target {what}"), p(&id, &stage, &target, cap.clone(), false), ia));
        }
        for flags in [&["rw,exec"][..], &["bind"], &["remount"]] {
            refused.push((format!("NodePublishVolume with mount flags {flags:?}"), p(&id, &stage, &t1, mount(Mode::SingleNodeWriter, "ext4", flags), false), ia));
        }
        for (what, q, want) in refused {
            let target = PathBuf::from(&q.target_path);
            let got = c.node.node_publish_volume(q).await;
            let refused_right = if what.ends_with("(either code)") { r.code_any(&what, got, &[ia, fp]) } else { r.code(&what, got, want) };
            r.unchanged(&what, &fx, &staged);
            if refused_right {
                r.check(!t1.exists(), || format!("{what}: the target was created"));
            }
            let _ = c.node.node_unpublish_volume(unpublish_req(&id, &target)).await;
        }

        // --- Publish, and again: OK, one bind mount; data reaches the staged filesystem.
        r.ok("NodePublishVolume", c.node.node_publish_volume(p(&id, &stage, &t1, cap.clone(), false)).await);
        r.ok("NodePublishVolume, repeated", c.node.node_publish_volume(p(&id, &stage, &t1, cap.clone(), false)).await);
        let published = fx.state();
        let mut want = vec![stage.clone(), t1.clone()];
        want.sort();
        r.check(published.mounts == want, || format!("published once at {}: mounts {:?}", t1.display(), published.mounts));
        if std::fs::write(t1.join("hello"), b"hello").is_ok() {
            r.check(std::fs::read(stage.join("hello")).ok().as_deref() == Some(&b"hello"[..]), || "data written at the target is not in the staged filesystem".into());
        } else {
            r.fail("cannot write through a read-write publish".into());
        }
        // The same target, incompatible: ALREADY_EXISTS.
        r.code("NodePublishVolume again with readonly", c.node.node_publish_volume(p(&id, &stage, &t1, cap.clone(), true)).await, Code::AlreadyExists);
        r.unchanged("NodePublishVolume again with readonly", &fx, &published);
        // A published volume can be neither unstaged nor deleted.
        r.code("NodeUnstageVolume of a published volume", c.node.node_unstage_volume(unstage_req(&id, &stage)).await, fp);
        r.unchanged("NodeUnstageVolume of a published volume", &fx, &published);
        r.code("DeleteVolume of a published volume", c.ctrl.delete_volume(del_req(&id)).await, fp);
        r.unchanged("DeleteVolume of a published volume", &fx, &published);

        // --- Another volume's paths are not ours to undo.
        let ostage = fx.staging("other");
        let ot = fx.target("p2", "other");
        r.ok("NodeStageVolume other", c.node.node_stage_volume(s(&oid, &ostage, cap.clone())).await);
        r.ok("NodePublishVolume other", c.node.node_publish_volume(p(&oid, &ostage, &ot, cap.clone(), false)).await);
        let two = fx.state();
        r.ok("NodeUnpublishVolume at another volume's target", c.node.node_unpublish_volume(unpublish_req(&id, &ot)).await);
        r.unchanged("NodeUnpublishVolume at another volume's target", &fx, &two);
        r.ok("NodeUnstageVolume at another volume's staging path", c.node.node_unstage_volume(unstage_req(&id, &ostage)).await);
        r.unchanged("NodeUnstageVolume at another volume's staging path", &fx, &two);

        // --- Block access: the target is the device itself.
        let bstage = fx.staging("blk");
        let bt = fx.target("p3", "blk");
        r.ok("NodeStageVolume block", c.node.node_stage_volume(s(&bid, &bstage, block_cap())).await);
        r.ok("NodeStageVolume block, repeated", c.node.node_stage_volume(s(&bid, &bstage, block_cap())).await);
        r.ok("NodePublishVolume block", c.node.node_publish_volume(p(&bid, &bstage, &bt, block_cap(), false)).await);
        r.ok("NodePublishVolume block, repeated", c.node.node_publish_volume(p(&bid, &bstage, &bt, block_cap(), false)).await);
        if bt.exists() {
            let size = sh("blockdev", &["--getsize64", bt.to_str().unwrap()]);
            r.check(size == blk.capacity_bytes.to_string(), || format!("block target is {size} bytes, volume {}", blk.capacity_bytes));
        } else {
            r.fail("block publish left no device at the target".into());
        }

        // --- Teardown, each step twice; the spec wants the target removed.
        let never = fx.target("p9", "never");
        r.ok("NodeUnpublishVolume of a target never published", c.node.node_unpublish_volume(unpublish_req(&id, &never)).await);
        for (vid, target, staging) in [(&id, &t1, &stage), (&oid, &ot, &ostage), (&bid, &bt, &bstage)] {
            r.ok("NodeUnpublishVolume", c.node.node_unpublish_volume(unpublish_req(vid, target)).await);
            r.ok("NodeUnpublishVolume, repeated", c.node.node_unpublish_volume(unpublish_req(vid, target)).await);
            r.check(!target.exists(), || format!("NodeUnpublishVolume left {} behind", target.display()));
            r.ok("NodeUnstageVolume", c.node.node_unstage_volume(unstage_req(vid, staging)).await);
            r.ok("NodeUnstageVolume, repeated", c.node.node_unstage_volume(unstage_req(vid, staging)).await);
        }
        r.check(fx.state().mounts.is_empty(), || format!("mounts left after teardown: {:?}", fx.state().mounts));
        for vid in [&id, &bid, &oid] {
            r.ok("DeleteVolume", c.ctrl.delete_volume(del_req(vid)).await);
        }
        r.unchanged("after teardown", &fx, &created_before);
        // A deleted volume is unknown to every node call.
        r.code("NodeStageVolume of a deleted volume", c.node.node_stage_volume(s(&id, &stage, cap.clone())).await, nf);
        r.code("NodePublishVolume of a deleted volume", c.node.node_publish_volume(p(&id, &stage, &t1, cap.clone(), false)).await, nf);
        r.code("NodeUnstageVolume of a deleted volume", c.node.node_unstage_volume(unstage_req(&id, &stage)).await, nf);
        r.code("NodeUnpublishVolume of a deleted volume", c.node.node_unpublish_volume(unpublish_req(&id, &t1)).await, nf);
        r.unchanged("node calls on a deleted volume", &fx, &created_before);
    });
    r.finish(&fx);
}

// ---------------------------------------------------------------------------------
// Access modes and read-only publishing.
// ---------------------------------------------------------------------------------

/// Whether writing a file under `dir` fails with EROFS.
fn write_is_erofs(dir: &Path) -> Result<(), String> {
    match std::fs::write(dir.join("probe"), b"x") {
        Ok(()) => Err(format!("writing under {} succeeded", dir.display())),
        Err(e) if e.raw_os_error() == Some(nix::libc::EROFS) => Ok(()),
        Err(e) => Err(format!("writing under {} failed with {e}, not EROFS", dir.display())),
    }
}

#[test]
fn access_modes_and_read_only_publishes_are_enforced() {
    let fx = Fixture::start(&[GIB]);
    let mut r = Report::new();
    rt().block_on(async {
        let mut c = Csi::connect(&fx.agent).await;
        let clean = fx.state();
        let new_vol = |name: &'static str, cap: csi::VolumeCapability| {
            let q = vol_req(name, 64 * MIB_I, 0, vec![cap], &[]);
            let mut ctrl = c.ctrl.clone();
            async move { must(name, ctrl.create_volume(q).await).volume.unwrap().volume_id }
        };
        let ssw_cap = mount(Mode::SingleNodeSingleWriter, "ext4", &[]);
        let smw_cap = mount(Mode::SingleNodeMultiWriter, "ext4", &[]);
        let ro_cap = mount(Mode::SingleNodeReaderOnly, "ext4", &[]);
        let blk_cap = block(Mode::SingleNodeMultiWriter);
        let ssw = new_vol("conf-a-ssw", ssw_cap.clone()).await;
        let smw = new_vol("conf-a-smw", smw_cap.clone()).await;
        let ro = new_vol("conf-a-ro", ro_cap.clone()).await;
        let blk = new_vol("conf-a-blk", blk_cap.clone()).await;
        let fp = Code::FailedPrecondition;

        // --- SINGLE_NODE_SINGLE_WRITER: one target at a time.
        let st = fx.staging("ssw");
        let (t1, t2) = (fx.target("p1", "ssw"), fx.target("p2", "ssw"));
        r.ok("NodeStageVolume SSW", c.node.node_stage_volume(stage_req(&ssw, &st, ssw_cap.clone())).await);
        r.ok("NodePublishVolume SSW first target", c.node.node_publish_volume(publish_req(&ssw, &st, &t1, ssw_cap.clone(), false)).await);
        let one = fx.state();
        r.code("NodePublishVolume SSW second target", c.node.node_publish_volume(publish_req(&ssw, &st, &t2, ssw_cap.clone(), false)).await, fp);
        r.unchanged("NodePublishVolume SSW second target", &fx, &one);
        r.check(!t2.exists(), || "a refused SSW publish created its target".into());
        r.code(
            "NodePublishVolume SSW second target, read-only",
            c.node.node_publish_volume(publish_req(&ssw, &st, &t2, ssw_cap.clone(), true)).await,
            fp,
        );
        r.unchanged("NodePublishVolume SSW second target, read-only", &fx, &one);
        r.ok("NodePublishVolume SSW first target, repeated", c.node.node_publish_volume(publish_req(&ssw, &st, &t1, ssw_cap.clone(), false)).await);
        r.ok("NodeUnpublishVolume SSW first target", c.node.node_unpublish_volume(unpublish_req(&ssw, &t1)).await);
        r.ok("NodePublishVolume SSW second target once the first is gone", c.node.node_publish_volume(publish_req(&ssw, &st, &t2, ssw_cap.clone(), false)).await);
        r.ok("NodeUnpublishVolume SSW", c.node.node_unpublish_volume(unpublish_req(&ssw, &t2)).await);
        r.ok("NodeUnstageVolume SSW", c.node.node_unstage_volume(unstage_req(&ssw, &st)).await);

        // --- SINGLE_NODE_MULTI_WRITER: several targets, read-only ones really read-only.
        let sm = fx.staging("smw");
        let (m1, m2, m3) = (fx.target("p1", "smw"), fx.target("p2", "smw"), fx.target("p3", "smw"));
        r.ok("NodeStageVolume SMW", c.node.node_stage_volume(stage_req(&smw, &sm, smw_cap.clone())).await);
        r.ok("NodePublishVolume SMW #1", c.node.node_publish_volume(publish_req(&smw, &sm, &m1, smw_cap.clone(), false)).await);
        r.ok("NodePublishVolume SMW #2", c.node.node_publish_volume(publish_req(&smw, &sm, &m2, smw_cap.clone(), false)).await);
        r.ok("NodePublishVolume SMW #3 read-only", c.node.node_publish_volume(publish_req(&smw, &sm, &m3, smw_cap.clone(), true)).await);
        if std::fs::write(m1.join("shared"), b"one").is_ok() {
            r.check(std::fs::read(m2.join("shared")).ok().as_deref() == Some(&b"one"[..]), || "SMW targets do not share data".into());
            r.check(std::fs::read(m3.join("shared")).ok().as_deref() == Some(&b"one"[..]), || "the read-only SMW target cannot read".into());
        } else {
            r.fail("cannot write through a read-write SMW target".into());
        }
        if let Err(e) = write_is_erofs(&m3) {
            r.fail(format!("read-only publish: {e}"));
        }
        r.check(std::fs::write(m2.join("still"), b"rw").is_ok(), || "a read-only publish made the other targets read-only".into());
        for t in [&m1, &m2, &m3] {
            r.ok("NodeUnpublishVolume SMW", c.node.node_unpublish_volume(unpublish_req(&smw, t)).await);
        }
        r.ok("NodeUnstageVolume SMW", c.node.node_unstage_volume(unstage_req(&smw, &sm)).await);

        // --- SINGLE_NODE_READER_ONLY: read-only at the target (and at staging).
        let rs = fx.staging("ro");
        let rt1 = fx.target("p1", "ro");
        r.ok("NodeStageVolume reader-only", c.node.node_stage_volume(stage_req(&ro, &rs, ro_cap.clone())).await);
        r.ok("NodePublishVolume reader-only", c.node.node_publish_volume(publish_req(&ro, &rs, &rt1, ro_cap.clone(), true)).await);
        if let Err(e) = write_is_erofs(&rt1) {
            r.fail(format!("SINGLE_NODE_READER_ONLY publish: {e}"));
        }
        if let Err(e) = write_is_erofs(&rs) {
            r.fail(format!("SINGLE_NODE_READER_ONLY stage: {e}"));
        }
        r.ok("NodeUnpublishVolume reader-only", c.node.node_unpublish_volume(unpublish_req(&ro, &rt1)).await);
        r.ok("NodeUnstageVolume reader-only", c.node.node_unstage_volume(unstage_req(&ro, &rs)).await);

        // --- Block: a read-only publish cannot be opened for writing; a read-write one
        // can. drivelet marks the partition itself read-only in the kernel (a read-only
        // bind of a device node does not stop writes), so read-only and read-write
        // block targets of one volume cannot coexist: mixing is FAILED_PRECONDITION.
        let bs = fx.staging("blk");
        let (bw, bro) = (fx.target("p1", "blk"), fx.target("p2", "blk"));
        r.ok("NodeStageVolume block", c.node.node_stage_volume(stage_req(&blk, &bs, blk_cap.clone())).await);
        r.ok("NodePublishVolume block read-write", c.node.node_publish_volume(publish_req(&blk, &bs, &bw, blk_cap.clone(), false)).await);
        r.code(
            "NodePublishVolume block read-only beside a read-write target",
            c.node.node_publish_volume(publish_req(&blk, &bs, &bro, blk_cap.clone(), true)).await,
            Code::FailedPrecondition,
        );
        let open_rw = |p: &Path| std::fs::OpenOptions::new().write(true).open(p);
        r.check(open_rw(&bw).is_ok(), || format!("cannot open the read-write block target: {:?}", open_rw(&bw).err()));
        r.ok("NodeUnpublishVolume block", c.node.node_unpublish_volume(unpublish_req(&blk, &bw)).await);
        r.ok("NodePublishVolume block read-only", c.node.node_publish_volume(publish_req(&blk, &bs, &bro, blk_cap.clone(), true)).await);
        // Refused either at open (EROFS/EACCES) or at the first write (EPERM), by kernel
        // version; no byte may reach the device.
        let refused = |e: &std::io::Error| matches!(e.raw_os_error(), Some(nix::libc::EROFS | nix::libc::EACCES | nix::libc::EPERM));
        match open_rw(&bro) {
            Ok(mut f) => {
                use std::io::Write;
                match f.write_all(&[0xabu8; 4096]).and_then(|_| f.sync_all()) {
                    Ok(()) => {
                        r.fail("a 4 KiB write through the read-only block target succeeded".into());
                    }
                    Err(e) => {
                        r.check(refused(&e), || format!("the read-only block target refuses the write with {e}, not a read-only error"));
                    }
                }
            }
            Err(e) => {
                r.check(refused(&e), || format!("the read-only block target refuses writing with {e}, not a read-only error"));
            }
        }
        let head = std::fs::read(&bro).map(|b| b.iter().take(4096).any(|x| *x == 0xab)).unwrap_or(false);
        r.check(!head, || "bytes of the refused write reached the device".into());
        r.code(
            "NodePublishVolume block read-write beside a read-only target",
            c.node.node_publish_volume(publish_req(&blk, &bs, &bw, blk_cap.clone(), false)).await,
            Code::FailedPrecondition,
        );
        r.ok("NodeUnpublishVolume block", c.node.node_unpublish_volume(unpublish_req(&blk, &bro)).await);
        r.ok("NodePublishVolume block read-write after the read-only one is gone", c.node.node_publish_volume(publish_req(&blk, &bs, &bw, blk_cap.clone(), false)).await);
        r.check(open_rw(&bw).is_ok(), || "the partition stayed read-only after its read-only target went".into());
        r.ok("NodeUnpublishVolume block", c.node.node_unpublish_volume(unpublish_req(&blk, &bw)).await);
        r.ok("NodeUnstageVolume block", c.node.node_unstage_volume(unstage_req(&blk, &bs)).await);

        r.check(fx.state().mounts.is_empty(), || format!("mounts left: {:?}", fx.state().mounts));
        for id in [&ssw, &smw, &ro, &blk] {
            r.ok("DeleteVolume", c.ctrl.delete_volume(del_req(id)).await);
        }
        r.unchanged("the end", &fx, &clean);
    });
    r.finish(&fx);
}

// ---------------------------------------------------------------------------------
// ListVolumes, ControllerGetVolume, NodeGetVolumeStats: held to their tables when
// advertised (UNIMPLEMENTED otherwise, checked with the other capabilities above).
// ---------------------------------------------------------------------------------

#[test]
fn listing_stats_and_conditions_follow_their_tables_when_advertised() {
    let fx = Fixture::start(&[GIB]);
    let mut r = Report::new();
    rt().block_on(async {
        let mut c = Csi::connect(&fx.agent).await;
        use csi::controller_service_capability::{rpc::Type as CR, Type as CT};
        use csi::node_service_capability::{rpc::Type as NR, Type as NT};
        let cc = must("ControllerGetCapabilities", c.ctrl.controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {}).await);
        let nc = must("NodeGetCapabilities", c.node.node_get_capabilities(csi::NodeGetCapabilitiesRequest {}).await);
        let ctrl: Vec<i32> = cc.capabilities.iter().filter_map(|x| x.r#type.as_ref().map(|CT::Rpc(rpc)| rpc.r#type)).collect();
        let node: Vec<i32> = nc.capabilities.iter().filter_map(|x| x.r#type.as_ref().map(|NT::Rpc(rpc)| rpc.r#type)).collect();
        let has = |t: CR| ctrl.contains(&(t as i32));
        let hasn = |t: NR| node.contains(&(t as i32));

        // Capabilities that depend on others [ControllerServiceCapability].
        r.check(!has(CR::ListVolumesPublishedNodes) || has(CR::PublishUnpublishVolume), || {
            "LIST_VOLUMES_PUBLISHED_NODES is advertised without PUBLISH_UNPUBLISH_VOLUME, which the spec says the SP MUST also support".into()
        });

        // Two volumes, each staged and published, so every listing has something to show.
        let fs = must("CreateVolume fs", c.ctrl.create_volume(vol_req("conf-l-fs", 64 * MIB_I, 0, vec![mount_cap("ext4")], &[])).await).volume.unwrap();
        let blk = must("CreateVolume block", c.ctrl.create_volume(vol_req("conf-l-blk", 16 * MIB_I, 0, vec![block_cap()], &[])).await).volume.unwrap();
        let (s1, t1, sb, tb) = (fx.staging("fs"), fx.target("p1", "fs"), fx.staging("blk"), fx.target("p1", "blk"));
        must("NodeStageVolume", c.node.node_stage_volume(stage_req(&fs.volume_id, &s1, mount_cap("ext4"))).await);
        must("NodePublishVolume", c.node.node_publish_volume(publish_req(&fs.volume_id, &s1, &t1, mount_cap("ext4"), false)).await);
        must("NodeStageVolume", c.node.node_stage_volume(stage_req(&blk.volume_id, &sb, block_cap())).await);
        must("NodePublishVolume", c.node.node_publish_volume(publish_req(&blk.volume_id, &sb, &tb, block_cap(), false)).await);
        let before = fx.state();

        // --- ListVolumes.
        let list = |max: i32, token: &str| csi::ListVolumesRequest { max_entries: max, starting_token: token.into() };
        if has(CR::ListVolumes) {
            if let Some(all) = r.ok("ListVolumes", c.ctrl.list_volumes(list(0, "")).await) {
                for v in [&fs, &blk] {
                    // The same volume as CreateVolume returned: id, size, context, topology.
                    let entry = all.entries.iter().find(|e| e.volume.as_ref().is_some_and(|x| x.volume_id == v.volume_id));
                    r.check(entry.and_then(|e| e.volume.as_ref()) == Some(v), || format!("ListVolumes shows {:?}, CreateVolume returned {v:?}", entry));
                    if has(CR::VolumeCondition) {
                        r.check(entry.and_then(|e| e.status.as_ref()).is_some_and(|s| s.volume_condition.is_some()), || {
                            format!("ListVolumes entry of {} has no volume_condition though VOLUME_CONDITION is advertised", v.volume_id)
                        });
                    }
                }
                r.check(all.entries.len() == 2 && all.next_token.is_empty(), || format!("ListVolumes without a limit: {} entries, next_token {:?}", all.entries.len(), all.next_token));
            }
            // Paging: one entry per page, the token leads to the rest, nothing twice.
            let mut seen = Vec::new();
            let mut token = String::new();
            for page in 0..4 {
                let Some(p) = r.ok(&format!("ListVolumes page {page}"), c.ctrl.list_volumes(list(1, &token)).await) else { break };
                r.check(p.entries.len() <= 1, || format!("ListVolumes max_entries 1 returned {} entries", p.entries.len()));
                seen.extend(p.entries.iter().filter_map(|e| e.volume.as_ref().map(|v| v.volume_id.clone())));
                if p.next_token.is_empty() {
                    break;
                }
                token = p.next_token;
            }
            seen.sort();
            let mut want = vec![fs.volume_id.clone(), blk.volume_id.clone()];
            want.sort();
            r.check(seen == want, || format!("ListVolumes one page at a time gave {seen:?}, want {want:?}"));
            // csi-sanity: "should fail when an invalid starting_token is passed".
            r.code("ListVolumes with an invalid starting_token", c.ctrl.list_volumes(list(0, "invalid-token")).await, Code::Aborted);
            r.code("ListVolumes with negative max_entries", c.ctrl.list_volumes(list(-1, "")).await, Code::InvalidArgument);
        } else {
            r.code("ListVolumes (not advertised)", c.ctrl.list_volumes(list(0, "")).await, Code::Unimplemented);
        }

        // --- ControllerGetVolume.
        let get = |id: &str| csi::ControllerGetVolumeRequest { volume_id: id.into() };
        if has(CR::GetVolume) {
            r.code("ControllerGetVolume without volume_id", c.ctrl.controller_get_volume(get("")).await, Code::InvalidArgument);
            r.code("ControllerGetVolume of an unknown volume", c.ctrl.controller_get_volume(get(UNKNOWN_ID)).await, Code::NotFound);
            for v in [&fs, &blk] {
                if let Some(g) = r.ok("ControllerGetVolume", c.ctrl.controller_get_volume(get(&v.volume_id)).await) {
                    r.check(g.volume.as_ref() == Some(v), || format!("ControllerGetVolume gives {:?}, CreateVolume returned {v:?}", g.volume));
                    r.check(g.status.is_some(), || "ControllerGetVolume has no status (REQUIRED)".into());
                    if has(CR::VolumeCondition) {
                        // "MUST provide a non-empty volume_condition" with VOLUME_CONDITION.
                        let cond = g.status.as_ref().and_then(|s| s.volume_condition.as_ref());
                        r.check(cond.is_some_and(|c| !c.message.is_empty() && !c.abnormal), || {
                            format!("ControllerGetVolume of a healthy volume: volume_condition {cond:?}, want normal with a message")
                        });
                    }
                }
            }
        } else {
            r.code("ControllerGetVolume (not advertised)", c.ctrl.controller_get_volume(get(&fs.volume_id)).await, Code::Unimplemented);
        }

        // --- NodeGetVolumeStats.
        let stats = |id: &str, path: &Path| csi::NodeGetVolumeStatsRequest {
            volume_id: id.into(),
            volume_path: path.display().to_string(),
            ..Default::default()
        };
        if hasn(NR::GetVolumeStats) || hasn(NR::VolumeCondition) {
            let ia = Code::InvalidArgument;
            r.code("NodeGetVolumeStats without volume_id", c.node.node_get_volume_stats(stats("", &t1)).await, ia);
            r.code("NodeGetVolumeStats without volume_path", c.node.node_get_volume_stats(stats(&fs.volume_id, Path::new(""))).await, ia);
            r.code("NodeGetVolumeStats of an unknown volume", c.node.node_get_volume_stats(stats(UNKNOWN_ID, &t1)).await, Code::NotFound);
            // csi-sanity: "should fail when volume does not exist on the specified path".
            r.code(
                "NodeGetVolumeStats at a path the volume is not at",
                c.node.node_get_volume_stats(stats(&fs.volume_id, &fx.target("p9", "nothing"))).await,
                Code::NotFound,
            );
            r.code("NodeGetVolumeStats at another volume's target", c.node.node_get_volume_stats(stats(&fs.volume_id, &tb)).await, Code::NotFound);
            for (what, id, path, size) in [
                ("the fs target", &fs.volume_id, &t1, fs.capacity_bytes),
                ("the fs staging path", &fs.volume_id, &s1, fs.capacity_bytes),
                ("the block target", &blk.volume_id, &tb, blk.capacity_bytes),
            ] {
                let Some(st) = r.ok(&format!("NodeGetVolumeStats at {what}"), c.node.node_get_volume_stats(stats(id, path)).await) else { continue };
                if hasn(NR::GetVolumeStats) {
                    r.check(!st.usage.is_empty(), || format!("NodeGetVolumeStats at {what}: no usage"));
                }
                for u in &st.usage {
                    r.check(u.total >= 0 && u.used >= 0 && u.available >= 0, || format!("NodeGetVolumeStats at {what}: negative usage {u:?}"));
                    r.check(u.unit != csi::volume_usage::Unit::Unknown as i32, || format!("NodeGetVolumeStats at {what}: usage without a unit {u:?}"));
                    if u.unit == csi::volume_usage::Unit::Bytes as i32 {
                        r.check(u.total > 0 && u.total <= size, || format!("NodeGetVolumeStats at {what}: {} total bytes on a {size}-byte volume", u.total));
                        r.check(u.used + u.available <= u.total, || format!("NodeGetVolumeStats at {what}: used + available exceed total: {u:?}"));
                    }
                }
                if hasn(NR::VolumeCondition) {
                    r.check(st.volume_condition.as_ref().is_some_and(|c| !c.message.is_empty() && !c.abnormal), || {
                        format!("NodeGetVolumeStats at {what}: volume_condition {:?}, want normal with a message", st.volume_condition)
                    });
                }
            }
        } else {
            r.code("NodeGetVolumeStats (not advertised)", c.node.node_get_volume_stats(stats(&fs.volume_id, &t1)).await, Code::Unimplemented);
        }
        r.unchanged("listing and stats calls", &fx, &before);

        // Teardown; a deleted volume is no longer listed or found.
        for (id, s, t) in [(&fs.volume_id, &s1, &t1), (&blk.volume_id, &sb, &tb)] {
            must("NodeUnpublishVolume", c.node.node_unpublish_volume(unpublish_req(id, t)).await);
            must("NodeUnstageVolume", c.node.node_unstage_volume(unstage_req(id, s)).await);
        }
        must("DeleteVolume", c.ctrl.delete_volume(del_req(&fs.volume_id)).await);
        if has(CR::ListVolumes) {
            if let Some(all) = r.ok("ListVolumes after a delete", c.ctrl.list_volumes(list(0, "")).await) {
                let ids: Vec<&str> = all.entries.iter().filter_map(|e| e.volume.as_ref().map(|v| v.volume_id.as_str())).collect();
                r.check(ids == vec![blk.volume_id.as_str()], || format!("ListVolumes after deleting {}: {ids:?}", fs.volume_id));
            }
        }
        if has(CR::GetVolume) {
            r.code("ControllerGetVolume of a deleted volume", c.ctrl.controller_get_volume(get(&fs.volume_id)).await, Code::NotFound);
        }
        must("DeleteVolume", c.ctrl.delete_volume(del_req(&blk.volume_id)).await);
    });
    r.finish(&fx);
}

// ---------------------------------------------------------------------------------
// ControllerPublishVolume and ControllerUnpublishVolume: attaching volumes to this node.
// ---------------------------------------------------------------------------------

fn cpub(id: &str, node: &str, cap: Option<csi::VolumeCapability>) -> csi::ControllerPublishVolumeRequest {
    csi::ControllerPublishVolumeRequest { volume_id: id.into(), node_id: node.into(), volume_capability: cap, ..Default::default() }
}

fn cunpub(id: &str, node: &str) -> csi::ControllerUnpublishVolumeRequest {
    csi::ControllerUnpublishVolumeRequest { volume_id: id.into(), node_id: node.into(), ..Default::default() }
}

/// The nodes ControllerGetVolume reports the volume published to.
async fn published_to(c: &mut Csi, id: &str) -> Vec<String> {
    let v = must("ControllerGetVolume", c.ctrl.controller_get_volume(csi::ControllerGetVolumeRequest { volume_id: id.into() }).await);
    v.status.map(|s| s.published_node_ids).unwrap_or_default()
}

/// `drivelet ctl` through the real CLI: success and everything it printed.
fn ctl(agent: &Agent, args: &[&str]) -> (bool, String) {
    let out = Command::new(bin()).args(["ctl", "--socket", agent.admin_socket.to_str().unwrap()]).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
}

#[test]
fn controller_publish_and_unpublish_follow_their_tables_and_survive_a_restart() {
    let mut fx = Fixture::start(&[GIB]);
    let mut r = Report::new();
    let rt = rt();
    let (fs, fs_dev, blk, spare) = rt.block_on(async {
        let mut c = Csi::connect(&fx.agent).await;
        let before = fx.state();
        let fs = must("CreateVolume fs", c.ctrl.create_volume(vol_req("conf-cp-fs", 64 * MIB_I, 0, vec![mount_cap("ext4")], &[])).await).volume.unwrap();
        let (_, fs_dev, _) = fx.new_partition(&before, &fx.state()).expect("one partition for the fs volume");
        let blk = must("CreateVolume block", c.ctrl.create_volume(vol_req("conf-cp-blk", 16 * MIB_I, 0, vec![block_cap()], &[])).await).volume.unwrap();
        let spare = must("CreateVolume spare", c.ctrl.create_volume(vol_req("conf-cp-spare", 16 * MIB_I, 0, vec![mount_cap("ext4")], &[])).await).volume.unwrap();
        let (id, bid) = (fs.volume_id.clone(), blk.volume_id.clone());
        let cap = || Some(mount_cap("ext4"));
        let clean = fx.state();

        // --- Malformed requests: INVALID_ARGUMENT [ControllerPublishVolume: REQUIRED fields;
        // unsupported capability; readonly without PUBLISH_READONLY].
        let ia = Code::InvalidArgument;
        r.code("ControllerPublishVolume without volume_id", c.ctrl.controller_publish_volume(cpub("", NODE, cap())).await, ia);
        r.code("ControllerPublishVolume without node_id", c.ctrl.controller_publish_volume(cpub(&id, "", cap())).await, ia);
        r.code("ControllerPublishVolume without volume_capability", c.ctrl.controller_publish_volume(cpub(&id, NODE, None)).await, ia);
        r.code(
            "ControllerPublishVolume with a capability without access_mode",
            c.ctrl.controller_publish_volume(cpub(&id, NODE, Some(csi::VolumeCapability { access_mode: None, ..mount_cap("ext4") }))).await,
            ia,
        );
        r.code(
            "ControllerPublishVolume with a MULTI_NODE capability",
            c.ctrl.controller_publish_volume(cpub(&id, NODE, Some(mount(Mode::MultiNodeMultiWriter, "ext4", &[])))).await,
            ia,
        );
        r.code(
            "ControllerPublishVolume readonly (PUBLISH_READONLY is not advertised)",
            c.ctrl.controller_publish_volume(csi::ControllerPublishVolumeRequest { readonly: true, ..cpub(&id, NODE, cap()) }).await,
            ia,
        );
        r.code("ControllerUnpublishVolume without volume_id", c.ctrl.controller_unpublish_volume(cunpub("", NODE)).await, ia);

        // --- Unknown volume or node: NOT_FOUND (csi-sanity: "should fail when the volume
        // does not exist" / "when the node does not exist").
        let nf = Code::NotFound;
        r.code("ControllerPublishVolume of an unknown volume", c.ctrl.controller_publish_volume(cpub(UNKNOWN_ID, NODE, cap())).await, nf);
        r.code("ControllerPublishVolume to an unknown node", c.ctrl.controller_publish_volume(cpub(&id, "some-fake-node-id", cap())).await, nf);

        // --- A capability the volume cannot serve: FAILED_PRECONDITION, as on the node.
        let fp = Code::FailedPrecondition;
        r.code("ControllerPublishVolume of a filesystem volume for block access", c.ctrl.controller_publish_volume(cpub(&id, NODE, Some(block_cap()))).await, fp);
        r.code("ControllerPublishVolume of a block volume for filesystem access", c.ctrl.controller_publish_volume(cpub(&bid, NODE, cap())).await, fp);
        r.code("ControllerPublishVolume of an ext4 volume as xfs", c.ctrl.controller_publish_volume(cpub(&id, NODE, Some(mount_cap("xfs")))).await, fp);
        r.unchanged("refused ControllerPublishVolume calls", &fx, &clean);
        for v in [&id, &bid] {
            let nodes = published_to(&mut c, v).await;
            r.check(nodes.is_empty(), || format!("a refused ControllerPublishVolume left {v} published to {nodes:?}"));
        }

        // --- Success: the publish context names the partition; repeats give the same
        // answer [idempotency]; the volume reports this node as published.
        let first = r.ok("ControllerPublishVolume", c.ctrl.controller_publish_volume(cpub(&id, NODE, cap())).await);
        if let Some(got) = &first {
            let dev = got.publish_context.get("drivelet.io/device").map(PathBuf::from);
            r.check(dev.as_deref() == Some(fs_dev.as_path()), || format!("publish_context device {dev:?}, want {}", fs_dev.display()));
            let guid = got.publish_context.get("drivelet.io/partition-guid");
            r.check(guid == Some(&id), || format!("publish_context partition-guid {guid:?}, want the volume id {id}"));
            r.check(got.publish_context.len() == 2, || format!("publish_context has extra keys: {:?}", got.publish_context));
        }
        let again = r.ok("ControllerPublishVolume repeated", c.ctrl.controller_publish_volume(cpub(&id, NODE, cap())).await);
        r.check(again == first, || format!("a repeated ControllerPublishVolume answered {again:?}, first {first:?}"));
        let default_fs = r.ok("ControllerPublishVolume repeated with the default filesystem", c.ctrl.controller_publish_volume(cpub(&id, NODE, Some(mount_cap("")))).await);
        r.check(default_fs == first, || "a compatible repeat changed the publish context".into());
        let nodes = published_to(&mut c, &id).await;
        r.check(nodes == [NODE], || format!("ControllerGetVolume of an attached volume: published_node_ids {nodes:?}, want [{NODE}]"));
        if let Some(all) = r.ok("ListVolumes", c.ctrl.list_volumes(csi::ListVolumesRequest::default()).await) {
            for e in &all.entries {
                let vid = e.volume.as_ref().map(|v| v.volume_id.clone()).unwrap_or_default();
                let nodes = e.status.as_ref().map(|s| s.published_node_ids.clone()).unwrap_or_default();
                let want: &[&str] = if vid == id { &[NODE] } else { &[] };
                r.check(nodes == want, || format!("ListVolumes entry {vid}: published_node_ids {nodes:?}, want {want:?}"));
            }
        }
        r.check(fx.state() == clean, || "ControllerPublishVolume changed partitions or mounts".into());

        // --- An attached volume is in use: DeleteVolume is FAILED_PRECONDITION [DeleteVolume
        // Errors: Volume in use] and changes nothing.
        r.code("DeleteVolume of an attached volume", c.ctrl.delete_volume(del_req(&id)).await, fp);
        r.unchanged("DeleteVolume of an attached volume", &fx, &clean);
        r.check(published_to(&mut c, &id).await == [NODE], || "a refused DeleteVolume detached the volume".into());
        (fs, fs_dev, blk, spare)
    });

    // --- The attachment is persisted: after a restart it is still reported, and a
    // repeat still answers the same context.
    assert_eq!(fx.agent.stop(), 0, "the agent did not stop cleanly; log:\n{}", fx.agent.log_tail(20));
    fx.agent.spawn();
    rt.block_on(async {
        let mut c = Csi::connect(&fx.agent).await;
        let (id, bid) = (fs.volume_id.clone(), blk.volume_id.clone());
        let cap = || Some(mount_cap("ext4"));
        let nodes = published_to(&mut c, &id).await;
        r.check(nodes == [NODE], || format!("after a restart the attached volume reports published_node_ids {nodes:?}"));
        if let Some(got) = r.ok("ControllerPublishVolume repeated after a restart", c.ctrl.controller_publish_volume(cpub(&id, NODE, cap())).await) {
            let dev = got.publish_context.get("drivelet.io/device").map(PathBuf::from);
            r.check(dev.as_deref() == Some(fs_dev.as_path()), || format!("publish_context device after a restart {dev:?}"));
        }

        // --- Unpublish: another node is not attached (OK, nothing changes); this node
        // detaches; repeats and unknown volumes are OK [ControllerUnpublishVolume:
        // idempotent; csi-sanity expects OK for a volume it cannot find].
        r.ok("ControllerUnpublishVolume from another node", c.ctrl.controller_unpublish_volume(cunpub(&id, "some-fake-node-id")).await);
        r.check(published_to(&mut c, &id).await == [NODE], || "unpublishing from another node detached the volume from this one".into());
        r.ok("ControllerUnpublishVolume", c.ctrl.controller_unpublish_volume(cunpub(&id, NODE)).await);
        let nodes = published_to(&mut c, &id).await;
        r.check(nodes.is_empty(), || format!("after ControllerUnpublishVolume published_node_ids is {nodes:?}"));
        r.ok("ControllerUnpublishVolume repeated", c.ctrl.controller_unpublish_volume(cunpub(&id, NODE)).await);
        r.ok("ControllerUnpublishVolume of an unknown volume", c.ctrl.controller_unpublish_volume(cunpub(UNKNOWN_ID, NODE)).await);
        r.ok("ControllerUnpublishVolume of a volume never published", c.ctrl.controller_unpublish_volume(cunpub(&bid, NODE)).await);

        // Without a node id: detached from every node.
        r.ok("ControllerPublishVolume of the block volume", c.ctrl.controller_publish_volume(cpub(&bid, NODE, Some(block_cap()))).await);
        r.check(published_to(&mut c, &bid).await == [NODE], || "the block volume is not reported attached".into());
        r.ok("ControllerUnpublishVolume without node_id", c.ctrl.controller_unpublish_volume(cunpub(&bid, "")).await);
        r.check(published_to(&mut c, &bid).await.is_empty(), || "ControllerUnpublishVolume without node_id left the volume attached".into());

        // --- A drive closed to new work: a drive being released takes no new attachment
        // (FAILED_PRECONDITION naming the drive), while an attachment it already has
        // repeats fine; a forced release fails the volumes, and then nothing attaches.
        r.ok("ControllerPublishVolume before the release", c.ctrl.controller_publish_volume(cpub(&id, NODE, cap())).await);
        let drive = fs.volume_context.get("drivelet.io/drive").cloned().expect("volume context names the drive");
        let (ok, out) = ctl(&fx.agent, &["drive", "release", &drive]);
        assert!(ok && out.contains("releasing"), "ctl drive release: {out}");
        let sid = spare.volume_id.clone();
        match c.ctrl.controller_publish_volume(cpub(&sid, NODE, cap())).await {
            Err(s) if s.code() == Code::FailedPrecondition => {
                r.check(s.message().contains(&drive) && s.message().contains("releasing"), || {
                    format!("publish on a releasing drive: the message should name the drive and its state: {}", s.message())
                });
            }
            other => r.fail(format!("ControllerPublishVolume on a releasing drive: want FailedPrecondition, got {other:?}")),
        }
        r.check(published_to(&mut c, &sid).await.is_empty(), || "a refused publish left the volume attached".into());
        r.ok("ControllerPublishVolume repeated on a releasing drive", c.ctrl.controller_publish_volume(cpub(&id, NODE, cap())).await);
        let (ok, out) = ctl(&fx.agent, &["drive", "release", &drive, "--force"]);
        assert!(ok && out.contains("released"), "ctl drive release --force: {out}");
        for v in [&id, &sid] {
            r.code(&format!("ControllerPublishVolume of {v} after a forced release"), c.ctrl.controller_publish_volume(cpub(v, NODE, cap())).await, Code::FailedPrecondition);
        }

        // Clean up: detach, then every volume deletes.
        r.ok("ControllerUnpublishVolume after the release", c.ctrl.controller_unpublish_volume(cunpub(&id, NODE)).await);
        for v in [&id, &bid, &sid] {
            r.ok(&format!("DeleteVolume {v}"), c.ctrl.delete_volume(del_req(v)).await);
        }
    });
    r.finish(&fx);
}
