//! Volume health end to end through the CSI socket: a drive that dies, a target
//! unmounted behind drivelet's back, a corrupt unmounted filesystem, a full
//! filesystem, a drive whose SMART verdict turns BAD (from real smartctl JSON served by
//! a stand-in program), NodeGetVolumeStats of a block volume at kubelet's own bind of
//! its device. (ListVolumes paging has its one home in the conformance suite's
//! `listing` module; a drive detached and reattached has its one home in
//! `csi::health_api`, which checks both CSI generations.)
//!
//! Each test runs its own agent in its own directory, with `[health]` tuned so that
//! findings show within a second or two: SMART every 1 s, volume checks every 200 ms,
//! two read-only fsck runs, a usage threshold of 80 %. Conditions are read the way
//! Kubernetes reads them: ControllerGetVolume, ListVolumes and NodeGetVolumeStats.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::*;
use drivelet::grpc::proto::csi;
use tonic::Code;

/// More `[health]` keys of these tests: two read-only fsck runs, full at 80 %.
const MORE: &str = "fsck_runs = 2\nusage_threshold_percent = 80";

fn start_agent(dir: &Path) -> (Agent, SmartStandIn) {
    start_health_agent(dir, MORE)
}

/// The staging path and one target path of a volume called `n`.
fn paths(dir: &Path, n: &str) -> (PathBuf, PathBuf) {
    let kubelet = dir.join("kubelet");
    let stage = kubelet.join(format!("plugins/stage-{n}"));
    let target = kubelet.join(format!("pods/p-{n}/volumes/{n}"));
    std::fs::create_dir_all(&stage).unwrap();
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    (stage, target)
}

/// Creates a volume; returns its id and the drive it was placed on.
async fn create(c: &mut Csi, name: &str, bytes: u64, cap: csi::VolumeCapability) -> (String, String) {
    let v = c.ctrl.create_volume(create_req(name, bytes, cap)).await.unwrap_or_else(|e| panic!("create {name}: {e:?}"));
    let v = v.into_inner().volume.unwrap();
    let drive = v.volume_context.get("drivelet.io/drive").cloned().expect("the volume context names the drive");
    (v.volume_id, drive)
}

/// Creates, stages and publishes an ext4 volume; returns id, drive, staging, target.
async fn create_published(c: &mut Csi, dir: &Path, name: &str, bytes: u64) -> (String, String, PathBuf, PathBuf) {
    let (id, drive) = create(c, name, bytes, mount_cap("ext4")).await;
    let (stage, target) = paths(dir, name);
    c.node.node_stage_volume(stage_req(&id, &stage, mount_cap("ext4"))).await.unwrap();
    c.node.node_publish_volume(publish_req(&id, &stage, &target, mount_cap("ext4"), false)).await.unwrap();
    (id, drive, stage, target)
}

/// The volume's condition as ControllerGetVolume reports it.
async fn condition(c: &mut Csi, id: &str) -> csi::VolumeCondition {
    let r = c
        .ctrl
        .controller_get_volume(csi::ControllerGetVolumeRequest { volume_id: id.into() })
        .await
        .unwrap_or_else(|e| panic!("ControllerGetVolume {id}: {e:?}"))
        .into_inner();
    r.status.and_then(|s| s.volume_condition).expect("ControllerGetVolume carries a volume condition")
}

/// Polls ControllerGetVolume every 20 ms until `want` holds; returns the condition and
/// the time since `since`. Fails after `give_up` with the last condition and the log.
async fn wait_condition(
    c: &mut Csi,
    agent: &Agent,
    id: &str,
    since: Instant,
    give_up: Duration,
    what: &str,
    want: impl Fn(&csi::VolumeCondition) -> bool,
) -> (csi::VolumeCondition, Duration) {
    loop {
        let cond = condition(c, id).await;
        if want(&cond) {
            return (cond, since.elapsed());
        }
        assert!(
            since.elapsed() < give_up,
            "volume {id}: no condition {what} within {give_up:?}; last: abnormal={} {:?}\nlog:\n{}",
            cond.abnormal,
            cond.message,
            agent.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn stats(c: &mut Csi, id: &str, path: &Path) -> csi::NodeGetVolumeStatsResponse {
    c.node
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: id.into(),
            volume_path: path.display().to_string(),
            staging_target_path: String::new(),
        })
        .await
        .unwrap_or_else(|e| panic!("NodeGetVolumeStats {id} at {}: {e:?}", path.display()))
        .into_inner()
}

const HEALTHY: fn(&csi::VolumeCondition) -> bool = |c| !c.abnormal;

#[test]
fn a_drive_that_dies_under_a_published_volume_is_reported_within_a_second_everywhere() {
    require_host();
    let tmp = short_tempdir();
    let a = LoopDrive::new(tmp.path(), "a.img", GIB);
    let _u = Unmounter(tmp.path().to_path_buf());
    let (agent, _smart) = start_agent(tmp.path());
    let rt = rt();
    rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        let (id, drive, _stage, target) = create_published(&mut c, tmp.path(), "pvc-dies", 64 * MIB).await;
        std::fs::write(target.join("data.txt"), "before the drive died").unwrap();
        wait_condition(&mut c, &agent, &id, Instant::now(), Duration::from_secs(5), "normal before the failure", HEALTHY).await;

        // The drive dies: its medium is gone and the kernel is told its size is 0.
        let died = Instant::now();
        std::fs::OpenOptions::new().write(true).open(&a.file).unwrap().set_len(0).unwrap();
        sh("losetup", &["-c", a.dev.to_str().unwrap()]);
        let (cond, latency) = wait_condition(&mut c, &agent, &id, died, Duration::from_secs(5), "naming the dead drive", |c| {
            c.abnormal && c.message.contains(&drive)
        })
        .await;
        println!("drive death -> abnormal condition in ControllerGetVolume: {latency:?} ({:?})", cond.message);
        assert!(latency < Duration::from_secs(1), "the condition took {latency:?} (limit 1s): {:?}", cond.message);
        assert!(
            cond.message.contains("missing") || cond.message.contains("fail"),
            "the message says the drive is missing or failing: {:?}",
            cond.message
        );

        let st = stats(&mut c, &id, &target).await;
        let sc = st.volume_condition.expect("NodeGetVolumeStats carries a volume condition");
        assert!(sc.abnormal && sc.message.contains(&drive), "NodeGetVolumeStats names the dead drive: {sc:?}");
        let lc = listed_condition(&listed(&mut c, &id).await);
        assert!(lc.abnormal && lc.message.contains(&drive), "ListVolumes names the dead drive: {lc:?}");
    });
    // The Unmounter lazily unmounts the staging and target paths of the dead drive.
}

#[test]
fn a_target_unmounted_behind_drivelets_back_is_reported_and_publishing_again_heals_it() {
    require_host();
    let tmp = short_tempdir();
    let _a = LoopDrive::new(tmp.path(), "a.img", GIB);
    let _u = Unmounter(tmp.path().to_path_buf());
    let (agent, _smart) = start_agent(tmp.path());
    let rt = rt();
    rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        let (id, _, stage, target) = create_published(&mut c, tmp.path(), "pvc-unmounted", 64 * MIB).await;
        std::fs::write(target.join("data.txt"), "still here").unwrap();
        wait_condition(&mut c, &agent, &id, Instant::now(), Duration::from_secs(5), "normal once published", HEALTHY).await;

        sh("umount", &[target.to_str().unwrap()]);
        let (cond, latency) = wait_condition(&mut c, &agent, &id, Instant::now(), Duration::from_secs(5), "saying not mounted", |c| {
            c.abnormal && c.message.contains("not mounted")
        })
        .await;
        println!("target unmounted -> abnormal condition: {latency:?} ({:?})", cond.message);
        assert!(cond.message.contains(&target.display().to_string()), "the message names the target: {:?}", cond.message);
        let sc = stats(&mut c, &id, &stage).await.volume_condition.unwrap();
        assert!(sc.abnormal && sc.message.contains("not mounted"), "NodeGetVolumeStats says so too: {sc:?}");

        // kubelet publishes again (a pod restart): the target is mounted and all is well.
        c.node.node_publish_volume(publish_req(&id, &stage, &target, mount_cap("ext4"), false)).await.unwrap();
        assert!(mounts_under(tmp.path()).contains(&target), "publishing again mounts the target");
        assert_eq!(std::fs::read_to_string(target.join("data.txt")).unwrap(), "still here");
        wait_condition(&mut c, &agent, &id, Instant::now(), Duration::from_secs(5), "normal after publishing again", HEALTHY).await;
    });
}

#[test]
fn a_corrupted_unmounted_ext4_volume_is_reported_corrupt() {
    require_host();
    let tmp = short_tempdir();
    let a = LoopDrive::new(tmp.path(), "a.img", GIB);
    let _u = Unmounter(tmp.path().to_path_buf());
    let (mut agent, _smart) = start_agent(tmp.path());
    let rt = rt();
    let id = rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        let (id, _, stage, target) = create_published(&mut c, tmp.path(), "pvc-corrupt", 64 * MIB).await;
        std::fs::write(target.join("victim.txt"), "soon unreachable").unwrap();
        c.node
            .node_unpublish_volume(csi::NodeUnpublishVolumeRequest { volume_id: id.clone(), target_path: target.display().to_string() })
            .await
            .unwrap();
        c.node
            .node_unstage_volume(csi::NodeUnstageVolumeRequest { volume_id: id.clone(), staging_target_path: stage.display().to_string() })
            .await
            .unwrap();
        // Unmounted and clean: the read-only fsck finds nothing.
        tokio::time::sleep(Duration::from_millis(600)).await;
        let cond = condition(&mut c, &id).await;
        assert!(!cond.abnormal, "a clean unmounted filesystem is healthy: {cond:?}");
        id
    });
    // A clean unmounted volume is not checked again for hours (FSCK_EVERY), so the
    // corruption is made while the agent is down and the next agent finds it.
    assert_eq!(agent.stop(), 0);
    let parts = kernel_parts(&a.dev);
    assert_eq!(parts.len(), 1, "one partition: {parts:?}");
    let part = format!("/dev/{}", parts[0].0);
    // Clear the file's inode: its directory entry now points at a free inode.
    sh("debugfs", &["-w", "-R", "clri /victim.txt", &part]);
    let fsck = std::process::Command::new("e2fsck").args(["-n", "-f", &part]).output().unwrap();
    assert_eq!(fsck.status.code(), Some(4), "e2fsck -n -f finds uncorrected errors: {}", String::from_utf8_lossy(&fsck.stdout));
    agent.spawn();
    rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        let (cond, latency) =
            wait_condition(&mut c, &agent, &id, Instant::now(), Duration::from_secs(10), "saying corrupt", |c| {
                c.abnormal && c.message.contains("corrupt")
            })
            .await;
        println!("agent ready -> corrupt condition: {latency:?} ({:?})", cond.message);
        let lc = listed_condition(&listed(&mut c, &id).await);
        assert!(lc.abnormal && lc.message.contains("corrupt"), "ListVolumes says so too: {lc:?}");
    });
    // The check is read-only: the corruption is still there for the admin to repair.
    let fsck = std::process::Command::new("e2fsck").args(["-n", "-f", &part]).output().unwrap();
    assert_eq!(fsck.status.code(), Some(4), "drivelet's check repaired nothing: {}", String::from_utf8_lossy(&fsck.stdout));
}

/// `df` numbers for `path`: (total, used, available) bytes and (total, used, free) inodes.
fn df(path: &Path) -> ([i64; 3], [i64; 3]) {
    let nums = |args: &[&str]| -> [i64; 3] {
        let mut a = vec!["--output=".to_string() + args[0]];
        a.extend(args[1..].iter().map(|s| s.to_string()));
        a.push(path.display().to_string());
        let out = sh("df", &a.iter().map(String::as_str).collect::<Vec<_>>());
        let v: Vec<i64> = out.lines().nth(1).unwrap().split_whitespace().map(|n| n.parse().unwrap()).collect();
        [v[0], v[1], v[2]]
    };
    (nums(&["size,used,avail", "-B1"]), nums(&["itotal,iused,iavail"]))
}

#[test]
fn a_volume_filled_past_the_threshold_is_full_with_stats_matching_df_until_space_is_freed() {
    require_host();
    let tmp = short_tempdir();
    let _a = LoopDrive::new(tmp.path(), "a.img", GIB);
    let _u = Unmounter(tmp.path().to_path_buf());
    let (agent, _smart) = start_agent(tmp.path());
    let rt = rt();
    rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        let (id, _, _stage, target) = create_published(&mut c, tmp.path(), "pvc-full", 32 * MIB).await;
        wait_condition(&mut c, &agent, &id, Instant::now(), Duration::from_secs(5), "normal when empty", HEALTHY).await;

        let ([_, _, avail], _) = df(&target);
        let fill = target.join("fill.bin");
        sh("fallocate", &["-l", &(avail - 2 * MIB as i64).to_string(), fill.to_str().unwrap()]);
        let (cond, latency) = wait_condition(&mut c, &agent, &id, Instant::now(), Duration::from_secs(5), "saying full", |c| {
            c.abnormal && c.message.contains("full")
        })
        .await;
        println!("filled -> full condition: {latency:?} ({:?})", cond.message);
        assert!(cond.message.contains("threshold 80%"), "the message gives the threshold: {:?}", cond.message);

        let st = stats(&mut c, &id, &target).await;
        let (bytes, inodes) = df(&target);
        let unit = |u: csi::volume_usage::Unit| {
            st.usage.iter().find(|x| x.unit == u as i32).map(|x| [x.total, x.used, x.available]).unwrap_or_else(|| panic!("no {u:?} usage: {st:?}"))
        };
        assert_eq!(unit(csi::volume_usage::Unit::Bytes), bytes, "bytes total/used/available as df -B1 says");
        assert_eq!(unit(csi::volume_usage::Unit::Inodes), inodes, "inodes total/used/free as df -i says");
        assert!(bytes[1] * 100 / bytes[0] >= 80, "df agrees the volume is past 80%: {bytes:?}");
        let sc = st.volume_condition.unwrap();
        assert!(sc.abnormal && sc.message.contains("full"), "NodeGetVolumeStats says full: {sc:?}");

        std::fs::remove_file(&fill).unwrap();
        let (cond, latency) =
            wait_condition(&mut c, &agent, &id, Instant::now(), Duration::from_secs(5), "normal once freed", HEALTHY).await;
        println!("freed -> normal condition: {latency:?} ({:?})", cond.message);
    });
}

#[test]
fn a_drive_whose_smart_says_failing_fails_its_volumes_and_takes_no_new_ones_while_an_unknown_drive_stays_usable() {
    require_host();
    let tmp = short_tempdir();
    let a = LoopDrive::new(tmp.path(), "a.img", GIB);
    let b = LoopDrive::new(tmp.path(), "b.img", 256 * MIB);
    let _u = Unmounter(tmp.path().to_path_buf());
    std::fs::create_dir_all(tmp.path().join("kubelet")).unwrap();
    let smart = SmartStandIn::install(tmp.path());
    // A starts healthy; B answers like a device smartctl cannot open.
    smart.choose(&a.name(), "sata-hdd-healthy.json");
    smart.choose(&b.name(), OPEN_FAILED);
    let agent = Agent::start(tmp.path(), health_opts(&smart, MORE));
    let (ida, idb) = (drive_id_of(&agent, &a), drive_id_of(&agent, &b));
    wait_drive_health(&agent, &ida, "good", Duration::from_secs(5));
    let db = wait_drive_health(&agent, &idb, "unknown", Duration::from_secs(5));
    assert_ne!(db["health"]["checked_unix"].as_u64(), Some(0), "B was polled, not merely never checked: {db}");
    assert!(db["health"]["reason"].as_str().unwrap().contains("RAID controller's virtual disk"), "B's reason is drivelet's words for smartctl's message: {db}");

    let rt = rt();
    rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        // 512 MiB fits only A; 32 MiB goes to the drive with the least free space, B.
        let (va, on) = create(&mut c, "pvc-on-a", 512 * MIB, block_cap()).await;
        assert_eq!(on, ida);
        let (vb, on) = create(&mut c, "pvc-on-b", 32 * MIB, block_cap()).await;
        assert_eq!(on, idb);
        for v in [&va, &vb] {
            wait_condition(&mut c, &agent, v, Instant::now(), Duration::from_secs(5), "normal on working drives", HEALTHY).await;
        }

        // A's SMART self-assessment fails.
        let turned = Instant::now();
        smart.choose(&a.name(), "sata-hdd-smart-failed.json");
        let (cond, latency) = wait_condition(&mut c, &agent, &va, turned, Duration::from_secs(5), "saying failing", |c| {
            c.abnormal && c.message.contains("failing") && c.message.contains(&ida)
        })
        .await;
        println!("SMART failed -> failing condition: {latency:?} ({:?})", cond.message);
        let da = ctl_drive(&agent, &ida);
        assert_eq!(da["health"]["health"], "bad", "ctl shows A bad: {da}");
        assert_eq!(da["usage"], "releasing", "a BAD drive is released from placement: {da}");
        let lc = listed_condition(&listed(&mut c, &va).await);
        assert!(lc.abnormal && lc.message.contains("failing"), "ListVolumes says so too: {lc:?}");

        // 230 MiB fits B's region but not what is left of it: no room now either.
        let e = c.ctrl.create_volume(create_req("pvc-fits-b-region", 230 * MIB, block_cap())).await.unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted, "a volume only an empty B or the BAD A could hold: {e:?}");

        // B (UNKNOWN: no SMART) stays usable and its volumes stay normal.
        let (vb2, on) = create(&mut c, "pvc-b-again", 32 * MIB, block_cap()).await;
        assert_eq!(on, idb, "new volumes go to B");
        for v in [&vb, &vb2] {
            let cond = condition(&mut c, v).await;
            assert!(!cond.abnormal, "a volume on an UNKNOWN drive is normal: {cond:?}");
        }
        assert_eq!(ctl_drive(&agent, &idb)["health"]["health"], "unknown");
        assert_eq!(ctl_drive(&agent, &idb)["usage"], "active");

        // 400 MiB could go only on A (B is 256 MiB): A is closed, so there is no room
        // on this node now; the request itself is not out of range.
        let e = c.ctrl.create_volume(create_req("pvc-only-fits-a", 400 * MIB, block_cap())).await.unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted, "a volume only the BAD drive could hold: {e:?}");
    });
}

/// `mknod path b major minor`: a block device node of `devnum` at `path`.
fn mknod_block(path: &Path, devnum: (u64, u64)) {
    sh("mknod", &[path.to_str().unwrap(), "b", &devnum.0.to_string(), &devnum.1.to_string()]);
}

/// The device number of the block device node `dev`.
fn devnum_of(dev: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let rdev = std::fs::metadata(dev).unwrap_or_else(|e| panic!("{}: {e}", dev.display())).rdev();
    (nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev))
}

#[test]
fn block_volume_stats_are_answered_at_any_node_of_its_device_under_the_allowed_roots() {
    require_host();
    let tmp = short_tempdir();
    let a = LoopDrive::new(tmp.path(), "a.img", GIB);
    let _u = Unmounter(tmp.path().to_path_buf());
    let (agent, _smart) = start_agent(tmp.path());
    let rt = rt();
    rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        let (id, _) = create(&mut c, "pvc-blk", 16 * MIB, block_cap()).await;
        let (stage, target) = paths(tmp.path(), "pvc-blk");
        c.node.node_stage_volume(stage_req(&id, &stage, block_cap())).await.unwrap();
        c.node.node_publish_volume(publish_req(&id, &stage, &target, block_cap(), false)).await.unwrap();
        let partition = devnum_of(&target);

        // kubelet binds the published device at its own path and asks for stats there.
        let dev_dir = tmp.path().join("kubelet/plugins/kubernetes.io/csi/volumeDevices/pv-blk/dev");
        std::fs::create_dir_all(&dev_dir).unwrap();
        let bound = dev_dir.join("8d5c3a7e-46a2-4d0b-9c1e-2f3b7a61e0c4");
        std::fs::write(&bound, b"").unwrap();
        sh("mount", &["--bind", target.to_str().unwrap(), bound.to_str().unwrap()]);
        let bytes = |st: &csi::NodeGetVolumeStatsResponse| {
            st.usage.iter().map(|u| (u.unit, u.total)).collect::<Vec<_>>()
        };
        let want = vec![(csi::volume_usage::Unit::Bytes as i32, 16 * MIB as i64)];
        let st = stats(&mut c, &id, &bound).await;
        assert_eq!(bytes(&st), want, "the size of the block volume at kubelet's bind: {st:?}");
        assert!(st.volume_condition.is_some_and(|v| !v.abnormal), "with its condition");

        // Any node of the partition's device under the allowed roots will do.
        let made = dev_dir.join("made-with-mknod");
        mknod_block(&made, partition);
        assert_eq!(bytes(&stats(&mut c, &id, &made).await), want, "a node made with mknod");

        // Not the volume's device, outside the roots, or nothing there: NOT_FOUND.
        let other = dev_dir.join("other-device");
        mknod_block(&other, devnum_of(&a.dev));
        let outside = tmp.path().join("outside-node");
        mknod_block(&outside, partition);
        let file = dev_dir.join("plain-file");
        std::fs::write(&file, b"").unwrap();
        for (path, what) in [
            (&other, "a node of the whole drive"),
            (&outside, "the volume's device outside the allowed roots"),
            (&file, "a plain file"),
            (&dev_dir.join("nothing"), "nothing at all"),
        ] {
            let e = c
                .node
                .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                    volume_id: id.clone(),
                    volume_path: path.display().to_string(),
                    staging_target_path: String::new(),
                })
                .await
                .expect_err(what);
            assert_eq!(e.code(), Code::NotFound, "{what}: {e:?}");
            assert!(e.message().contains("does not exist"), "{what}: {}", e.message());
        }
        sh("umount", &[bound.to_str().unwrap()]);
    });
}

/// An agent whose volume checks hold what they check for 3 s at the fail point `point`
/// (`health.readable.hold`: the staging directory open; `health.fsck.hold`: the
/// partition open exclusively, as `xfs_repair -n` does).
fn start_holding_agent(dir: &Path, point: &str) -> (Agent, SmartStandIn) {
    assert!(cfg!(feature = "failpoints"), "this test needs `--features failpoints`; scripts/test.sh passes it");
    std::fs::create_dir_all(dir.join("kubelet")).unwrap();
    let smart = SmartStandIn::install(dir);
    let agent = Agent::start_with(dir, health_opts(&smart, MORE), &[("FAILPOINTS", &format!("{point}=return(3000)"))]);
    (agent, smart)
}

/// Waits until the agent says a volume check holds `what` open.
fn wait_for_hold(agent: &Agent, what: &str) {
    let t0 = Instant::now();
    while !agent.logs().lines().any(|l| l.contains("a volume check holds this open") && l.contains(what)) {
        assert!(t0.elapsed() < Duration::from_secs(30), "no volume check held {what}; log:\n{}", agent.logs());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn unstaging_waits_for_a_health_check_that_holds_the_staging_directory_open() {
    require_host();
    let tmp = short_tempdir();
    let _a = LoopDrive::new(tmp.path(), "a.img", GIB);
    let _u = Unmounter(tmp.path().to_path_buf());
    let (agent, _smart) = start_holding_agent(tmp.path(), "health.readable.hold");
    let rt = rt();
    rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        let (id, _) = create(&mut c, "pvc-held-dir", 64 * MIB, mount_cap("ext4")).await;
        let (stage, _) = paths(tmp.path(), "pvc-held-dir");
        c.node.node_stage_volume(stage_req(&id, &stage, mount_cap("ext4"))).await.unwrap();
        wait_for_hold(&agent, &stage.display().to_string());
        c.node
            .node_unstage_volume(csi::NodeUnstageVolumeRequest { volume_id: id.clone(), staging_target_path: stage.display().to_string() })
            .await
            .expect("unstage while a health check holds the staging directory");
        assert!(!sh("findmnt", &["-rn", "-o", "TARGET"]).lines().any(|l| l == stage.to_str().unwrap()), "the staging path is unmounted");
        c.ctrl.delete_volume(csi::DeleteVolumeRequest { volume_id: id.clone(), ..Default::default() }).await.expect("delete");
    });
}

#[test]
fn deleting_waits_for_a_health_check_that_holds_the_partition_open() {
    require_host();
    let tmp = short_tempdir();
    let a = LoopDrive::new(tmp.path(), "a.img", GIB);
    let _u = Unmounter(tmp.path().to_path_buf());
    let (agent, _smart) = start_holding_agent(tmp.path(), "health.fsck.hold");
    let rt = rt();
    rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        let (id, _) = create(&mut c, "pvc-held-part", 64 * MIB, mount_cap("ext4")).await;
        let (stage, _) = paths(tmp.path(), "pvc-held-part");
        // Staged once (formatted), then unstaged: idle, so the checks fsck it.
        c.node.node_stage_volume(stage_req(&id, &stage, mount_cap("ext4"))).await.unwrap();
        c.node
            .node_unstage_volume(csi::NodeUnstageVolumeRequest { volume_id: id.clone(), staging_target_path: stage.display().to_string() })
            .await
            .unwrap();
        wait_for_hold(&agent, &format!("{}p", a.dev.display()));
        c.ctrl
            .delete_volume(csi::DeleteVolumeRequest { volume_id: id.clone(), ..Default::default() })
            .await
            .expect("delete while a health check holds the partition");
        let parts = sh("lsblk", &["-rn", "-o", "NAME", a.dev.to_str().unwrap()]);
        assert_eq!(parts.lines().count(), 1, "the partition is gone: {parts}");
    });
}
