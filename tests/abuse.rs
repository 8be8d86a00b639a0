//! Abuse campaign: hostile input to every RPC of the real binary, and the sockets
//! against another user.
//!
//! The conformance suite holds the CSI error tables for well-meant mistakes; this one
//! adds input nobody sends by accident: 1 MiB ids, names, paths and tokens, NUL bytes,
//! `..` and symlink escapes on the calls the conformance suite does not walk (unstage,
//! unpublish, node expand, stats), a call at another volume path of the same volume,
//! capacities of i64::MAX and below zero, the most negative page size, access modes
//! outside the enum, mount flags smuggling a second option (`"ro,exec"`), unknown and
//! huge parameter maps.
//!
//! Rules checked:
//! - each hostile request gets the gRPC code its table row names (read off the
//!   validation in src/grpc and the volume manager, and the CSI spec's tables);
//! - the agent answers Probe after every request and its log has no panic;
//! - nothing changes on disk: the managed drive's GPT entries and kernel partitions,
//!   the mounts under the test directory and the tree outside the allowed root are as
//!   they were, and a foreign loop drive holding ext4 is byte-for-byte unchanged;
//! - the CSI and admin sockets are mode 0600 and refuse another user: the drivelet
//!   binary run as nobody (uid 65534, no groups) gets "permission denied" connecting to
//!   either, while the same command as root succeeds.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use drivelet::grpc::proto::csi;
use drivelet::grpc::proto::csi::volume_capability::access_mode::Mode;
use drivelet::grpc::proto::csi::volume_capability::{AccessMode, AccessType, MountVolume};
use tonic::{Code, Status};

const MIB_STR: usize = 1 << 20;

/// What a hostile request must leave as it was.
#[derive(Debug, PartialEq, Eq)]
struct DiskState {
    gpt: Vec<GptEntry>,
    parts: Vec<(String, u64, u64)>,
    mounts: Vec<PathBuf>,
    outside: Vec<(PathBuf, String)>,
}

fn state(managed: &Path, tmp: &Path, outside: &Path) -> DiskState {
    let mut mounts = mounts_under(tmp);
    mounts.sort();
    let mut files: Vec<(PathBuf, String)> = std::fs::read_dir(outside)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            let text = std::fs::read_to_string(&p).unwrap_or_else(|_| "(not a file)".into());
            (p, text)
        })
        .collect();
    files.sort();
    DiskState { gpt: gpt_entries(managed), parts: kernel_parts(managed), mounts, outside: files }
}

/// A capability with any access mode number and mount flags.
fn cap(mode: i32, flags: &[&str]) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(AccessMode { mode }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: "ext4".into(),
            mount_flags: flags.iter().map(|f| f.to_string()).collect(),
            ..Default::default()
        })),
    }
}

type Call = Box<dyn Fn(Csi) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), Status>>>>>;

/// One row: what is sent, and the code it must get (`Code::Ok`: success).
struct Row {
    what: String,
    want: Code,
    call: Call,
}

fn row(what: impl Into<String>, want: Code, call: impl Fn(Csi) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), Status>>>> + 'static) -> Row {
    Row { what: what.into(), want, call: Box::new(call) }
}

#[test]
fn hostile_requests_get_their_codes_and_change_nothing_on_disk() {
    require_host();
    let tmp = short_tempdir();
    let managed = LoopDrive::new(tmp.path(), "a.img", GIB);
    let foreign = LoopDrive::new(tmp.path(), "f.img", 64 * MIB);
    sh("mkfs.ext4", &["-q", "-F", foreign.dev.to_str().unwrap()]);
    sh("sync", &[]);
    sh("udevadm", &["settle"]);
    let foreign_digest = digest(&foreign.file);
    let kubelet = tmp.path().join("kubelet");
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("victim"), "must stay").unwrap();
    std::fs::create_dir_all(kubelet.join("plugins/stage")).unwrap();
    std::fs::create_dir_all(kubelet.join("pods/p/volumes")).unwrap();
    std::os::unix::fs::symlink(&outside, kubelet.join("escape")).unwrap();
    let _unmount = Unmounter(tmp.path().to_path_buf());
    let agent = Agent::start(tmp.path(), AgentOpts::default());

    // One volume staged and published, one created only.
    let staging = kubelet.join("plugins/stage/pub");
    let target = kubelet.join("pods/p/volumes/pub");
    std::fs::create_dir_all(&staging).unwrap();
    let (pub_id, raw_id) = rt().block_on(async {
        let mut c = Csi::connect(&agent).await;
        let p = c.ctrl.create_volume(create_req("abuse-pub", 64 * MIB, mount_cap("ext4"))).await.expect("create").into_inner().volume.unwrap().volume_id;
        let r = c.ctrl.create_volume(create_req("abuse-raw", 64 * MIB, mount_cap("ext4"))).await.expect("create").into_inner().volume.unwrap().volume_id;
        c.node.node_stage_volume(stage_req(&p, &staging, mount_cap("ext4"))).await.expect("stage");
        c.node.node_publish_volume(publish_req(&p, &staging, &target, mount_cap("ext4"), false)).await.expect("publish");
        (p, r)
    });
    std::fs::write(target.join("data"), "kept").unwrap();
    let before = state(&managed.dev, tmp.path(), &outside);
    assert_eq!(before.parts.len(), 2, "two volumes: {before:?}");

    // Hostile values.
    let huge = "v".repeat(MIB_STR);
    let nul = "abuse\0id".to_string();
    let p = |s: &str| s.to_string();
    let dotdot = format!("{}/plugins/../../outside/victim", kubelet.display());
    let escape = format!("{}/escape/victim", kubelet.display());
    let huge_path = format!("{}/{}", kubelet.display(), "a".repeat(MIB_STR));
    let nul_path = format!("{}/pods/p\0/volumes/x", kubelet.display());
    let (st, tg) = (staging.display().to_string(), target.display().to_string());
    let victim = outside.join("victim").display().to_string();
    let many: HashMap<String, String> = (0..1000).map(|i| (format!("k{i}"), "v".into())).collect();
    let swr = Mode::SingleNodeWriter as i32;
    let ia = Code::InvalidArgument;

    let mut rows: Vec<Row> = Vec::new();
    // --- Controller.
    for (what, name) in [("a 1 MiB name", huge.clone()), ("a name with NUL", nul.clone())] {
        rows.push(row(format!("CreateVolume with {what}"), ia, move |mut c| {
            let q = create_req(&name, 64 * MIB, mount_cap("ext4"));
            Box::pin(async move { c.ctrl.create_volume(q).await.map(drop) })
        }));
    }
    for (what, params) in [
        ("a 1 MiB parameter key", HashMap::from([(huge.clone(), p("ssd"))])),
        ("media with NUL", HashMap::from([(p("media"), p("ssd\0"))])),
        ("1000 unknown parameters", many.clone()),
        ("a 1 MiB layout value", HashMap::from([(p("layout"), huge.clone())])),
        ("an unknown drivelet.io/on-node-deleted value", HashMap::from([(p("drivelet.io/on-node-deleted"), p("delete-data"))])),
    ] {
        rows.push(row(format!("CreateVolume with {what}"), ia, move |mut c| {
            let q = csi::CreateVolumeRequest { parameters: params.clone(), ..create_req("abuse-params", 64 * MIB, mount_cap("ext4")) };
            Box::pin(async move { c.ctrl.create_volume(q).await.map(drop) })
        }));
    }
    for mode in [-1, 99, i32::MAX] {
        rows.push(row(format!("CreateVolume with access mode {mode}"), ia, move |mut c| {
            let q = create_req("abuse-mode", 64 * MIB, cap(mode, &[]));
            Box::pin(async move { c.ctrl.create_volume(q).await.map(drop) })
        }));
    }
    for (what, id) in [("a 1 MiB id", huge.clone()), ("an id with NUL", nul.clone())] {
        let i = id.clone();
        rows.push(row(format!("DeleteVolume with {what}"), ia, move |mut c| {
            let q = csi::DeleteVolumeRequest { volume_id: i.clone(), ..Default::default() };
            Box::pin(async move { c.ctrl.delete_volume(q).await.map(drop) })
        }));
        let i = id.clone();
        rows.push(row(format!("ControllerGetVolume with {what}"), ia, move |mut c| {
            let q = csi::ControllerGetVolumeRequest { volume_id: i.clone() };
            Box::pin(async move { c.ctrl.controller_get_volume(q).await.map(drop) })
        }));
        let i = id.clone();
        rows.push(row(format!("ControllerExpandVolume with {what}"), ia, move |mut c| {
            let q = csi::ControllerExpandVolumeRequest { volume_id: i.clone(), capacity_range: Some(csi::CapacityRange { required_bytes: GIB as i64, limit_bytes: 0 }), ..Default::default() };
            Box::pin(async move { c.ctrl.controller_expand_volume(q).await.map(drop) })
        }));
        let i = id.clone();
        rows.push(row(format!("NodeGetVolumeStats with {what}"), ia, move |mut c| {
            let q = csi::NodeGetVolumeStatsRequest { volume_id: i.clone(), volume_path: p("/x"), ..Default::default() };
            Box::pin(async move { c.node.node_get_volume_stats(q).await.map(drop) })
        }));
        let i = id.clone();
        rows.push(row(format!("ControllerPublishVolume with {what}"), ia, move |mut c| {
            let q = csi::ControllerPublishVolumeRequest { volume_id: i.clone(), node_id: NODE.into(), volume_capability: Some(mount_cap("ext4")), ..Default::default() };
            Box::pin(async move { c.ctrl.controller_publish_volume(q).await.map(drop) })
        }));
        let i = id.clone();
        rows.push(row(format!("ControllerPublishVolume with {what} as node id"), ia, {
            let v = pub_id.clone();
            move |mut c| {
                let q = csi::ControllerPublishVolumeRequest { volume_id: v.clone(), node_id: i.clone(), volume_capability: Some(mount_cap("ext4")), ..Default::default() };
                Box::pin(async move { c.ctrl.controller_publish_volume(q).await.map(drop) })
            }
        }));
    }
    for (what, required, limit, want) in [
        ("required i64::MAX", i64::MAX, 0, Code::OutOfRange),
        ("required and limit i64::MAX", i64::MAX, i64::MAX, Code::OutOfRange),
        ("required -1", -1, 0, ia),
        ("limit i64::MIN", 0, i64::MIN, ia),
        ("limit below required", 2 * GIB as i64, GIB as i64, ia),
    ] {
        let v = pub_id.clone();
        rows.push(row(format!("ControllerExpandVolume with {what}"), want, move |mut c| {
            let q = csi::ControllerExpandVolumeRequest { volume_id: v.clone(), capacity_range: Some(csi::CapacityRange { required_bytes: required, limit_bytes: limit }), ..Default::default() };
            Box::pin(async move { c.ctrl.controller_expand_volume(q).await.map(drop) })
        }));
    }
    {
        let v = pub_id.clone();
        rows.push(row("ControllerExpandVolume with access mode 99", ia, move |mut c| {
            let q = csi::ControllerExpandVolumeRequest {
                volume_id: v.clone(),
                capacity_range: Some(csi::CapacityRange { required_bytes: 128 * MIB as i64, limit_bytes: 0 }),
                volume_capability: Some(cap(99, &[])),
                ..Default::default()
            };
            Box::pin(async move { c.ctrl.controller_expand_volume(q).await.map(drop) })
        }));
        let v = pub_id.clone();
        rows.push(row("ControllerPublishVolume with access mode -1", ia, move |mut c| {
            let q = csi::ControllerPublishVolumeRequest { volume_id: v.clone(), node_id: NODE.into(), volume_capability: Some(cap(-1, &[])), ..Default::default() };
            Box::pin(async move { c.ctrl.controller_publish_volume(q).await.map(drop) })
        }));
        let v = pub_id.clone();
        rows.push(row("ValidateVolumeCapabilities with an unknown parameter", ia, move |mut c| {
            let q = csi::ValidateVolumeCapabilitiesRequest { volume_id: v.clone(), volume_capabilities: vec![mount_cap("ext4")], parameters: HashMap::from([(p("meda"), p("ssd"))]), ..Default::default() };
            Box::pin(async move { c.ctrl.validate_volume_capabilities(q).await.map(drop) })
        }));
        let v = pub_id.clone();
        rows.push(row("ValidateVolumeCapabilities with access mode 99 (answered, not confirmed)", Code::Ok, move |mut c| {
            let q = csi::ValidateVolumeCapabilitiesRequest { volume_id: v.clone(), volume_capabilities: vec![cap(99, &[])], ..Default::default() };
            Box::pin(async move {
                let r = c.ctrl.validate_volume_capabilities(q).await?.into_inner();
                if r.confirmed.is_some() {
                    return Err(Status::internal("confirmed a capability with access mode 99"));
                }
                Ok(())
            })
        }));
        let params = HashMap::from([(p("layout"), p("stripe\0"))]);
        rows.push(row("GetCapacity with layout=stripe\\0", ia, move |mut c| {
            let q = csi::GetCapacityRequest { parameters: params.clone(), ..Default::default() };
            Box::pin(async move { c.ctrl.get_capacity(q).await.map(drop) })
        }));
        rows.push(row("GetCapacity with access mode -5", ia, move |mut c| {
            let q = csi::GetCapacityRequest { volume_capabilities: vec![cap(-5, &[])], ..Default::default() };
            Box::pin(async move { c.ctrl.get_capacity(q).await.map(drop) })
        }));
    }
    for (what, max, token, want) in [
        ("max_entries i32::MIN", i32::MIN, String::new(), ia),
        ("a NUL token", 0, p("\0"), Code::Aborted),
        ("a 1 MiB token", 0, huge.clone(), Code::Aborted),
        ("a forged token", 0, p("ffffffffffffffff:../../etc"), Code::Aborted),
        ("a token with a NUL id", 0, p("0:\0"), Code::Aborted),
    ] {
        rows.push(row(format!("ListVolumes with {what}"), want, move |mut c| {
            let q = csi::ListVolumesRequest { max_entries: max, starting_token: token.clone() };
            Box::pin(async move { c.ctrl.list_volumes(q).await.map(drop) })
        }));
    }
    // --- Node.
    for (what, path, flags, mode) in [
        ("a path with NUL", nul_path.clone(), vec![], swr),
        ("a 1 MiB path", huge_path.clone(), vec![], swr),
        ("mount flag \"ro,exec\"", st.replace("/pub", "/raw"), vec!["ro,exec"], swr),
        ("mount flag \"nosuid\\0exec\"", st.replace("/pub", "/raw"), vec!["nosuid\0exec"], swr),
        ("mount flag \"data=ordered,exec\"", st.replace("/pub", "/raw"), vec!["data=ordered,exec"], swr),
        ("access mode 99", st.replace("/pub", "/raw"), vec![], 99),
    ] {
        let v = raw_id.clone();
        rows.push(row(format!("NodeStageVolume with {what}"), ia, move |mut c| {
            let q = csi::NodeStageVolumeRequest { volume_id: v.clone(), staging_target_path: path.clone(), volume_capability: Some(cap(mode, &flags)), ..Default::default() };
            Box::pin(async move { c.node.node_stage_volume(q).await.map(drop) })
        }));
    }
    let other_target = kubelet.join("pods/p/volumes/other").display().to_string();
    for (what, path, flags, mode) in [
        ("a target with NUL", nul_path.clone(), vec![], swr),
        ("a 1 MiB target", huge_path.clone(), vec![], swr),
        ("mount flag \"ro,exec\"", other_target.clone(), vec!["ro,exec"], swr),
        ("mount flag \"ro exec\"", other_target.clone(), vec!["ro exec"], swr),
        ("access mode 99", other_target.clone(), vec![], 99),
    ] {
        let (v, s) = (pub_id.clone(), st.clone());
        rows.push(row(format!("NodePublishVolume with {what}"), ia, move |mut c| {
            let q = csi::NodePublishVolumeRequest {
                volume_id: v.clone(),
                staging_target_path: s.clone(),
                target_path: path.clone(),
                volume_capability: Some(cap(mode, &flags)),
                ..Default::default()
            };
            Box::pin(async move { c.node.node_publish_volume(q).await.map(drop) })
        }));
    }
    // Unpublish and unstage at paths the volume is not at are done already (OK), and
    // must touch nothing there: not a file outside, not a symlink, not the volume's
    // own other mount.
    for (what, path, want) in [
        ("a file outside the roots", victim.clone(), Code::Ok),
        ("'..' out of the roots", dotdot.clone(), Code::Ok),
        ("a path under a symlink out of the roots", escape.clone(), Code::Ok),
        ("the symlink out of the roots", format!("{}/escape", kubelet.display()), Code::Ok),
        ("a path with NUL", nul_path.clone(), Code::Ok),
        ("the volume's own staging path", st.clone(), Code::Ok),
        ("a 1 MiB path", huge_path.clone(), ia),
    ] {
        let v = pub_id.clone();
        rows.push(row(format!("NodeUnpublishVolume at {what}"), want, move |mut c| {
            let q = csi::NodeUnpublishVolumeRequest { volume_id: v.clone(), target_path: path.clone() };
            Box::pin(async move { c.node.node_unpublish_volume(q).await.map(drop) })
        }));
    }
    for (what, path, want) in [
        ("a file outside the roots", victim.clone(), Code::Ok),
        ("'..' out of the roots", dotdot.clone(), Code::Ok),
        ("the symlink out of the roots", format!("{}/escape", kubelet.display()), Code::Ok),
        ("a path with NUL", nul_path.clone(), Code::Ok),
        // Its target is a mount of the volume too: unstaging a published volume is
        // refused ("Volume published", FAILED_PRECONDITION).
        ("the volume's own target", tg.clone(), Code::FailedPrecondition),
        ("a 1 MiB path", huge_path.clone(), ia),
    ] {
        let v = pub_id.clone();
        rows.push(row(format!("NodeUnstageVolume at {what}"), want, move |mut c| {
            let q = csi::NodeUnstageVolumeRequest { volume_id: v.clone(), staging_target_path: path.clone() };
            Box::pin(async move { c.node.node_unstage_volume(q).await.map(drop) })
        }));
    }
    for (what, path, range, want) in [
        ("'..' out of the roots", dotdot.clone(), None, Code::NotFound),
        ("a path under a symlink out of the roots", escape.clone(), None, Code::NotFound),
        ("a path with NUL", nul_path.clone(), None, Code::NotFound),
        ("a 1 MiB path", huge_path.clone(), None, ia),
        ("required_bytes -1", tg.clone(), Some((-1, 0)), ia),
        ("limit_bytes i64::MIN", tg.clone(), Some((0, i64::MIN)), ia),
    ] {
        let v = pub_id.clone();
        rows.push(row(format!("NodeExpandVolume at {what}"), want, move |mut c| {
            let q = csi::NodeExpandVolumeRequest {
                volume_id: v.clone(),
                volume_path: path.clone(),
                capacity_range: range.map(|(r, l)| csi::CapacityRange { required_bytes: r, limit_bytes: l }),
                ..Default::default()
            };
            Box::pin(async move { c.node.node_expand_volume(q).await.map(drop) })
        }));
    }
    for (what, path, want) in [
        ("'..' out of the roots", dotdot.clone(), Code::NotFound),
        ("a path with NUL", nul_path.clone(), Code::NotFound),
        ("the symlink out of the roots", format!("{}/escape", kubelet.display()), Code::NotFound),
        ("a 1 MiB path", huge_path.clone(), ia),
    ] {
        let v = pub_id.clone();
        rows.push(row(format!("NodeGetVolumeStats at {what}"), want, move |mut c| {
            let q = csi::NodeGetVolumeStatsRequest { volume_id: v.clone(), volume_path: path.clone(), ..Default::default() };
            Box::pin(async move { c.node.node_get_volume_stats(q).await.map(drop) })
        }));
    }

    // Every row against the agent; every violation is reported at the end.
    let mut bad = Vec::new();
    for r in &rows {
        let got = rt().block_on(async {
            let c = Csi::connect(&agent).await;
            tokio::time::timeout(std::time::Duration::from_secs(60), (r.call)(c)).await.unwrap_or_else(|_| Err(Status::deadline_exceeded("hung for 60 s")))
        });
        let code = got.as_ref().err().map_or(Code::Ok, Status::code);
        if code != r.want {
            bad.push(format!("{}: want {:?}, got {:?} {}", r.what, r.want, code, got.err().map(|s| s.message().chars().take(200).collect::<String>()).unwrap_or_default()));
        }
        let ready = rt().block_on(async { Csi::connect(&agent).await.id.probe(csi::ProbeRequest {}).await.ok().and_then(|p| p.into_inner().ready) });
        if ready != Some(true) {
            bad.push(format!("{}: Probe does not say ready afterwards ({ready:?})", r.what));
        }
        let now = state(&managed.dev, tmp.path(), &outside);
        if now != before {
            bad.push(format!("{}: the disks changed:\n    before {before:?}\n    after  {now:?}", r.what));
            break;
        }
    }
    assert!(digest(&foreign.file) == foreign_digest, "the foreign ext4 drive was written to");
    assert_eq!(std::fs::read_to_string(target.join("data")).ok().as_deref(), Some("kept"), "the published volume's data");
    assert!(!agent.logs().contains("panicked"), "the agent's log has a panic:\n{}", agent.log_tail(60));
    assert!(bad.is_empty(), "{} of {} hostile requests misbehaved:\n  - {}\nlog:\n{}", bad.len(), rows.len(), bad.join("\n  - "), agent.log_tail(20));

    // Clean up through the API: nothing of the abuse is left behind.
    rt().block_on(async {
        let mut c = Csi::connect(&agent).await;
        c.node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest { volume_id: pub_id.clone(), target_path: tg.clone() }).await.expect("unpublish");
        c.node.node_unstage_volume(csi::NodeUnstageVolumeRequest { volume_id: pub_id.clone(), staging_target_path: st.clone() }).await.expect("unstage");
        for id in [&pub_id, &raw_id] {
            c.ctrl.delete_volume(csi::DeleteVolumeRequest { volume_id: id.clone(), ..Default::default() }).await.expect("delete");
        }
    });
    assert!(kernel_parts(&managed.dev).is_empty() && gpt_entries(&managed.dev).is_empty(), "volumes left on the managed drive");
    assert!(digest(&foreign.file) == foreign_digest, "the foreign ext4 drive was written to");
}

/// Runs the drivelet binary as nobody (uid and gid 65534, no supplementary groups).
fn as_nobody(args: &[&str]) -> std::process::Output {
    Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups", "--"])
        .arg(bin())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("setpriv (util-linux) is needed to run a client as another user: {e}"))
}

#[test]
fn the_sockets_are_owner_only_and_refuse_another_user() {
    use std::os::unix::fs::PermissionsExt;
    require_host();
    let tmp = short_tempdir();
    // Let other users reach the sockets' directory, so only the sockets' own mode
    // stands in the way.
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let _drive = LoopDrive::new(tmp.path(), "a.img", 64 * MIB);
    let mut agent = Agent::start(tmp.path(), AgentOpts::default());
    for s in [&agent.csi_socket, &agent.admin_socket] {
        let mode = std::fs::metadata(s).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{} has mode {mode:o}", s.display());
    }
    // The binary itself runs as nobody (so a refusal below is the socket's).
    let help = as_nobody(&["--version"]);
    assert!(help.status.success(), "the drivelet binary cannot run as nobody: {}", String::from_utf8_lossy(&help.stderr));
    let (csi_s, admin_s) = (agent.csi_socket.display().to_string(), agent.admin_socket.display().to_string());
    for (what, args) in [("CSI", vec!["csi", "--endpoint", csi_s.as_str(), "info"]), ("admin", vec!["ctl", "--socket", admin_s.as_str(), "drives"])] {
        let out = as_nobody(&args);
        let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
        assert!(!out.status.success(), "nobody reached the {what} socket: {}", String::from_utf8_lossy(&out.stdout));
        assert!(err.contains("permission denied"), "nobody was refused the {what} socket, but not for permission: {err}");
        let root = Command::new(bin()).args(&args).output().unwrap();
        assert!(root.status.success(), "root cannot use the {what} socket: {}", String::from_utf8_lossy(&root.stderr));
    }
    assert_eq!(agent.stop(), 0);
}
