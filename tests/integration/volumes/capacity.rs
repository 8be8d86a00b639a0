//! GetCapacity promises exactly what CreateVolume accepts, on real loop drives, while
//! drives are releasing, released, BAD (SMART from a smartctl stand-in) and missing.
//!
//! At every step and for each kind of volume (partition block, partition ext4, whole
//! drive), through the CSI socket:
//! - a CreateVolume of exactly `maximum_volume_size` succeeds, one MiB more does not;
//! - volumes of the then-current maximum, one after another, fill exactly
//!   `available_capacity`, after which both are zero and CreateVolume is refused with
//!   RESOURCE_EXHAUSTED (never INTERNAL);
//! - everything made for the check is deleted again, and its space is offered again once
//!   the cleaner zeroed it (never before).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::common::*;
use drivelet::grpc::proto::csi;
use tonic::Code;

const MIB: u64 = 1 << 20;

/// One kind of volume: StorageClass parameters and the capability.
struct Kind {
    label: &'static str,
    layout: &'static str,
    cap: fn() -> csi::VolumeCapability,
}

const KINDS: [Kind; 3] = [
    Kind { label: "partition, block", layout: "partition", cap: block_cap },
    Kind { label: "partition, ext4", layout: "partition", cap: ext4_cap },
    Kind { label: "whole drive, block", layout: "drive", cap: block_cap },
];

fn ext4_cap() -> csi::VolumeCapability {
    mount_cap("ext4")
}

fn params(layout: &str) -> HashMap<String, String> {
    HashMap::from([("layout".to_string(), layout.to_string())])
}

async fn capacity(c: &mut Csi, k: &Kind) -> (u64, u64) {
    let r = c
        .ctrl
        .get_capacity(csi::GetCapacityRequest { parameters: params(k.layout), volume_capabilities: vec![(k.cap)()], ..Default::default() })
        .await
        .unwrap_or_else(|e| panic!("GetCapacity {}: {e}", k.label))
        .into_inner();
    (r.available_capacity as u64, r.maximum_volume_size.unwrap_or(0) as u64)
}

async fn create(c: &mut Csi, k: &Kind, name: &str, bytes: u64) -> Result<(String, u64), tonic::Status> {
    let mut req = create_req(name, bytes, (k.cap)());
    req.parameters = params(k.layout);
    c.ctrl.create_volume(req).await.map(|r| {
        let v = r.into_inner().volume.unwrap_or_default();
        (v.volume_id, v.capacity_bytes as u64)
    })
}

async fn delete(c: &mut Csi, id: &str) {
    c.ctrl
        .delete_volume(csi::DeleteVolumeRequest { volume_id: id.to_string(), ..Default::default() })
        .await
        .unwrap_or_else(|e| panic!("DeleteVolume {id}: {e}"));
}

/// GetCapacity once it reads `want`, at most 10 s: a drive's state reaches the volume
/// manager as an event after `ctl drives` shows it (SMART verdicts, drives pulled).
async fn settled(c: &mut Csi, k: &Kind, want: (u64, u64)) -> (u64, u64) {
    let start = Instant::now();
    loop {
        let now = capacity(c, k).await;
        if now == want || start.elapsed() > Duration::from_secs(10) {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The promise of GetCapacity holds for every kind of volume, now. `whole`: what
/// GetCapacity must offer for whole drives in this step (the open drives, each whole);
/// once it does, the volume manager has taken in the step's drive states, and every
/// kind is read from that same view.
async fn promise_holds(c: &mut Csi, agent: &Agent, step: &str, whole: (u64, u64)) -> Vec<(&'static str, u64, u64)> {
    assert_eq!(settled(c, &KINDS[2], whole).await, whole, "{step}: whole drives offered within 10 s");
    let mut seen = Vec::new();
    for k in &KINDS {
        let what = format!("{step}, {}", k.label);
        let (available, maximum) = capacity(c, k).await;
        seen.push((k.label, available, maximum));
        let mut made = Vec::new();
        if maximum > 0 {
            // Whole drives are as big as they are: one MiB more than the biggest is asked
            // for as a minimum; partitions as an exact size.
            match create(c, k, "over", maximum + MIB).await {
                Ok((id, size)) => panic!("{what}: {} bytes more than the maximum {maximum} made volume {id} of {size}", MIB),
                Err(e) => assert!(matches!(e.code(), Code::OutOfRange | Code::ResourceExhausted), "{what}: over the maximum: {e}"),
            }
        }
        let mut filled = 0;
        for n in 0.. {
            let (avail_now, max_now) = capacity(c, k).await;
            if max_now == 0 {
                assert_eq!(avail_now, 0, "{what}: nothing fits but {avail_now} bytes are promised");
                let e = create(c, k, "one-more", MIB).await.expect_err("nothing fits");
                assert_eq!(e.code(), Code::ResourceExhausted, "{what}: {e}");
                break;
            }
            let (id, size) = create(c, k, &format!("fill-{n}"), max_now)
                .await
                .unwrap_or_else(|e| panic!("{what}: the promised maximum {max_now} was refused: {e}\nlog:\n{}", agent.log_tail(40)));
            assert_eq!(size, max_now, "{what}: a volume of the maximum");
            filled += size;
            made.push(id);
        }
        assert_eq!(filled, available, "{what}: volumes of the maximum fill exactly the available capacity; log:\n{}", agent.log_tail(40));
        for id in &made {
            delete(c, id).await;
        }
        // Space DeleteVolume freed is offered again once the cleaner zeroed it, and never
        // before: GetCapacity promises only clean space (issue 24).
        let (avail_now, max_now) = capacity(c, k).await;
        assert!(avail_now <= available && max_now <= maximum, "{what}: right after the deletes, more than before is promised: {avail_now}/{max_now}");
        assert_eq!(settled(c, k, (available, maximum)).await, (available, maximum), "{what}: everything back once cleaned; log:\n{}", agent.log_tail(40));
    }
    seen
}

/// Waits until `f` holds for the ctl entry of drive `id` (or its absence).
fn wait_drive(agent: &Agent, id: &str, what: &str, f: impl Fn(Option<&serde_json::Value>) -> bool) {
    let start = Instant::now();
    loop {
        let all = agent.ctl_drives();
        if f(all.as_array().unwrap().iter().find(|d| d["id"] == id)) {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "drive {id}: not {what} within 10 s: {all}\n{}", agent.log_tail(30));
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn release(agent: &Agent, id: &str) {
    let out = std::process::Command::new(bin())
        .args(["ctl", "--socket", agent.admin_socket.to_str().unwrap(), "drive", "release", id])
        .output()
        .unwrap();
    assert!(out.status.success(), "release {id}: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn get_capacity_promises_exactly_what_create_volume_accepts_through_every_drive_state() {
    require_host();
    let tmp = short_tempdir();
    let smart = SmartStandIn::install(tmp.path());
    let drives: Vec<LoopDrive> = (0..5).map(|i| LoopDrive::new(tmp.path(), &format!("d{i}.img"), 512 * MIB)).collect();
    sh("udevadm", &["settle"]);
    let opts = AgentOpts {
        extra_toml: format!("[health]\ninterval = \"1s\"\njitter_percent = 0\nsmartctl = \"{}\"\n", smart.program.display()),
        ..Default::default()
    };
    let agent = Agent::start(tmp.path(), opts);
    let ids: Vec<String> = drives.iter().map(|d| drive_id_of(&agent, d)).collect();
    let mut drives = drives;
    rt().block_on(async {
        let mut c = Csi::connect(&agent).await;
        let one_drive = {
            let (start, end) = drivelet::disk::gpt::usable_region(512 * MIB, 512).expect("a drive big enough for a GPT");
            end - start
        };
        let all = promise_holds(&mut c, &agent, "five active drives", (5 * one_drive, one_drive)).await;
        assert_eq!(all[2], (KINDS[2].label, 5 * one_drive, one_drive), "whole drives: all five");

        // Releasing: a drive with a volume on it, released by the admin.
        let (keep, _) = create(&mut c, &KINDS[0], "keep", 64 * MIB).await.unwrap();
        let on = agent.ctl_volumes().as_array().unwrap().iter().find(|v| v["id"] == keep.as_str()).unwrap()["drive_id"].as_str().unwrap().to_string();
        release(&agent, &on);
        wait_drive(&agent, &on, "releasing", |d| d.is_some_and(|d| d["usage"] == "releasing"));
        let seen = promise_holds(&mut c, &agent, "one drive releasing", (4 * one_drive, one_drive)).await;
        assert_eq!(seen[2], (KINDS[2].label, 4 * one_drive, one_drive), "whole drives: the releasing one is not offered");

        // Released: its last volume deleted.
        delete(&mut c, &keep).await;
        wait_drive(&agent, &on, "released", |d| d.is_some_and(|d| d["usage"] == "released"));
        let seen = promise_holds(&mut c, &agent, "one drive released", (4 * one_drive, one_drive)).await;
        assert_eq!(seen[2].1, 4 * one_drive, "the released drive is not offered");

        // BAD: SMART says the drive is failing.
        let bad = ids.iter().find(|i| **i != on).unwrap().clone();
        let bad_dev = drives.iter().find(|d| drive_id_of(&agent, d) == bad).unwrap();
        smart.choose(&bad_dev.name(), "sata-hdd-smart-failed.json");
        wait_drive_health(&agent, &bad, "bad", Duration::from_secs(10));
        let seen = promise_holds(&mut c, &agent, "one drive released, one BAD", (3 * one_drive, one_drive)).await;
        assert_eq!(seen[2].1, 3 * one_drive, "the BAD drive is not offered");

        // Missing: a drive pulled.
        let gone = ids.iter().find(|i| **i != on && **i != bad).unwrap().clone();
        let gone_dev = drives.iter_mut().find(|d| drive_id_of(&agent, d) == gone).unwrap();
        gone_dev.detach();
        wait_drive(&agent, &gone, "gone", |d| d.is_none());
        let seen = promise_holds(&mut c, &agent, "one released, one BAD, one missing", (2 * one_drive, one_drive)).await;
        assert_eq!(seen[2], (KINDS[2].label, 2 * one_drive, one_drive), "two drives left");
    });
}

/// The external-provisioner's capacity tracking asks with the StorageClass's parameters
/// and no capabilities: a class filesystem drivelet cannot make has no capacity (its
/// claims would be refused), xfs has its 300 MiB minimum, ext4 and none the drive's room.
#[test]
fn get_capacity_reads_the_class_filesystem_from_the_parameters() {
    require_host();
    let tmp = short_tempdir();
    let _drive = LoopDrive::new(tmp.path(), "f.img", 512 * MIB);
    sh("udevadm", &["settle"]);
    let agent = Agent::start(tmp.path(), AgentOpts::default());
    rt().block_on(async {
        let mut c = Csi::connect(&agent).await;
        let ask = |fs: &str| csi::GetCapacityRequest { parameters: kv(&[("csi.storage.k8s.io/fstype", fs)]), ..Default::default() };
        let none = c.ctrl.get_capacity(csi::GetCapacityRequest::default()).await.unwrap().into_inner();
        assert!(none.available_capacity > 0);
        for fs in ["ext4", "xfs"] {
            let r = c.ctrl.get_capacity(ask(fs)).await.unwrap().into_inner();
            assert_eq!(r.available_capacity, none.available_capacity, "{fs}: the drive's room");
        }
        assert_eq!(c.ctrl.get_capacity(ask("xfs")).await.unwrap().into_inner().minimum_volume_size, Some(300 * MIB as i64));
        for fs in ["vfat", "btrfs"] {
            let r = c.ctrl.get_capacity(ask(fs)).await.unwrap().into_inner();
            assert_eq!((r.available_capacity, r.maximum_volume_size), (0, Some(0)), "{fs}: drivelet makes ext4 or xfs only");
        }
    });
}
