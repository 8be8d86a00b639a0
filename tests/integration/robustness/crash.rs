//! Crash safety of the volume operations: the agent is killed (SIGKILL) at every named
//! crash point of create, stage, publish, expand (controller and node), unpublish,
//! unstage, delete and clone (of a plain and of an encrypted volume), and a restarted
//! agent finishes or undoes what the killed
//! one left. (The points of a partition table's growth from 128 entries to 256 are
//! killed in tests/integration/volumes/slots.rs, and listed here.)
//!
//! Each case gets its own directory, 1 GiB loop drive and agent armed with
//! `FAILPOINTS=<point>=return`, and drives one ext4 volume through the whole lifecycle;
//! the cases of the expansion points use xfs and grow the published volume to twice
//! its size on the way (growing a mounted ext4 needs CAP_SYS_RESOURCE, which some
//! machines withhold; tests/integration/volumes/expansion.rs covers ext4 growth).
//! The rules checked:
//! - the call that reaches the point fails, because the agent died of SIGKILL;
//! - the same call, retried against a restarted agent (nothing armed), succeeds, and
//!   the rest of the lifecycle runs to its end;
//! - a deletion killed midway is finished by the restart itself;
//! - data written before the crash is read back after it;
//! - at the end nothing is left: no kernel partition, no GPT entry, no mount under the
//!   test directory, no volume record, and a new volume takes the space the old one
//!   had;
//! - a create killed and never retried is rolled back by the restart on its own;
//! - a growth by moving (a volume with no room after it, unused) killed at any point of
//!   its move, to another drive or elsewhere on its own, leaves exactly one copy of the
//!   volume (one partition with its GUID, no marked copy), and the retried growth
//!   succeeds with the data;
//! - a clone killed at any point of its create or its copy leaves no clone after the
//!   restart (never a half copy served: its partition and record are gone, the source
//!   untouched), or, killed once it was marked done, the complete clone; the retried
//!   clone copies again (or answers the complete one) and carries the source's data.
//!
//! Needs the `failpoints` feature (scripts/test.sh passes it); without it every test
//! fails and says so.
// The feature check at the top of each test is constant by design: it is the message
// a run without the feature gets.
#![allow(clippy::assertions_on_constants)]

use std::collections::BTreeSet;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::time::Duration;

use crate::common::*;
use drivelet::grpc::proto::csi;
use tonic::Status;

/// Size of each test volume (xfs needs 300 MiB at least).
const VOLUME: u64 = 320 * MIB;
/// Size of each case's loop drive.
const DRIVE: u64 = GIB;
/// No single CSI call may take longer than this.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

const CREATE_POINTS: &[&str] = &["create.intent_saved", "create.gpt_written", "create.partition_visible", "create.wiped", "create.saved"];
const STAGE_POINTS: &[&str] = &["stage.intent_saved", "stage.formatted", "stage.mounted"];
const PUBLISH_POINTS: &[&str] = &["publish.intent_saved", "publish.mounted"];
const EXPAND_POINTS: &[&str] = &["expand.gpt_resized", "expand.kernel_resized"];
const NODE_EXPAND_POINTS: &[&str] = &["node_expand.grown"];
const UNPUBLISH_POINTS: &[&str] = &["unpublish.unmounted"];
const UNSTAGE_POINTS: &[&str] = &["unstage.unmounted"];
const DELETE_POINTS: &[&str] = &["delete.intent_saved", "delete.wiped", "delete.partition_hidden", "delete.gpt_removed"];
/// The points an encrypted volume's lifecycle is killed at: its key made with the
/// filesystem, added at the mount, removed before the unmount, erased by the wipe.
const ENCRYPTED_POINTS: &[&str] = &["stage.formatted", "stage.mounted", "unstage.unmounted", "delete.wiped"];
/// The key-encryption key of the encrypted cases (the StorageClass's Secret).
const KEK: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
/// The points of a clone's copy; a clone also passes every create point.
const CLONE_POINTS: &[&str] = &["clone.copied", "clone.finished"];
/// The point after a snapshot's copy, once its note is on the drive; a snapshot also
/// passes every create and clone point (a restore too, but this one).
const SNAPSHOT_POINTS: &[&str] = &["snapshot.noted"];
/// The points of the cleaner, which zeroes freed space after a delete.
const CLEAN_POINTS: &[&str] = &["clean.zeroed"];
/// The points of a volume's move to another drive (an evacuation), in their order.
const MOVE_POINTS: &[&str] = &["move.intent_saved", "move.gpt_written", "move.copied", "move.switched", "move.marked", "move.source_removed"];
/// The points of a volume's move elsewhere on its own drive (a growth on a node of one
/// drive), in their order: the finish is one GPT commit that renames the copy.
const ONE_DRIVE_MOVE_POINTS: &[&str] = &["move.intent_saved", "move.gpt_written", "move.copied", "move.switched", "move.renamed"];

/// Fails when the agent binary has no crash points compiled in.
fn require_failpoints() {
    // The binary is shared by every test binary of the target directory: a concurrent
    // build without the feature replaces it.
    let armed = std::process::Command::new("grep").args(["-q", "-a", "-F", CREATE_POINTS[0], bin()]).status().expect("grep");
    assert!(
        armed.success(),
        "{} has no crash points compiled in: a cargo build without `--features failpoints` replaced it; rerun with the feature",
        bin()
    );
}

/// One call of the volume lifecycle, in lifecycle order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Create,
    Stage,
    Publish,
    Expand,
    NodeExpand,
    Unpublish,
    Unstage,
    Delete,
}

const LIFECYCLE: [Step; 8] =
    [Step::Create, Step::Stage, Step::Publish, Step::Expand, Step::NodeExpand, Step::Unpublish, Step::Unstage, Step::Delete];

/// The call that reaches a crash point: the part of its name before the dot.
fn step_of(point: &str) -> Step {
    match point.split('.').next().unwrap() {
        "create" => Step::Create,
        "stage" => Step::Stage,
        "publish" => Step::Publish,
        "expand" => Step::Expand,
        "node_expand" => Step::NodeExpand,
        "unpublish" => Step::Unpublish,
        "unstage" => Step::Unstage,
        "delete" => Step::Delete,
        other => panic!("crash point {point}: no lifecycle call is named {other:?}"),
    }
}

/// One crash case: its own directory, loop drive and agent armed at `point`.
/// Fields drop in order: the agent is killed, then mounts go, then the drive.
struct Case {
    point: &'static str,
    agent: Agent,
    _unmount: Unmounter,
    drive: LoopDrive,
    tmp: tempfile::TempDir,
    name: String,
    volume_id: String,
    /// Where the volume's partition starts, once created.
    start: u64,
    staging: PathBuf,
    target: PathBuf,
    /// ext4, or xfs for the expansion points.
    fs: &'static str,
    /// An encrypted volume (`drivelet.io/encryption: fscrypt`, staged with a KEK).
    encrypted: bool,
}

impl Case {
    fn new(point: &'static str) -> Case {
        Case::new_as(point, false)
    }

    fn new_as(point: &'static str, encrypted: bool) -> Case {
        let tmp = short_tempdir();
        let drive = LoopDrive::new(tmp.path(), "a.img", DRIVE);
        sh("udevadm", &["settle"]);
        let kubelet = tmp.path().join("kubelet");
        let staging = kubelet.join("plugins/stage");
        let target = kubelet.join("pods/p0/volumes/v");
        std::fs::create_dir_all(&staging).unwrap();
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        let unmount = Unmounter(tmp.path().to_path_buf());
        let armed = format!("{point}=return");
        let agent = Agent::start_with(tmp.path(), AgentOpts::default(), &[("FAILPOINTS", &armed)]);
        let name = format!("pvc-{}{}", if encrypted { "enc-" } else { "" }, point.replace(['.', '_'], "-"));
        let volume_id = drivelet::disk::gpt::volume_partition_guid(&name).to_string();
        let fs = if point.starts_with("expand.") || point.starts_with("node_expand.") { "xfs" } else { "ext4" };
        Case { point, agent, _unmount: unmount, drive, tmp, name, volume_id, start: 0, staging, target, fs, encrypted }
    }

    /// Makes one lifecycle call against the running agent, on a fresh connection.
    fn call(&self, step: Step) -> Result<(), Status> {
        let (id, cap) = (self.volume_id.clone(), mount_cap(self.fs));
        let fut = async {
            let mut c = Csi::connect(&self.agent).await;
            match step {
                Step::Create => {
                    let mut req = create_req(&self.name, VOLUME, cap);
                    if self.encrypted {
                        req.parameters.insert("drivelet.io/encryption".into(), "fscrypt".into());
                    }
                    let v = c.ctrl.create_volume(req).await?.into_inner().volume.unwrap();
                    assert_eq!(v.volume_id, id, "{}: the volume id is the one derived from its name", self.point);
                    assert_eq!(v.capacity_bytes, VOLUME as i64);
                }
                Step::Stage => {
                    let mut req = stage_req(&id, &self.staging, cap);
                    if self.encrypted {
                        req.secrets.insert("key".into(), KEK.into());
                    }
                    c.node.node_stage_volume(req).await?;
                }
                Step::Publish => {
                    c.node.node_publish_volume(publish_req(&id, &self.staging, &self.target, cap, false)).await?;
                }
                Step::Expand => {
                    let range = csi::CapacityRange { required_bytes: 2 * VOLUME as i64, limit_bytes: 0 };
                    let req = csi::ControllerExpandVolumeRequest { volume_id: id, capacity_range: Some(range), ..Default::default() };
                    let r = c.ctrl.controller_expand_volume(req).await?.into_inner();
                    assert_eq!(r.capacity_bytes, 2 * VOLUME as i64, "{}: expanded to twice the size", self.point);
                    assert!(r.node_expansion_required, "{}: a filesystem needs the node step", self.point);
                }
                Step::NodeExpand => {
                    let req = csi::NodeExpandVolumeRequest {
                        volume_id: id,
                        volume_path: self.target.display().to_string(),
                        capacity_range: Some(csi::CapacityRange { required_bytes: 2 * VOLUME as i64, limit_bytes: 0 }),
                        ..Default::default()
                    };
                    let r = c.node.node_expand_volume(req).await?.into_inner();
                    assert_eq!(r.capacity_bytes, 2 * VOLUME as i64, "{}: the node answers the new size", self.point);
                }
                Step::Unpublish => {
                    let req = csi::NodeUnpublishVolumeRequest { volume_id: id, target_path: self.target.display().to_string() };
                    c.node.node_unpublish_volume(req).await?;
                }
                Step::Unstage => {
                    let req = csi::NodeUnstageVolumeRequest { volume_id: id, staging_target_path: self.staging.display().to_string() };
                    c.node.node_unstage_volume(req).await?;
                }
                Step::Delete => {
                    c.ctrl.delete_volume(csi::DeleteVolumeRequest { volume_id: id, ..Default::default() }).await?;
                }
            }
            Ok(())
        };
        // A runtime per call: its connections close with it, so a later graceful stop
        // of the agent is not held up by idle ones.
        rt().block_on(async {
            tokio::time::timeout(CALL_TIMEOUT, fut)
                .await
                .unwrap_or_else(|_| panic!("{}: {step:?} hung for {CALL_TIMEOUT:?}; log:\n{}", self.point, self.agent.log_tail(40)))
        })
    }

    /// A call that must succeed.
    fn ok(&self, step: Step, when: &str) {
        if let Err(e) = self.call(step) {
            panic!("{}: {step:?} {when} failed: {e:?}; the agent's view of the drive: {}\nlog:\n{}", self.point, self.drive_view(), self.agent.log_tail(40));
        }
    }

    /// Makes the call that reaches the armed point and checks that it failed because
    /// the agent killed itself there.
    fn crash(&mut self, step: Step) {
        let res = self.call(step);
        assert!(
            res.is_err(),
            "{}: {step:?} succeeded, so the crash point was not reached (is the binary built with --features failpoints?)",
            self.point
        );
        let status = self.agent.wait_exit(Duration::from_secs(20));
        assert_eq!(
            status.and_then(|s| s.signal()),
            Some(nix::sys::signal::Signal::SIGKILL as i32),
            "{}: {step:?} failed with {res:?}, but the agent did not die of SIGKILL (exit: {status:?}, None = still running); log:\n{}",
            self.point,
            self.agent.log_tail(40)
        );
    }

    /// The agent's view of the drive (`ctl drives`), for failure messages.
    fn drive_view(&self) -> String {
        let out = std::process::Command::new(bin())
            .args(["ctl", "--socket", self.agent.admin_socket.to_str().unwrap(), "drives", "--output", "json"])
            .output()
            .unwrap();
        match serde_json::from_slice::<serde_json::Value>(&out.stdout) {
            Ok(d) => drive_by_path(&d, &self.drive.dev).map(|v| v.to_string()).unwrap_or_else(|| format!("not listed: {d}")),
            Err(_) => format!("unknown (ctl drives: {})", String::from_utf8_lossy(&out.stderr).trim()),
        }
    }

    fn parts(&self) -> Vec<(String, u64, u64)> {
        kernel_parts(&self.drive.dev)
    }

    fn write(&self, path: PathBuf, text: &str) {
        use std::io::Write;
        let mut f = std::fs::File::create(&path).unwrap_or_else(|e| panic!("{}: write {}: {e}", self.point, path.display()));
        f.write_all(text.as_bytes()).unwrap();
        f.sync_all().unwrap();
    }

    fn read(&self, path: PathBuf) -> String {
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: data written before the crash is gone: {}: {e}", self.point, path.display()))
    }

    /// What the staged filesystem shows its pods: its root, or an encrypted volume's
    /// data directory.
    fn staged_data(&self) -> PathBuf {
        if self.encrypted { self.staging.join("data") } else { self.staging.clone() }
    }

    fn text(&self, what: &str) -> String {
        format!("{what} (case {})", self.point)
    }

    /// What must hold after each successful lifecycle call; writes the data later
    /// calls read back.
    fn after(&mut self, step: Step) {
        let point = self.point;
        match step {
            Step::Create => {
                let parts = self.parts();
                assert_eq!(parts.len(), 1, "{point}: one partition after create: {parts:?}; log:\n{}", self.agent.log_tail(60));
                assert_eq!(parts[0].2, VOLUME, "{point}: the partition has the volume's size");
                self.start = parts[0].1;
            }
            Step::Stage => {
                assert_eq!(mounts_under(&self.staging).len(), 1, "{point}: staged exactly once: {:?}", mounts_under(&self.staging));
                self.write(self.staged_data().join("a.txt"), &self.text("written after stage"));
            }
            Step::Publish => {
                assert_eq!(mounts_under(&self.target).len(), 1, "{point}: published exactly once: {:?}", mounts_under(&self.target));
                assert_eq!(self.read(self.target.join("a.txt")), self.text("written after stage"));
                self.write(self.target.join("b.txt"), &self.text("written after publish"));
            }
            Step::Expand => {
                let parts = self.parts();
                assert_eq!(parts.len(), 1, "{point}: one partition after expand: {parts:?}");
                assert_eq!((parts[0].1, parts[0].2), (self.start, 2 * VOLUME), "{point}: the partition grew in place");
                let gpt = gpt_entries(&self.drive.dev);
                assert_eq!(gpt.iter().map(|e| (e.start, e.size)).collect::<Vec<_>>(), vec![(self.start, 2 * VOLUME)], "{point}: the GPT entry grew");
                assert_eq!(self.read(self.target.join("b.txt")), self.text("written after publish"));
            }
            Step::NodeExpand => {
                let st = nix::sys::statvfs::statvfs(&self.target).unwrap();
                let total = st.blocks() as u64 * st.fragment_size() as u64;
                assert!(total > VOLUME, "{point}: the filesystem grew: {total} bytes");
                assert_eq!(self.read(self.target.join("a.txt")), self.text("written after stage"));
                self.write(self.target.join("c.txt"), &self.text("written after growth"));
            }
            Step::Unpublish => {
                assert!(!self.target.exists(), "{point}: the target {} is removed", self.target.display());
                assert_eq!(self.read(self.staged_data().join("b.txt")), self.text("written after publish"));
            }
            Step::Unstage => {
                assert!(mounts_under(self.tmp.path()).is_empty(), "{point}: nothing mounted after unstage: {:?}", mounts_under(self.tmp.path()));
                // The filesystem and its data outlive the unstage: stage it again.
                self.ok(Step::Stage, "again after unstage");
                assert_eq!(self.read(self.staged_data().join("a.txt")), self.text("written after stage"));
                assert_eq!(self.read(self.staged_data().join("b.txt")), self.text("written after publish"));
                self.ok(Step::Unstage, "again after the second stage");
                assert!(mounts_under(self.tmp.path()).is_empty(), "{point}: nothing mounted after the second unstage");
            }
            Step::Delete => {}
        }
    }

    /// What the restarted agent must have done on its own, before any retry.
    fn after_restart(&self, step: Step) {
        if step == Step::Delete {
            let (point, parts, gpt) = (self.point, self.parts(), gpt_entries(&self.drive.dev));
            // The warnings and errors of the whole log (the tail is mostly timings).
            let log = || {
                let all = self.agent.logs();
                all.lines().filter(|l| l.contains("\"WARN\"") || l.contains("\"ERROR\"")).collect::<Vec<_>>().join("\n")
            };
            assert!(parts.is_empty(), "{point}: the restart finished the deletion: kernel partitions {parts:?}; log:\n{}", log());
            assert!(gpt.is_empty(), "{point}: the restart finished the deletion: GPT entries {gpt:?}; log:\n{}", log());
        }
    }

    /// Nothing of the volume is left, and its space is free again.
    fn assert_nothing_left(&mut self) {
        let point = self.point;
        self.ok(Step::Delete, "a second time");
        assert!(self.parts().is_empty(), "{point}: kernel partitions leaked: {:?}", self.parts());
        let gpt = gpt_entries(&self.drive.dev);
        assert!(gpt.is_empty(), "{point}: GPT entries leaked: {gpt:?}");
        assert!(mounts_under(self.tmp.path()).is_empty(), "{point}: mounts leaked: {:?}", mounts_under(self.tmp.path()));
        if let Some(ids) = self.agent.ctl_volume_ids() {
            assert!(ids.is_empty(), "{point}: volume records leaked: {ids:?}");
        }
        // The space is not held by a leftover record: a new volume takes it, once the
        // cleaner zeroed what the delete freed (until then it is placed elsewhere).
        assert_eq!(self.start, first_volume_start(DRIVE), "{point}: the volume took the first extent of a blank drive");
        wait_clean(&self.agent, &self.drive);
        self.name = format!("{}-probe", self.name);
        self.volume_id = drivelet::disk::gpt::volume_partition_guid(&self.name).to_string();
        self.ok(Step::Create, "of a new volume after the delete");
        let parts = self.parts();
        assert_eq!(
            parts.iter().map(|p| (p.1, p.2)).collect::<Vec<_>>(),
            vec![(self.start, VOLUME)],
            "{point}: the new volume reuses the space; the agent's view of the drive: {}\nlog:\n{}",
            self.drive_view(),
            self.agent.log_tail(40)
        );
        self.ok(Step::Delete, "of the new volume");
        assert!(self.parts().is_empty(), "{point}: kernel partitions left by the new volume: {:?}", self.parts());
        assert_eq!(self.agent.stop(), 0, "{point}: the agent stops cleanly; log:\n{}", self.agent.log_tail(40));
    }
}

/// Runs the whole lifecycle with the agent killed once at `point`.
fn crash_and_retry(point: &'static str) {
    crash_and_retry_as(point, false)
}

fn crash_and_retry_as(point: &'static str, encrypted: bool) {
    let crash_at = step_of(point);
    let mut c = Case::new_as(point, encrypted);
    // Growth is part of the lifecycle of the expansion cases (xfs) only.
    let grows = c.fs == "xfs";
    let steps = LIFECYCLE.into_iter().filter(|s| grows || !matches!(s, Step::Expand | Step::NodeExpand));
    for step in steps {
        if step == crash_at {
            c.crash(step);
            c.agent.spawn();
            // What a create rolled back freed is zeroed before anything is placed there:
            // the retry finds the drive as the first try did once that is done.
            wait_clean(&c.agent, &c.drive);
            c.after_restart(step);
            c.ok(step, "retried after the crash");
        } else {
            c.ok(step, "before or after the crash");
        }
        c.after(step);
    }
    c.assert_nothing_left();
}

/// Runs `case` for every point, each to its end even when an earlier one failed (its
/// panic message is printed as it happens), then fails naming every point that did.
fn each_point(points: &[&'static str], case: impl Fn(&'static str)) {
    require_failpoints();
    require_host();
    let failed: Vec<String> = points
        .iter()
        .filter_map(|&p| {
            let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(p))).err()?;
            let msg = err.downcast_ref::<String>().cloned().or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
            Some(format!("- {}", msg.lines().next().unwrap_or(p)))
        })
        .collect();
    assert!(failed.is_empty(), "{} of {} crash points failed (details above):\n{}", failed.len(), points.len(), failed.join("\n"));
}

fn family(points: &[&'static str]) {
    each_point(points, crash_and_retry);
}

#[test]
fn every_crash_point_in_the_source_has_a_crash_case() {
    assert!(cfg!(feature = "failpoints"), "crash tests need `--features failpoints`; scripts/test.sh passes it");
    let covered: BTreeSet<&str> =
        [CREATE_POINTS, STAGE_POINTS, PUBLISH_POINTS, EXPAND_POINTS, NODE_EXPAND_POINTS, UNPUBLISH_POINTS, UNSTAGE_POINTS, DELETE_POINTS, ENCRYPTED_POINTS, CLONE_POINTS, SNAPSHOT_POINTS, CLEAN_POINTS, MOVE_POINTS, ONE_DRIVE_MOVE_POINTS, crate::disks::ownership::ADOPT_POINTS, crate::volumes::slots::GROW_POINTS, crate::cluster::kubernetes::PROVISION_POINTS, crate::volumes::freeze_crash::FREEZE_POINTS]
        .concat()
        .into_iter()
        .collect();
    let found = crash_points();
    let found: BTreeSet<&str> = found.iter().map(String::as_str).collect();
    let untested: Vec<_> = found.difference(&covered).collect();
    let stale: Vec<_> = covered.difference(&found).collect();
    assert!(untested.is_empty(), "crash points without a crash case in tests/integration/robustness/crash.rs: {untested:?}");
    assert!(stale.is_empty(), "crash cases for points no longer in src/: {stale:?}");
}

#[test]
fn create_killed_at_any_point_succeeds_when_retried_and_leaves_nothing() {
    assert!(cfg!(feature = "failpoints"), "crash tests need `--features failpoints`; scripts/test.sh passes it");
    family(CREATE_POINTS);
}

#[test]
fn stage_killed_at_any_point_succeeds_when_retried_and_leaves_nothing() {
    assert!(cfg!(feature = "failpoints"), "crash tests need `--features failpoints`; scripts/test.sh passes it");
    family(STAGE_POINTS);
}

#[test]
fn publish_killed_at_any_point_succeeds_when_retried_and_keeps_the_data() {
    assert!(cfg!(feature = "failpoints"), "crash tests need `--features failpoints`; scripts/test.sh passes it");
    family(PUBLISH_POINTS);
}

#[test]
fn expand_killed_at_any_point_succeeds_when_retried_and_keeps_the_data() {
    assert!(cfg!(feature = "failpoints"), "crash tests need `--features failpoints`; scripts/test.sh passes it");
    family(EXPAND_POINTS);
}

#[test]
fn node_expand_killed_after_growing_succeeds_when_retried_and_keeps_the_data() {
    assert!(cfg!(feature = "failpoints"), "crash tests need `--features failpoints`; scripts/test.sh passes it");
    family(NODE_EXPAND_POINTS);
}

#[test]
fn unpublish_killed_after_unmount_succeeds_when_retried_and_keeps_the_data() {
    assert!(cfg!(feature = "failpoints"), "crash tests need `--features failpoints`; scripts/test.sh passes it");
    family(UNPUBLISH_POINTS);
}

#[test]
fn unstage_killed_after_unmount_succeeds_when_retried_and_keeps_the_data() {
    assert!(cfg!(feature = "failpoints"), "crash tests need `--features failpoints`; scripts/test.sh passes it");
    family(UNSTAGE_POINTS);
}

#[test]
fn delete_killed_at_any_point_is_finished_by_the_restart_and_the_retry_succeeds() {
    assert!(cfg!(feature = "failpoints"), "crash tests need `--features failpoints`; scripts/test.sh passes it");
    family(DELETE_POINTS);
}

#[test]
fn an_encrypted_volume_killed_at_any_point_of_its_key_steps_is_finished_and_keeps_its_data() {
    assert!(cfg!(feature = "failpoints"), "crash tests need `--features failpoints`; scripts/test.sh passes it");
    each_point(ENCRYPTED_POINTS, |p| crash_and_retry_as(p, true));
}

#[test]
fn create_killed_and_never_retried_is_rolled_back_at_restart() {
    assert!(cfg!(feature = "failpoints"), "crash tests need `--features failpoints`; scripts/test.sh passes it");
    // create.saved is past the point of no return: the volume exists (its retry case
    // above gets it back); every earlier point leaves an unfinished create.
    let unfinished: Vec<&'static str> = CREATE_POINTS.iter().copied().filter(|p| *p != "create.saved").collect();
    each_point(&unfinished, |point| {
        let mut c = Case::new(point);
        c.crash(Step::Create);
        c.agent.spawn();
        assert!(c.parts().is_empty(), "{point}: the restart removed the kernel partition: {:?}; log:\n{}", c.parts(), c.agent.log_tail(40));
        let gpt = gpt_entries(&c.drive.dev);
        assert!(gpt.is_empty(), "{point}: the restart removed the GPT entry: {gpt:?}; log:\n{}", c.agent.log_tail(60));
        if let Some(ids) = c.agent.ctl_volume_ids() {
            assert!(ids.is_empty(), "{point}: the restart dropped the record: {ids:?}");
        }
        // A second restart finds nothing to adopt or roll back.
        c.agent.kill();
        c.agent.spawn();
        assert!(c.parts().is_empty() && gpt_entries(&c.drive.dev).is_empty(), "{point}: nothing reappears after a second restart");
        if let Some(ids) = c.agent.ctl_volume_ids() {
            assert!(ids.is_empty(), "{point}: no record after a second restart: {ids:?}");
        }
        // The extent it had reserved is free: another volume takes the first one.
        c.name = format!("{}-other", c.name);
        c.volume_id = drivelet::disk::gpt::volume_partition_guid(&c.name).to_string();
        c.ok(Step::Create, "of another volume after the rollback");
        c.after(Step::Create);
        assert_eq!(c.start, first_volume_start(DRIVE), "{point}: the rolled-back extent is reused");
        c.ok(Step::Delete, "of the other volume");
        assert!(c.parts().is_empty() && gpt_entries(&c.drive.dev).is_empty(), "{point}: the other volume left partitions");
        assert_eq!(c.agent.stop(), 0);
    });
}

/// The move's crash points after which its switch to the new copy is stored.
const MOVE_SWITCHED: &[&str] = &["move.switched", "move.marked", "move.source_removed", "move.renamed"];

/// Waits for the agent armed at the move's crash point `point` to be killed there;
/// unless the switch was stored by then, the old copy (at `start` of `from`) must still
/// hold `before`. Whether the switch was stored.
fn killed_mid_move(agent: &mut Agent, point: &str, from: &std::path::Path, start: u64, before: &[u8]) -> bool {
    let status = agent.wait_exit(Duration::from_secs(30));
    assert_eq!(status.and_then(|s| s.signal()), Some(nix::sys::signal::Signal::SIGKILL as i32), "{point}: killed; log:\n{}", agent.log_tail(40));
    // At the kill: the old copy is whole, or the switch was stored (then the new one is).
    let switched = MOVE_SWITCHED.contains(&point);
    if !switched {
        assert_eq!(bytes_at(from, start, before.len() as u64), before, "{point}: the old copy is untouched");
    }
    switched
}

/// `len` bytes of `dev` from byte `start` (the whole drive: a crash may leave the
/// kernel without a volume's partition until drivelet next needs it), as the device
/// holds them: read O_DIRECT, since the whole drive's page cache is not the partition's
/// and may keep blocks from before the partition's own writes.
fn bytes_at(dev: &std::path::Path, start: u64, len: u64) -> Vec<u8> {
    use std::io::{Read, Seek};
    use std::os::unix::fs::OpenOptionsExt;
    const ALIGN: usize = 4096;
    assert!(start % ALIGN as u64 == 0 && len % ALIGN as u64 == 0, "aligned reads only");
    let mut f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(dev).unwrap();
    f.seek(std::io::SeekFrom::Start(start)).unwrap();
    let mut raw = vec![0u8; len as usize + ALIGN];
    let off = raw.as_ptr().align_offset(ALIGN);
    f.read_exact(&mut raw[off..off + len as usize]).unwrap();
    raw.drain(..off);
    raw.truncate(len as usize);
    raw
}

/// Puts data on volume `id`: a block volume's first 2 MiB set to `byte` through its
/// device node `dev`; else `text` in `data.txt` of its ext4 filesystem, staged at
/// `staging` for the write and unstaged again.
fn put_data(agent: &Agent, id: &str, dev: Option<&std::path::Path>, staging: &std::path::Path, byte: u8, text: &str) {
    if let Some(dev) = dev {
        // Opened, never created: a missing node must not become a regular file in /dev.
        let mut f = std::fs::OpenOptions::new().write(true).open(dev).unwrap_or_else(|e| panic!("open {}: {e}", dev.display()));
        std::io::Write::write_all(&mut f, &vec![byte; (2 * MIB) as usize]).unwrap();
        f.sync_all().unwrap();
        return;
    }
    rt().block_on(async {
        let mut c = Csi::connect(agent).await;
        c.node.node_stage_volume(stage_req(id, staging, mount_cap("ext4"))).await.expect("stage");
    });
    std::fs::write(staging.join("data.txt"), text).unwrap();
    rt().block_on(async {
        let mut c = Csi::connect(agent).await;
        c.node.node_unstage_volume(unstage_req(id, staging)).await.expect("unstage");
    });
}

/// A clone of a volume holding data, killed at `point`: the restart leaves the source
/// alone and no clone (or, past the point of no return, the complete clone); the
/// retried clone carries the data. `block`: a block source.
fn clone_crash(point: &'static str, block: bool) {
    let tmp = short_tempdir();
    let drive = LoopDrive::new(tmp.path(), "a.img", DRIVE);
    sh("udevadm", &["settle"]);
    let kubelet = tmp.path().join("kubelet");
    let staging = kubelet.join("plugins/stage");
    let mut agent = Agent::start(tmp.path(), AgentOpts::default());
    let _unmount = Unmounter(tmp.path().to_path_buf());
    let cap = if block { block_cap() } else { mount_cap("ext4") };
    let size = if block { 16 * MIB } else { 64 * MIB };
    let call = |agent: &Agent, q: csi::CreateVolumeRequest| -> Result<csi::Volume, Status> {
        rt().block_on(async {
            let mut c = Csi::connect(agent).await;
            tokio::time::timeout(CALL_TIMEOUT, c.ctrl.create_volume(q)).await.expect("CreateVolume hung").map(|r| r.into_inner().volume.unwrap())
        })
    };
    let src = call(&agent, create_req("pvc-crash-src", size, cap.clone())).expect("create the source").volume_id;
    let src_entry = gpt_entries(&drive.dev);
    assert_eq!(src_entry.len(), 1, "{point}: the source's GPT entry");
    let src_start = src_entry[0].start;
    let dev = block.then(|| drivelet::disk::blkpg::kernel_partitions(&drive.dev).unwrap().remove(0).devnode);
    put_data(&agent, &src, dev.as_deref(), &staging, 0xa5, &format!("written before the crash at {point}"));
    sh("sync", &[]);
    let before = bytes_at(&drive.dev, src_start, size);
    let mut q = create_req("pvc-crash-clone", 2 * size, cap.clone());
    q.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Volume(csi::volume_content_source::VolumeSource { volume_id: src.clone() })),
    });
    agent.arm(point, "return");
    assert!(call(&agent, q.clone()).is_err(), "{point}: the clone succeeded, so the crash point was not reached");
    let status = agent.wait_exit(Duration::from_secs(20));
    assert_eq!(status.and_then(|s| s.signal()), Some(nix::sys::signal::Signal::SIGKILL as i32), "{point}: killed; log:\n{}", agent.log_tail(40));
    agent.spawn();
    let log = |a: &Agent| a.log_tail(40);
    let entries = gpt_entries(&drive.dev);
    if point == "create.saved" {
        // Past the point of no return: the clone is complete and kept.
        assert_eq!(entries.len(), 2, "{point}: the complete clone is kept: {entries:?}; log:\n{}", log(&agent));
        assert_eq!(agent.ctl_volume_ids().map(|ids| ids.len()), Some(2), "{point}: the clone's record is kept");
    } else {
        assert_eq!(entries.len(), 1, "{point}: only the source's GPT entry is left: {entries:?}; log:\n{}", log(&agent));
        assert_eq!(entries[0].start, src_start, "{point}: the source's entry is the one left");
        let parts = kernel_parts(&drive.dev);
        assert!(parts.iter().all(|p| p.1 == src_start), "{point}: no kernel partition of the clone is left: {parts:?}");
        assert_eq!(agent.ctl_volume_ids(), Some(vec![src.clone()]), "{point}: no clone record is left, not even a half one");
    }
    assert!(bytes_at(&drive.dev, src_start, size) == before, "{point}: the source is untouched");

    let v = call(&agent, q.clone()).unwrap_or_else(|e| panic!("{point}: the retried clone failed: {e:?}; log:\n{}", log(&agent)));
    assert_eq!(v.capacity_bytes, 2 * size as i64);
    let clone_start = gpt_entries(&drive.dev).iter().map(|e| e.start).find(|s| *s != src_start).expect("the clone's GPT entry");
    if block {
        assert!(bytes_at(&drive.dev, clone_start, 2 * MIB).iter().all(|b| *b == 0xa5), "{point}: the retried block clone carries the source's bytes");
    } else {
        rt().block_on(async {
            let mut c = Csi::connect(&agent).await;
            c.node.node_stage_volume(stage_req(&v.volume_id, &staging, cap.clone())).await.expect("stage the clone");
        });
        assert_eq!(std::fs::read_to_string(staging.join("data.txt")).unwrap(), format!("written before the crash at {point}"), "{point}: the clone's data");
        rt().block_on(async {
            let mut c = Csi::connect(&agent).await;
            let q = csi::NodeUnstageVolumeRequest { volume_id: v.volume_id.clone(), staging_target_path: staging.display().to_string() };
            c.node.node_unstage_volume(q).await.expect("unstage the clone");
        });
    }
    rt().block_on(async {
        let mut c = Csi::connect(&agent).await;
        for id in [&v.volume_id, &src] {
            c.ctrl.delete_volume(csi::DeleteVolumeRequest { volume_id: id.clone(), ..Default::default() }).await.expect("delete");
        }
    });
    assert!(kernel_parts(&drive.dev).is_empty() && gpt_entries(&drive.dev).is_empty(), "{point}: nothing left");
    assert_eq!(agent.stop(), 0, "{point}: the agent stops cleanly");
}

#[test]
fn clone_killed_at_any_point_leaves_no_clone_and_the_retry_copies_the_data() {
    assert!(cfg!(feature = "failpoints"), "crash tests need `--features failpoints`; scripts/test.sh passes it");
    let points: Vec<&'static str> = CREATE_POINTS.iter().chain(CLONE_POINTS).copied().collect();
    each_point(&points, |p| clone_crash(p, false));
    each_point(&["clone.copied"], |p| clone_crash(p, true));
}

/// A snapshot of a volume holding data killed at `point`, then a restore from it killed
/// at the same point (when a restore passes it): each restart leaves no half snapshot
/// or restore, listed or on the drive (or, past the point of no return, the whole one),
/// the source untouched; the retries succeed and the restore holds the data.
fn snapshot_crash(point: &'static str, block: bool) {
    let tmp = short_tempdir();
    let drive = LoopDrive::new(tmp.path(), "a.img", DRIVE);
    sh("udevadm", &["settle"]);
    let staging = tmp.path().join("kubelet/plugins/stage");
    let mut agent = Agent::start(tmp.path(), AgentOpts::default());
    let _unmount = Unmounter(tmp.path().to_path_buf());
    let cap = if block { block_cap() } else { mount_cap("ext4") };
    let size = if block { 16 * MIB } else { 64 * MIB };
    let log = |a: &Agent| a.log_tail(40);
    let src = rt()
        .block_on(async { Csi::connect(&agent).await.ctrl.create_volume(create_req("pvc-snap-crash-src", size, cap.clone())).await })
        .expect("create the source")
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    let src_start = gpt_entries(&drive.dev)[0].start;
    if block {
        let dev = drivelet::disk::blkpg::kernel_partitions(&drive.dev).unwrap().remove(0).devnode;
        let mut f = std::fs::OpenOptions::new().write(true).open(&dev).unwrap_or_else(|e| panic!("open {}: {e}", dev.display()));
        std::io::Write::write_all(&mut f, &vec![0x5au8; (2 * MIB) as usize]).unwrap();
        f.sync_all().unwrap();
    } else {
        rt().block_on(async {
            let mut c = Csi::connect(&agent).await;
            c.node.node_stage_volume(stage_req(&src, &staging, cap.clone())).await.expect("stage the source");
            std::fs::write(staging.join("data.txt"), format!("snapshotted before the crash at {point}")).unwrap();
            c.node.node_unstage_volume(unstage_req(&src, &staging)).await.expect("unstage the source");
        });
    }
    sh("sync", &[]);
    let before = bytes_at(&drive.dev, src_start, size);
    let snapshot = |agent: &Agent| {
        rt().block_on(async {
            let mut c = Csi::connect(agent).await;
            tokio::time::timeout(CALL_TIMEOUT, c.ctrl.create_snapshot(snapshot_req("snap-crash", &src, &[]))).await.expect("CreateSnapshot hung")
        })
    };
    let listed = |agent: &Agent| {
        rt().block_on(async { Csi::connect(agent).await.ctrl.list_snapshots(csi::ListSnapshotsRequest::default()).await.expect("list").into_inner().entries })
    };
    let killed = |agent: &mut Agent, what: &str| {
        let status = agent.wait_exit(Duration::from_secs(20));
        assert_eq!(status.and_then(|s| s.signal()), Some(nix::sys::signal::Signal::SIGKILL as i32), "{point}: {what} killed; log:\n{}", agent.log_tail(40));
        agent.spawn();
    };

    agent.arm(point, "return");
    assert!(snapshot(&agent).is_err(), "{point}: the snapshot succeeded, so the crash point was not reached");
    killed(&mut agent, "the snapshot");
    let entries = gpt_entries(&drive.dev);
    if point == "create.saved" {
        assert_eq!(entries.len(), 2, "{point}: the whole snapshot is kept: {entries:?}; log:\n{}", log(&agent));
        assert_eq!(listed(&agent).len(), 1, "{point}: and listed");
    } else {
        assert_eq!(entries.len(), 1, "{point}: only the source's entry is left: {entries:?}; log:\n{}", log(&agent));
        assert!(kernel_parts(&drive.dev).iter().all(|p| p.1 == src_start), "{point}: no kernel partition of the snapshot is left");
        assert!(listed(&agent).is_empty(), "{point}: no half snapshot is listed");
    }
    assert!(bytes_at(&drive.dev, src_start, size) == before, "{point}: the source is untouched");
    let snap = snapshot(&agent).unwrap_or_else(|e| panic!("{point}: the retried snapshot failed: {e:?}; log:\n{}", log(&agent))).into_inner().snapshot.unwrap();
    assert!(snap.ready_to_use);

    let restore = |agent: &Agent| {
        rt().block_on(async {
            let mut c = Csi::connect(agent).await;
            let q = restore_req("pvc-restore-crash", size, 0, cap.clone(), &snap.snapshot_id);
            tokio::time::timeout(CALL_TIMEOUT, c.ctrl.create_volume(q)).await.expect("restore hung")
        })
    };
    let restore_passes = !SNAPSHOT_POINTS.contains(&point) && !(block && point == "clone.finished");
    if restore_passes {
        agent.arm(point, "return");
        assert!(restore(&agent).is_err(), "{point}: the restore succeeded, so the crash point was not reached");
        killed(&mut agent, "the restore");
        let ids = agent.ctl_volume_ids().unwrap_or_default();
        if point == "create.saved" {
            assert_eq!(ids.len(), 2, "{point}: the whole restore is kept: {ids:?}");
        } else {
            assert_eq!(ids, vec![src.clone()], "{point}: no half restore is left; log:\n{}", log(&agent));
            assert_eq!(gpt_entries(&drive.dev).len(), 2, "{point}: the source's and the snapshot's entries only");
        }
    }
    let v = restore(&agent).unwrap_or_else(|e| panic!("{point}: the retried restore failed: {e:?}; log:\n{}", log(&agent))).into_inner().volume.unwrap();
    let start = gpt_entries(&drive.dev).iter().map(|e| e.start).max().unwrap();
    if block {
        let vs = agent.ctl_volumes();
        let vstart = vs.as_array().unwrap().iter().find(|x| x["id"] == v.volume_id).unwrap()["start"].as_u64().unwrap();
        assert!(bytes_at(&drive.dev, vstart, 2 * MIB).iter().all(|b| *b == 0x5a), "{point}: the restore carries the source's bytes");
    } else {
        rt().block_on(async {
            let mut c = Csi::connect(&agent).await;
            c.node.node_stage_volume(stage_req(&v.volume_id, &staging, cap.clone())).await.expect("stage the restore");
            assert_eq!(std::fs::read_to_string(staging.join("data.txt")).unwrap(), format!("snapshotted before the crash at {point}"), "{point}: the restore's data");
            c.node.node_unstage_volume(unstage_req(&v.volume_id, &staging)).await.expect("unstage the restore");
        });
    }
    let _ = start;
    rt().block_on(async {
        let mut c = Csi::connect(&agent).await;
        for id in [&v.volume_id, &src] {
            c.ctrl.delete_volume(del_req(id)).await.expect("delete");
        }
        c.ctrl.delete_snapshot(csi::DeleteSnapshotRequest { snapshot_id: snap.snapshot_id.clone(), ..Default::default() }).await.expect("delete the snapshot");
    });
    assert!(kernel_parts(&drive.dev).is_empty() && gpt_entries(&drive.dev).is_empty(), "{point}: nothing left");
    assert_eq!(agent.stop(), 0, "{point}: the agent stops cleanly");
}

#[test]
fn snapshot_and_restore_killed_at_any_point_leave_no_half_copy_and_the_retries_hold_the_data() {
    assert!(cfg!(feature = "failpoints"), "crash tests need `--features failpoints`; scripts/test.sh passes it");
    let points: Vec<&'static str> = CREATE_POINTS.iter().chain(CLONE_POINTS).chain(SNAPSHOT_POINTS).copied().collect();
    each_point(&points, |p| snapshot_crash(p, false));
    each_point(&["clone.copied", "snapshot.noted"], |p| snapshot_crash(p, true));
}

/// A snapshot cut short after its copy, and the store lost too: the partition without
/// a whole note is a half snapshot, rolled back at the restart, never served.
#[test]
fn a_half_snapshot_found_without_its_record_is_rolled_back() {
    assert!(cfg!(feature = "failpoints"), "crash tests need `--features failpoints`; scripts/test.sh passes it");
    require_host();
    let tmp = short_tempdir();
    let drive = LoopDrive::new(tmp.path(), "a.img", DRIVE);
    sh("udevadm", &["settle"]);
    let mut agent = Agent::start(tmp.path(), AgentOpts::default());
    let src = rt()
        .block_on(async { Csi::connect(&agent).await.ctrl.create_volume(create_req("pvc-half", 16 * MIB, block_cap())).await })
        .expect("create")
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    agent.arm("clone.copied", "return");
    let r = rt().block_on(async { Csi::connect(&agent).await.ctrl.create_snapshot(snapshot_req("snap-half", &src, &[])).await });
    assert!(r.is_err(), "killed at clone.copied");
    let status = agent.wait_exit(Duration::from_secs(20));
    assert_eq!(status.and_then(|s| s.signal()), Some(nix::sys::signal::Signal::SIGKILL as i32));
    assert_eq!(gpt_entries(&drive.dev).len(), 2, "the half snapshot's entry is on the drive");
    std::fs::remove_dir_all(tmp.path().join("state")).unwrap();
    agent.spawn();
    let entries = gpt_entries(&drive.dev);
    assert_eq!(entries.len(), 1, "the half snapshot was rolled back: {entries:?}; log:\n{}", agent.log_tail(30));
    let listed = rt().block_on(async { Csi::connect(&agent).await.ctrl.list_snapshots(csi::ListSnapshotsRequest::default()).await.unwrap().into_inner().entries });
    assert!(listed.is_empty(), "nothing listed: {listed:?}");
    assert_eq!(agent.ctl_volume_ids().map(|v| v.len()), Some(1), "the source is back as a volume");
    assert!(agent.logs().contains("a snapshot cut short"), "and the log says so");
}

#[test]
fn cleaning_killed_mid_zeroing_resumes_after_restart_and_new_volumes_read_zeros() {
    assert!(cfg!(feature = "failpoints"), "crash tests need `--features failpoints`; scripts/test.sh passes it");
    require_host();
    let tmp = short_tempdir();
    let drive = LoopDrive::new(tmp.path(), "a.img", DRIVE);
    sh("udevadm", &["settle"]);
    let (lo, hi) = drivelet::disk::gpt::usable_region(DRIVE, 512).unwrap();
    let mut agent = Agent::start(tmp.path(), AgentOpts::default());
    wait_clean(&agent, &drive);
    let block = |name: &str, bytes: u64, layout: &str| {
        let mut req = create_req(name, bytes, block_cap());
        req.parameters = [("layout".to_string(), layout.to_string())].into();
        req
    };
    let id = rt().block_on(async {
        let mut c = Csi::connect(&agent).await;
        c.ctrl.create_volume(block("tenant", hi - lo, "partition")).await.expect("create").into_inner().volume.unwrap().volume_id
    });
    let dev = volume_dev(&drive, &id);
    fill(&dev, 0, hi - lo, PATTERN);
    assert_eq!(agent.stop(), 0, "clean exit; log:\n{}", agent.log_tail(40));

    // Armed: the cleaner dies after zeroing its first 64 MiB step, before recording it.
    agent.spawn_with(&[("FAILPOINTS", "clean.zeroed=return"), ("DRIVELET__VOLUMES__CLEANING_STEP", "64Mi")]);
    agent.wait_ready();
    rt().block_on(async {
        let mut c = Csi::connect(&agent).await;
        c.ctrl.delete_volume(csi::DeleteVolumeRequest { volume_id: id.clone(), ..Default::default() }).await.expect("delete returns before the cleaning");
    });
    let status = agent.wait_exit(Duration::from_secs(20));
    assert_eq!(status.and_then(|s| s.signal()), Some(nix::sys::signal::Signal::SIGKILL as i32), "the cleaner reached clean.zeroed; log:\n{}", agent.log_tail(40));
    assert!(gpt_entries(&drive.dev).is_empty(), "the delete itself was done");
    assert_eq!(first_nonzero(&drive.dev, lo, lo + 64 * MIB), None, "the first step was zeroed");
    assert_eq!(first_nonzero(&drive.dev, lo + 64 * MIB, hi), Some((lo + 64 * MIB, PATTERN)), "the kill came in the middle: the rest still holds the old bytes");

    // Restarted: the journal on the drive still lists all of it; new volumes wait for it.
    agent.spawn();
    rt().block_on(async {
        let mut c = Csi::connect(&agent).await;
        let mut made = Vec::new();
        for (i, size) in [MIB, 32 * MIB, 200 * MIB].into_iter().enumerate() {
            let v = c.ctrl.create_volume(block(&format!("new-{i}"), size, "partition")).await;
            let v = v.unwrap_or_else(|e| panic!("create {size}: {e}; log:\n{}", agent.log_tail(30))).into_inner().volume.unwrap();
            assert_zeros(&drive, &v.volume_id, &format!("a {size}-byte volume after the restart"));
            made.push(v.volume_id);
        }
        for id in made {
            c.ctrl.delete_volume(csi::DeleteVolumeRequest { volume_id: id, ..Default::default() }).await.expect("delete");
        }
        let v = c.ctrl.create_volume(block("whole", MIB, "drive")).await.unwrap_or_else(|e| panic!("whole drive: {e}")).into_inner().volume.unwrap();
        assert_zeros(&drive, &v.volume_id, "a whole-drive volume after the restart");
        c.ctrl.delete_volume(csi::DeleteVolumeRequest { volume_id: v.volume_id, ..Default::default() }).await.expect("delete");
    });
    wait_clean(&agent, &drive);
    assert_eq!(first_nonzero(&drive.dev, lo, hi), None, "all of the free space is zero once cleaned");
    assert_eq!(agent.stop(), 0, "clean exit; log:\n{}", agent.log_tail(40));
}

/// Partitions of `dev` with `guid`: (start, carries the move mark).
fn copies_of(dev: &std::path::Path, guid: &str) -> Vec<(u64, bool)> {
    let t = drivelet::disk::gpt::read_table(dev, 512).expect("read the GPT");
    t.map(|t| t.partitions.into_iter().filter(|q| q.guid.to_string() == guid).map(|q| (q.start, q.is_move_copy())).collect()).unwrap_or_default()
}

/// A volume holding data on one drive, its evacuation killed at `point`: after the
/// restart exactly one copy serves (the old one before the switch, the new one after),
/// nothing of the other is left, and the evacuation goes on to its end by itself; the
/// data is there, read from the new drive. `block`: a block volume (else ext4).
fn move_crash(point: &'static str, block: bool) {
    let tmp = short_tempdir();
    let drives = [LoopDrive::new(tmp.path(), "a.img", DRIVE), LoopDrive::new(tmp.path(), "b.img", DRIVE)];
    sh("udevadm", &["settle"]);
    let staging = tmp.path().join("kubelet").join("plugins/stage");
    let mut agent = Agent::start(tmp.path(), AgentOpts::default());
    let _unmount = Unmounter(tmp.path().to_path_buf());
    let cap = if block { block_cap() } else { mount_cap("ext4") };
    let size = if block { 16 * MIB } else { 64 * MIB };
    let v = rt().block_on(async {
        let mut c = Csi::connect(&agent).await;
        c.ctrl.create_volume(create_req("pvc-crash-move", size, cap.clone())).await.expect("create").into_inner().volume.unwrap().volume_id
    });
    let (from, to) = if copies_of(&drives[0].dev, &v).is_empty() { (&drives[1], &drives[0]) } else { (&drives[0], &drives[1]) };
    let start = copies_of(&from.dev, &v)[0].0;
    let dev = block.then(|| drivelet::disk::blkpg::ensure_kernel_partition(&from.dev, start, size).unwrap().devnode);
    put_data(&agent, &v, dev.as_deref(), &staging, 0x5a, &format!("written before the move killed at {point}"));
    sh("sync", &[]);
    let before = bytes_at(&from.dev, start, size);
    let from_id = drive_id_of(&agent, from);
    agent.arm(point, "return");
    // The answer may or may not make it out before the kill.
    let _ = std::process::Command::new(bin()).args(["ctl", "--socket", agent.admin_socket.to_str().unwrap(), "drive", "evacuate", &from_id]).output();
    killed_mid_move(&mut agent, point, &from.dev, start, &before);
    agent.spawn();
    let log = |a: &Agent| a.log_tail(40);
    // The evacuation was stored: it goes on by itself to the end.
    // The disks show the end a moment before the agent has taken in the move's result
    // (its last store write): both are waited for.
    let t0 = std::time::Instant::now();
    let to_id = drive_id_of(&agent, to);
    loop {
        let (on_from, on_to) = (copies_of(&from.dev, &v), copies_of(&to.dev, &v));
        let served_from = agent.ctl_volumes().as_array().and_then(|a| a.iter().find(|r| r["id"] == v.as_str()).map(|r| r["drive_id"].clone()));
        if on_from.is_empty() && on_to.len() == 1 && !on_to[0].1 && served_from.is_some_and(|d| d == to_id.as_str()) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "{point}: the move finished after the restart: old {on_from:?}, new {on_to:?}; log:\n{}", log(&agent));
        std::thread::sleep(Duration::from_millis(100));
    }
    let vols = agent.ctl_volumes();
    let rec = vols.as_array().unwrap().iter().find(|r| r["id"] == v.as_str()).unwrap_or_else(|| panic!("{point}: the volume is listed: {vols}"));
    let new_start = copies_of(&to.dev, &v)[0].0;
    assert_eq!((rec["drive_id"].as_str(), rec["start"].as_u64()), (Some(drive_id_of(&agent, to).as_str()), Some(new_start)), "{point}: the record names the copy that serves; log:\n{}", log(&agent));
    assert!(rec.get("lost").is_none_or(|l| l == false) && rec.get("moving").is_none(), "{point}: {rec}");
    assert_eq!(agent.ctl_volume_ids().map(|ids| ids.len()), Some(1), "{point}: one volume, no half record");
    if block {
        assert!(bytes_at(&to.dev, new_start, 2 * MIB).iter().all(|b| *b == 0x5a), "{point}: the moved block volume holds its bytes");
    } else {
        rt().block_on(async {
            let mut c = Csi::connect(&agent).await;
            c.node.node_stage_volume(stage_req(&v, &staging, cap.clone())).await.expect("stage the moved volume");
        });
        assert_eq!(std::fs::read_to_string(staging.join("data.txt")).unwrap(), format!("written before the move killed at {point}"), "{point}: the moved volume's data");
        rt().block_on(async {
            let mut c = Csi::connect(&agent).await;
            c.node.node_unstage_volume(unstage_req(&v, &staging)).await.expect("unstage");
        });
    }
    assert!(gpt_entries(&from.dev).is_empty(), "{point}: the evacuated drive holds no partition");
    assert_eq!(agent.stop(), 0, "{point}: the agent stops cleanly");
}

#[test]
fn a_move_killed_at_any_point_leaves_one_copy_serving_and_the_evacuation_finishes_with_the_data() {
    assert!(cfg!(feature = "failpoints"), "crash tests need `--features failpoints`; scripts/test.sh passes it");
    each_point(MOVE_POINTS, |p| move_crash(p, true));
    each_point(&["move.copied", "move.switched", "move.source_removed"], |p| move_crash(p, false));
}

/// A volume with data and another volume right after it on its drive, grown by a move
/// to the other drive (ControllerExpandVolume of a volume no pod uses) killed at
/// `point`: after the restart exactly one copy of it is left (the old one, at its old
/// size, before the switch; the grown one after it), the retried growth succeeds, and
/// the data is read back from the grown volume on the other drive.
fn grow_move_crash(point: &'static str) {
    let tmp = short_tempdir();
    let drives = [LoopDrive::new(tmp.path(), "a.img", DRIVE), LoopDrive::new(tmp.path(), "b.img", DRIVE)];
    sh("udevadm", &["settle"]);
    let staging = tmp.path().join("kubelet").join("plugins/stage");
    let mut agent = Agent::start(tmp.path(), AgentOpts::default());
    let _unmount = Unmounter(tmp.path().to_path_buf());
    let (size, grown) = (64 * MIB, 200 * MIB);
    let v = rt().block_on(async {
        let mut c = Csi::connect(&agent).await;
        let v = c.ctrl.create_volume(create_req("pvc-crash-grow", size, mount_cap("ext4"))).await.expect("create").into_inner().volume.unwrap().volume_id;
        c.ctrl.create_volume(create_req("pvc-crash-grow-next", size, block_cap())).await.expect("create the next").into_inner();
        v
    });
    let (from, to) = if copies_of(&drives[0].dev, &v).is_empty() { (&drives[1], &drives[0]) } else { (&drives[0], &drives[1]) };
    let start = copies_of(&from.dev, &v)[0].0;
    let text = format!("written before the growth killed at {point}");
    put_data(&agent, &v, None, &staging, 0, &text);
    sh("sync", &[]);
    let (before, switched) = growth_killed_at(&mut agent, point, &v, grown, &from.dev, start, size);
    let log = |a: &Agent| a.log_tail(40);
    // One copy serves after the restart: never both, never neither (the restart's
    // reconciliation may finish a moment after the agent answers).
    let t0 = std::time::Instant::now();
    loop {
        let (on_from, on_to) = (copies_of(&from.dev, &v), copies_of(&to.dev, &v));
        let done = if switched { on_from.is_empty() && on_to.len() == 1 && !on_to[0].1 } else { on_to.is_empty() && on_from == [(start, false)] };
        if done {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "{point}: one copy after the restart (switched: {switched}): old {on_from:?}, new {on_to:?}; log:\n{}", log(&agent));
        std::thread::sleep(Duration::from_millis(100));
    }
    // The retried growth succeeds (moving again, or finding the size reached).
    retried_growth(&agent, point, &v, grown);
    let (on_from, on_to) = (copies_of(&from.dev, &v), copies_of(&to.dev, &v));
    assert!(on_from.is_empty() && on_to.len() == 1 && !on_to[0].1, "{point}: grown on the other drive: old {on_from:?}, new {on_to:?}");
    assert_eq!(bytes_at(&to.dev, on_to[0].0, size), before, "{point}: the volume's bytes, byte for byte");
    assert_eq!(agent.ctl_volume_ids().map(|ids| ids.len()), Some(2), "{point}: two volumes, no half record");
    assert_grown_data(&agent, &v, &staging, &text, point);
    assert_eq!(agent.stop(), 0, "{point}: the agent stops cleanly");
}

/// Grows volume `v` (at `start` of `dev`, `size` bytes) to `grown` with the agent
/// killed at `point` of its move, and starts it again; returns the volume's bytes from
/// before and whether the move had switched ([`killed_mid_move`]).
fn growth_killed_at(agent: &mut Agent, point: &str, v: &str, grown: u64, dev: &std::path::Path, start: u64, size: u64) -> (Vec<u8>, bool) {
    let before = bytes_at(dev, start, size);
    agent.arm(point, "return");
    let res = rt().block_on(async {
        let mut c = Csi::connect(agent).await;
        tokio::time::timeout(CALL_TIMEOUT, c.ctrl.controller_expand_volume(expand_req(v, grown, 0))).await
    });
    assert!(!matches!(res, Ok(Ok(_))), "{point}: the growth died with the agent: {res:?}");
    let switched = killed_mid_move(agent, point, dev, start, &before);
    agent.spawn();
    (before, switched)
}

/// Grows volume `v` to `grown` again after a restart: it must succeed with that size.
fn retried_growth(agent: &Agent, point: &str, v: &str, grown: u64) {
    let r = rt().block_on(async {
        let mut c = Csi::connect(agent).await;
        c.ctrl.controller_expand_volume(expand_req(v, grown, 0)).await
    });
    let r = r.unwrap_or_else(|e| panic!("{point}: the retried growth: {e:?}; log:\n{}", agent.log_tail(40))).into_inner();
    assert_eq!(r.capacity_bytes, grown as i64, "{point}");
}

/// Stages the grown ext4 volume `v`, checks it still holds `text` in data.txt, and
/// unstages it.
fn assert_grown_data(agent: &Agent, v: &str, staging: &std::path::Path, text: &str, point: &str) {
    rt().block_on(async {
        let mut c = Csi::connect(agent).await;
        c.node.node_stage_volume(stage_req(v, staging, mount_cap("ext4"))).await.expect("stage the grown volume");
    });
    assert_eq!(std::fs::read_to_string(staging.join("data.txt")).unwrap(), text, "{point}: the grown volume's data");
    rt().block_on(async {
        let mut c = Csi::connect(agent).await;
        c.node.node_unstage_volume(unstage_req(v, staging)).await.expect("unstage");
    });
}

#[test]
fn a_growth_by_moving_killed_at_any_point_leaves_one_copy_and_the_retry_grows_it_with_the_data() {
    assert!(cfg!(feature = "failpoints"), "crash tests need `--features failpoints`; scripts/test.sh passes it");
    each_point(MOVE_POINTS, grow_move_crash);
}

/// The partitions of `dev` carrying the move mark: `(GUID, start)`.
fn marked_on(dev: &std::path::Path) -> Vec<(String, u64)> {
    let t = drivelet::disk::gpt::read_table(dev, 512).expect("read the GPT");
    t.map(|t| t.partitions.into_iter().filter(|q| q.is_move_copy()).map(|q| (q.guid.to_string(), q.start)).collect()).unwrap_or_default()
}

/// A volume with data and another volume right after it on the only drive of the node,
/// grown by a move elsewhere on that drive killed at `point`: after the restart exactly
/// one partition carries its GUID (at its old place and size before the switch, at the
/// new place grown after it), no marked copy is left, the retried growth succeeds, the
/// data is read back, and the extent the volume left (and any copy rolled back) is
/// cleaned.
fn grow_move_on_one_drive_crash(point: &'static str) {
    let tmp = short_tempdir();
    let drive = LoopDrive::new(tmp.path(), "a.img", DRIVE);
    sh("udevadm", &["settle"]);
    let staging = tmp.path().join("kubelet").join("plugins/stage");
    let mut agent = Agent::start(tmp.path(), AgentOpts::default());
    let _unmount = Unmounter(tmp.path().to_path_buf());
    let (size, grown) = (64 * MIB, 200 * MIB);
    let v = rt().block_on(async {
        let mut c = Csi::connect(&agent).await;
        let v = c.ctrl.create_volume(create_req("pvc-crash-grow1", size, mount_cap("ext4"))).await.expect("create").into_inner().volume.unwrap().volume_id;
        c.ctrl.create_volume(create_req("pvc-crash-grow1-next", size, block_cap())).await.expect("create the next").into_inner();
        v
    });
    let start = copies_of(&drive.dev, &v)[0].0;
    let text = format!("written before the growth on one drive killed at {point}");
    put_data(&agent, &v, None, &staging, 0, &text);
    sh("sync", &[]);
    let (before, switched) = growth_killed_at(&mut agent, point, &v, grown, &drive.dev, start, size);
    let log = |a: &Agent| a.log_tail(40);
    let served = |a: &Agent| {
        let vols = a.ctl_volumes();
        vols.as_array().and_then(|l| l.iter().find(|r| r["id"] == v.as_str()).map(|r| (r["start"].as_u64(), r["size"].as_u64(), r.get("moving").is_some())))
    };
    // One partition carries its GUID after the restart, unmarked, and no copy is left
    // (the restart's reconciliation may finish a moment after the agent answers).
    let t0 = std::time::Instant::now();
    loop {
        let (mine, marked) = (copies_of(&drive.dev, &v), marked_on(&drive.dev));
        let done = match mine.as_slice() {
            [(at, false)] if marked.is_empty() => {
                let want = if switched { *at != start } else { *at == start };
                want && served(&agent).is_some_and(|(s, _, moving)| s == Some(*at) && !moving)
            }
            _ => false,
        };
        if done {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "{point}: one partition after the restart (switched: {switched}): {mine:?}, marked {marked:?}; log:\n{}", log(&agent));
        std::thread::sleep(Duration::from_millis(100));
    }
    // The retried growth succeeds (moving again, or finding the size reached).
    retried_growth(&agent, point, &v, grown);
    let mine = copies_of(&drive.dev, &v);
    assert!(mine.len() == 1 && !mine[0].1 && mine[0].0 != start, "{point}: grown elsewhere on the drive: {mine:?}");
    assert!(marked_on(&drive.dev).is_empty(), "{point}: no marked copy left");
    let new_start = mine[0].0;
    assert_eq!(served(&agent), Some((Some(new_start), Some(grown), false)), "{point}: the record names the grown partition");
    assert_eq!(bytes_at(&drive.dev, new_start, size), before, "{point}: the volume's bytes, byte for byte");
    assert_eq!(gpt_entries(&drive.dev).len(), 2, "{point}: the volume and the next, nothing more: {:?}", gpt_entries(&drive.dev));
    assert_eq!(agent.ctl_volume_ids().map(|ids| ids.len()), Some(2), "{point}: two volumes, no half record");
    // Nothing leaks: the extent it left (and a copy rolled back) is cleaned.
    wait_clean(&agent, &drive);
    assert_eq!(first_nonzero(&drive.dev, start, start + size), None, "{point}: the old extent is zeroed");
    assert_grown_data(&agent, &v, &staging, &text, point);
    assert_eq!(agent.stop(), 0, "{point}: the agent stops cleanly");
}

#[test]
fn a_growth_by_moving_on_one_drive_killed_at_any_point_leaves_one_partition_with_its_guid_and_the_retry_grows_it() {
    assert!(cfg!(feature = "failpoints"), "crash tests need `--features failpoints`; scripts/test.sh passes it");
    each_point(ONE_DRIVE_MOVE_POINTS, grow_move_on_one_drive_crash);
}
