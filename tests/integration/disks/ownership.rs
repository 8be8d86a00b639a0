//! Data belongs to its disk: every drivelet disk names its owner (a node of a cluster) and
//! what its volumes are, so a disk moved to another node, or a node whose state dir is
//! lost, gets its data back; and a disk that is someone else's is never taken by
//! surprise.
//!
//! Checked with the real binary on real loop drives:
//! - a disk of another node (the same loop file under an agent with another node name
//!   and an empty state dir) is `owned-elsewhere`, its reason names the owner and the
//!   claims its volumes serve, nothing is placed on it and not a byte of it changes;
//!   `drivelet ctl drive adopt` makes it this node's and its volumes are served with
//!   their data (block bytes, an ext4 file not formatted again);
//! - a disk made to look like drivelet's (its disk GUID prefix, a partition of its type
//!   named `drivelet:../../../../etc/passwd`, no note) is owned-elsewhere and never
//!   written;
//! - the state dir wiped: every volume comes back from its disk, served as before (name,
//!   block or ext4, data);
//! - an adoption killed before or after its one write leaves the disk whole: owned
//!   elsewhere, or this node's with its volumes served (`adopt_killed_at_either_point`);
//! - the note follows the table in the same commit: a volume grown is noted at its new
//!   size, a volume deleted leaves the note (the note keeper held, so only the table's
//!   commits write).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;
use drivelet::grpc::proto::csi;
use tonic::Code;

const MIB: u64 = 1 << 20;

/// The provisioner's `--extra-create-metadata` parameters for claim `apps/NAME`.
fn meta(pv: &str, claim: &str) -> Vec<(String, String)> {
    vec![
        ("csi.storage.k8s.io/pv/name".into(), pv.into()),
        ("csi.storage.k8s.io/pvc/name".into(), claim.into()),
        ("csi.storage.k8s.io/pvc/namespace".into(), "apps".into()),
    ]
}

async fn create(c: &mut Csi, name: &str, claim: &str, cap: csi::VolumeCapability) -> Result<String, tonic::Status> {
    let m = meta(name, claim);
    let params: Vec<(&str, &str)> = m.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let req = vol_req(name, 32 * MIB as i64, 0, vec![cap], &params);
    c.ctrl.create_volume(req).await.map(|r| r.into_inner().volume.unwrap().volume_id)
}

/// The volume `id` as `ctl volumes` shows it.
pub(crate) fn volume(agent: &Agent, id: &str) -> Option<serde_json::Value> {
    agent.ctl_volumes().as_array()?.iter().find(|v| v["id"] == id).cloned()
}

/// Waits (15 s) until `f` holds of the drive over `dev`.
pub(crate) fn wait_drive(agent: &Agent, dev: &Path, what: &str, f: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let start = Instant::now();
    loop {
        if let Some(d) = drive_by_path(&agent.ctl_drives(), dev).filter(|d| f(d)) {
            return d.clone();
        }
        assert!(start.elapsed() < Duration::from_secs(15), "{}: not {what} within 15 s: {}\n{}", dev.display(), agent.ctl_drives(), agent.log_tail(30));
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits (15 s) until the disk's note (read from the image file) names `needle`.
pub(crate) fn wait_note(file: &Path, needle: &str) {
    let start = Instant::now();
    loop {
        let bytes = std::fs::read(file).map(|b| b[64 << 10..512 << 10].to_vec()).unwrap_or_default();
        if bytes.windows(8).any(|w| w == b"DRVLNOTE") && bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(15), "{}: no note naming {needle:?} within 15 s", file.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Restarts `agent` as node `node` with its state dir wiped (another machine, or this one
/// reinstalled), or kept.
pub(crate) fn restart_as(agent: &mut Agent, node: &str, wipe_state: bool) {
    if agent.child.is_some() {
        agent.stop();
    }
    let text = std::fs::read_to_string(&agent.config).unwrap();
    let mut out = String::new();
    for line in text.lines() {
        if line.starts_with("node_name = ") {
            out.push_str(&format!("node_name = \"{node}\"\n"));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    std::fs::write(&agent.config, out).unwrap();
    if wipe_state {
        std::fs::remove_dir_all(agent.dir.join("state")).unwrap();
    }
    agent.spawn();
}

/// `drivelet ctl drive adopt ID`: its stdout, or its stderr when it fails.
pub(crate) fn adopt(agent: &Agent, id: &str) -> Result<String, String> {
    let out = Command::new(bin()).args(["ctl", "--socket", agent.admin_socket.to_str().unwrap(), "drive", "adopt", id]).output().unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// A disk of node `test-node` (the default agent) holding a 32 MiB block volume with 1 MiB
/// of 0x5a at its start (claim apps/data-block) and a 32 MiB ext4 volume with a file
/// `hello` (claim apps/data-fs); the agent is stopped. Answers the agent, the drive, and
/// the two volume ids.
pub(crate) fn disk_of_test_node(dir: &Path) -> (Agent, LoopDrive, String, String) {
    let drive = LoopDrive::new(dir, "d0.img", 256 * MIB);
    let mut agent = Agent::start(dir, AgentOpts::default());
    let rt = rt();
    let (block_id, fs_id) = rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        let b = create(&mut c, "pvc-own-block", "data-block", block_cap()).await.expect("block volume");
        let f = create(&mut c, "pvc-own-fs", "data-fs", mount_cap("ext4")).await.expect("ext4 volume");
        (b, f)
    });
    let start = volume(&agent, &block_id).expect("listed")["start"].as_u64().unwrap();
    fill(&drive.dev, start, start + MIB, 0x5a);
    write_file(&agent, &fs_id, "hello", b"data of claim apps/data-fs");
    wait_note(&drive.file, "data-fs");
    agent.stop();
    (agent, drive, block_id, fs_id)
}

/// Stages and publishes the ext4 volume `id`, runs `f` on its target, and unpublishes
/// and unstages it.
fn with_mounted<T>(agent: &Agent, id: &str, f: impl FnOnce(&Path) -> T) -> T {
    let staging = agent.dir.join("kubelet/staging").join(id);
    let target = agent.dir.join("kubelet/pods/p1/volumes").join(id);
    std::fs::create_dir_all(&staging).unwrap();
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    let rt = rt();
    rt.block_on(async {
        let mut c = Csi::connect(agent).await;
        c.node.node_stage_volume(stage_req(id, &staging, mount_cap("ext4"))).await.expect("stage");
        c.node.node_publish_volume(publish_req(id, &staging, &target, mount_cap("ext4"), false)).await.expect("publish");
    });
    let out = f(&target);
    rt.block_on(async {
        let mut c = Csi::connect(agent).await;
        c.node.node_unpublish_volume(unpublish_req(id, &target)).await.expect("unpublish");
        c.node.node_unstage_volume(unstage_req(id, &staging)).await.expect("unstage");
    });
    out
}

pub(crate) fn write_file(agent: &Agent, id: &str, name: &str, data: &[u8]) {
    with_mounted(agent, id, |t| std::fs::write(t.join(name), data).unwrap());
}

pub(crate) fn read_file(agent: &Agent, id: &str, name: &str) -> Option<Vec<u8>> {
    with_mounted(agent, id, |t| std::fs::read(t.join(name)).ok())
}

/// The first MiB of the block volume at `start` is still 0x5a.
pub(crate) fn block_data_intact(file: &Path, start: u64) -> bool {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; MIB as usize];
    std::fs::File::open(file).unwrap().read_exact_at(&mut buf, start).unwrap();
    buf.iter().all(|&b| b == 0x5a)
}

/// Both volumes listed, as they were made, with their data.
pub(crate) fn assert_served(agent: &Agent, drive: &LoopDrive, block_id: &str, fs_id: &str) {
    let start = Instant::now();
    while volume(agent, block_id).is_none() || volume(agent, fs_id).is_none() {
        assert!(start.elapsed() < Duration::from_secs(15), "volumes not served within 15 s: {}\n{}", agent.ctl_volumes(), agent.log_tail(40));
        std::thread::sleep(Duration::from_millis(50));
    }
    let b = volume(agent, block_id).unwrap();
    let f = volume(agent, fs_id).unwrap();
    assert_eq!((b["name"].as_str(), b["block"].as_bool()), (Some("pvc-own-block"), Some(true)), "{b}");
    assert_eq!((f["name"].as_str(), f["fs_type"].as_str(), f["formatted"].as_bool()), (Some("pvc-own-fs"), Some("ext4"), Some(true)), "{f}");
    assert_eq!(f["binding"]["claim_name"], "data-fs", "the claim it serves, from the note: {f}");
    assert!(block_data_intact(&drive.file, b["start"].as_u64().unwrap()), "the block volume's bytes");
    assert_eq!(read_file(agent, fs_id, "hello").as_deref(), Some(&b"data of claim apps/data-fs"[..]), "the ext4 volume's file (not formatted again)");
}

#[test]
fn a_disk_of_another_node_is_shown_as_its_owners_never_written_and_served_after_adopt() {
    require_host();
    let tmp = short_tempdir();
    let (mut agent, drive, block_id, fs_id) = disk_of_test_node(tmp.path());
    let before = digest(&drive.file);

    // Moved to node-b (another machine: its own, empty state dir).
    restart_as(&mut agent, "node-b", true);
    let d = wait_drive(&agent, &drive.dev, "owned elsewhere", |d| d["class"] == "owned-elsewhere");
    let reason = d["reason"].as_str().unwrap();
    for words in ["belongs to node test-node of this cluster", "holds 2 volumes", "claim apps/data-block (32.0 MiB)", "claim apps/data-fs (32.0 MiB)", "until an admin adopts it"] {
        assert!(reason.contains(words), "the reason says {words:?}: {reason}");
    }
    assert!(agent.ctl_volumes().as_array().unwrap().is_empty(), "none of its volumes is served here: {}", agent.ctl_volumes());
    let refused = rt().block_on(async {
        let mut c = Csi::connect(&agent).await;
        create(&mut c, "pvc-new", "new", block_cap()).await
    });
    assert_eq!(refused.map_err(|s| s.code()), Err(Code::ResourceExhausted), "nothing is placed on it");
    // The rescan, the health poller and the cleaner have had their turn.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(digest(&drive.file), before, "not a byte of another node's disk changed");

    let id = d["id"].as_str().unwrap();
    let said = adopt(&agent, id).expect("adopt");
    assert!(said.contains("adopted from node test-node of this cluster"), "{said}");
    assert!(said.contains("of claim apps/data-fs"), "{said}");
    wait_drive(&agent, &drive.dev, "managed", |d| d["class"] == "managed");
    assert_served(&agent, &drive, &block_id, &fs_id);
    wait_note(&drive.file, "node-b");
    assert_eq!(adopt(&agent, id).expect("again").trim(), format!("drive {id}: this node's already; nothing written"));

    // The adoption lasts: a restart finds the disk node-b's.
    restart_as(&mut agent, "node-b", false);
    wait_drive(&agent, &drive.dev, "managed", |d| d["class"] == "managed");
    assert_served(&agent, &drive, &block_id, &fs_id);
    // And the old owner, back with its store, finds it someone else's.
    restart_as(&mut agent, "test-node", true);
    let d = wait_drive(&agent, &drive.dev, "owned elsewhere", |d| d["class"] == "owned-elsewhere");
    assert!(d["reason"].as_str().unwrap().contains("belongs to node node-b of this cluster"), "{d}");
}

#[test]
fn with_the_state_dir_wiped_every_volume_is_served_again_from_its_disk() {
    require_host();
    let tmp = short_tempdir();
    let (mut agent, drive, block_id, fs_id) = disk_of_test_node(tmp.path());
    restart_as(&mut agent, NODE, true);
    wait_drive(&agent, &drive.dev, "managed", |d| d["class"] == "managed");
    assert_served(&agent, &drive, &block_id, &fs_id);
    let log = agent.logs();
    assert!(log.contains("served again as volume") && log.contains("of claim apps/data-fs, as the drive's note says"), "{}", agent.log_tail(40));
}

/// The note keeper held: the note says only what the table's commits wrote (the volumes
/// as created; whether a filesystem was made is never noted). With the state dir wiped,
/// the filesystem found on the volume is data: served, never formatted again.
#[test]
fn a_filesystem_the_note_does_not_know_of_is_found_and_never_formatted_again() {
    require_host();
    let tmp = short_tempdir();
    let drive = LoopDrive::new(tmp.path(), "d0.img", 256 * MIB);
    let mut agent = Agent::start_env(tmp.path(), AgentOpts::default(), &[("FAILPOINTS", "notes.keeper=return")]);
    let fs_id = rt().block_on(async {
        let mut c = Csi::connect(&agent).await;
        create(&mut c, "pvc-own-fs", "data-fs", mount_cap("ext4")).await.expect("ext4 volume")
    });
    wait_note(&drive.file, "data-fs");
    write_file(&agent, &fs_id, "hello", b"made after the note");
    assert_eq!(volume(&agent, &fs_id).unwrap()["formatted"], true);
    agent.kill();
    std::fs::remove_dir_all(tmp.path().join("state")).unwrap();
    agent.spawn();
    let start = Instant::now();
    while volume(&agent, &fs_id).is_none() {
        assert!(start.elapsed() < Duration::from_secs(15), "not served: {}\n{}", agent.ctl_volumes(), agent.log_tail(30));
        std::thread::sleep(Duration::from_millis(50));
    }
    let v = volume(&agent, &fs_id).unwrap();
    assert_eq!((v["fs_type"].as_str(), v["formatted"].as_bool()), (Some("ext4"), Some(true)), "found on the disk: {v}");
    assert_eq!(read_file(&agent, &fs_id, "hello").as_deref(), Some(&b"made after the note"[..]), "the file is there: not formatted again");
    assert_eq!(agent.logs().matches("\"filesystem made\"").count(), 1, "formatted once, at the first stage only");
}

#[test]
fn a_disk_made_to_look_like_drivelets_is_owned_elsewhere_and_never_written() {
    require_host();
    let tmp = short_tempdir();
    let file = tmp.path().join("crafted.img");
    std::fs::File::create(&file).unwrap().set_len(128 * MIB).unwrap();
    // drivelet's disk GUID prefix and partition type, a hostile name, and no note.
    let script = format!(
        "label: gpt\nlabel-id: 6472766C-1111-4222-8333-444455556666\nstart=2048, size=65536, type={}, name=\"drivelet:../../../../etc/passwd\"\n",
        drivelet::disk::gpt::PARTITION_TYPE.to_uppercase()
    );
    let mut child = Command::new("sfdisk").arg("--no-reread").arg("--no-tell-kernel").arg(&file).stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::null()).spawn().unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), script.as_bytes()).unwrap();
    assert!(child.wait().unwrap().success(), "sfdisk");
    let drive = LoopDrive { dev: PathBuf::from(sh("losetup", &["--find", "--show", "--partscan", file.to_str().unwrap()])), file: file.clone() };
    sh("udevadm", &["settle"]);
    let before = digest(&drive.file);

    let agent = Agent::start(tmp.path(), AgentOpts::default());
    let d = wait_drive(&agent, &drive.dev, "owned elsewhere", |d| d["class"] == "owned-elsewhere");
    let reason = d["reason"].as_str().unwrap();
    assert!(reason.contains("no note of whose they are") && reason.contains("1 drivelet partition"), "{reason}");
    assert!(agent.ctl_volumes().as_array().unwrap().is_empty(), "nothing adopted from it: {}", agent.ctl_volumes());
    let refused = rt().block_on(async {
        let mut c = Csi::connect(&agent).await;
        create(&mut c, "pvc-x", "x", block_cap()).await
    });
    assert_eq!(refused.map_err(|s| s.code()), Err(Code::ResourceExhausted));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(digest(&drive.file), before, "not a byte of the crafted disk changed");
}

/// The volumes the note on `file` lists (snapshots left out): id and size in bytes.
fn noted_sizes(file: &Path) -> std::collections::BTreeMap<String, u64> {
    let note = drivelet::disk::gpt::read_note(file).unwrap_or_else(|| panic!("{}: no readable note", file.display()));
    note.volumes.iter().filter(|v| !v.snapshot).map(|v| (v.id.to_string(), v.size)).collect()
}

/// Waits (15 s) until the note on `file` lists exactly `want` (id and size).
fn wait_noted(file: &Path, want: &[(&str, u64)], what: &str) {
    let want: std::collections::BTreeMap<String, u64> = want.iter().map(|(id, size)| (id.to_string(), *size)).collect();
    let start = Instant::now();
    loop {
        let have = noted_sizes(file);
        if have == want {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(15), "{what}: the note lists {have:?}, not {want:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// With the note keeper held, the table's own commits keep the note: created at 32 MiB,
/// grown to 64 MiB (ControllerExpandVolume), and gone once deleted while another volume
/// stays at its size.
#[test]
fn the_note_follows_an_expand_and_a_delete_in_the_tables_own_commit() {
    require_host();
    let tmp = short_tempdir();
    let drive = LoopDrive::new(tmp.path(), "d0.img", 256 * MIB);
    let agent = Agent::start_env(tmp.path(), AgentOpts::default(), &[("FAILPOINTS", "notes.keeper=return")]);
    let rt = rt();
    let grown_id = rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        create(&mut c, "pvc-note-grown", "data-grown", block_cap()).await.expect("volume to grow")
    });
    wait_noted(&drive.file, &[(&grown_id, 32 * MIB)], "created");

    let r = rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        c.ctrl.controller_expand_volume(expand_req(&grown_id, 64 * MIB, 0)).await.expect("expand").into_inner()
    });
    assert_eq!(r.capacity_bytes, 64 * MIB as i64, "grown");
    assert_eq!(volume(&agent, &grown_id).unwrap()["size"], 64 * MIB, "the volume as listed");
    wait_noted(&drive.file, &[(&grown_id, 64 * MIB)], "grown");

    let kept_id = rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        create(&mut c, "pvc-note-kept", "data-kept", block_cap()).await.expect("volume to keep")
    });
    wait_noted(&drive.file, &[(&grown_id, 64 * MIB), (&kept_id, 32 * MIB)], "a second volume made");
    rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        c.ctrl.delete_volume(csi::DeleteVolumeRequest { volume_id: grown_id.clone(), ..Default::default() }).await.expect("delete");
    });
    wait_noted(&drive.file, &[(&kept_id, 32 * MIB)], "the grown volume deleted");
    assert!(volume(&agent, &grown_id).is_none(), "deleted: {}", agent.ctl_volumes());
}

/// The crash points of an adoption (`src/actors/inventory/mod.rs`).
pub(crate) const ADOPT_POINTS: &[&str] = &["adopt.before_note", "adopt.note_written"];

/// An adoption killed before its note is written leaves the disk owned elsewhere, and
/// asking again adopts it; one killed after finds the disk this node's at the restart,
/// its volumes served, and asking again changes nothing.
#[test]
fn adopt_killed_at_either_point_leaves_the_disk_whole_and_asking_again_finishes() {
    require_host();
    let armed = Command::new("grep").args(["-q", "-a", "-F", ADOPT_POINTS[0], bin()]).status().unwrap();
    assert!(armed.success(), "{} has no crash points compiled in: build with `--features failpoints` (scripts/test.sh does)", bin());
    for &point in ADOPT_POINTS {
        let tmp = short_tempdir();
        let (mut agent, drive, block_id, fs_id) = disk_of_test_node(tmp.path());
        let before = digest(&drive.file);
        restart_as(&mut agent, "node-b", true);
        let id = wait_drive(&agent, &drive.dev, "owned elsewhere", |d| d["class"] == "owned-elsewhere")["id"].as_str().unwrap().to_string();
        agent.stop();
        agent.spawn_with(&[("FAILPOINTS", &format!("{point}=return"))]);
        agent.wait_ready();
        wait_drive(&agent, &drive.dev, "owned elsewhere", |d| d["class"] == "owned-elsewhere");
        assert!(adopt(&agent, &id).is_err(), "{point}: the agent dies in the adoption");
        assert!(agent.wait_exit(Duration::from_secs(10)).is_some(), "{point}: killed");
        agent.spawn();
        if point == "adopt.before_note" {
            wait_drive(&agent, &drive.dev, "owned elsewhere", |d| d["class"] == "owned-elsewhere");
            assert_eq!(digest(&drive.file), before, "{point}: nothing written");
            assert!(adopt(&agent, &id).expect("asked again").contains("adopted from node test-node"), "{point}");
        } else {
            assert!(adopt(&agent, &id).expect("asked again").contains("this node's already"), "{point}");
        }
        wait_drive(&agent, &drive.dev, "managed", |d| d["class"] == "managed");
        assert_served(&agent, &drive, &block_id, &fs_id);
    }
}
