//! Volumes whose partition is gone from a present drive (the drive was wiped or replaced
//! by a blank one) are shown as lost from the moment drivelet finds out, at start-up or
//! when the drive appears while it runs; a drive that comes back with its partitions
//! brings its volumes back.
//!
//! Checked through the CSI socket and `drivelet ctl volumes`, on real loop drives:
//! - `ctl volumes` says `lost` (JSON `"lost": true`), ControllerGetVolume's condition
//!   says the data is gone;
//! - CreateVolume of the same name never reports success for the lost volume: it is
//!   FAILED_PRECONDITION with the reason; staging is refused the same way;
//! - DeleteVolume clears it, and a CreateVolume of the name then makes a new volume.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::common::*;
use drivelet::grpc::proto::csi;
use tonic::Code;

const MIB: u64 = 1 << 20;

/// Detaches `d`, makes its file blank (as a replacement drive would be) unless `keep`,
/// and attaches the file again.
fn swap_drive(d: &mut LoopDrive, keep: bool) {
    d.detach();
    if !keep {
        let f = std::fs::OpenOptions::new().write(true).open(&d.file).unwrap();
        let len = f.metadata().unwrap().len();
        f.set_len(0).unwrap();
        f.set_len(len).unwrap();
    }
    d.dev = PathBuf::from(sh("losetup", &["--find", "--show", "--partscan", d.file.to_str().unwrap()]));
    sh("udevadm", &["settle"]);
}

/// Waits until the drive over `d`'s file is managed (udev has probed it again).
fn wait_managed(agent: &Agent, d: &LoopDrive) {
    let start = Instant::now();
    while drive_by_path(&agent.ctl_drives(), &d.dev).is_none_or(|x| x["class"] != "managed") {
        assert!(start.elapsed() < Duration::from_secs(10), "{} not managed again: {}", d.dev.display(), agent.ctl_drives());
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn volume(agent: &Agent, id: &str) -> Option<serde_json::Value> {
    agent.ctl_volumes().as_array().unwrap().iter().find(|v| v["id"] == id).cloned()
}

fn wait_volume(agent: &Agent, id: &str, what: &str, f: impl Fn(Option<&serde_json::Value>) -> bool) {
    let start = Instant::now();
    loop {
        let v = volume(agent, id);
        if f(v.as_ref()) {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "volume {id}: not {what} within 10 s: {v:?}\n{}", agent.log_tail(30));
        std::thread::sleep(Duration::from_millis(100));
    }
}

async fn create(c: &mut Csi, name: &str) -> Result<String, tonic::Status> {
    c.ctrl.create_volume(create_req(name, 64 * MIB, block_cap())).await.map(|r| r.into_inner().volume.unwrap().volume_id)
}

async fn delete(c: &mut Csi, id: &str) {
    c.ctrl.delete_volume(csi::DeleteVolumeRequest { volume_id: id.into(), ..Default::default() }).await.unwrap();
}

async fn condition(c: &mut Csi, id: &str) -> csi::VolumeCondition {
    let r = c.ctrl.controller_get_volume(csi::ControllerGetVolumeRequest { volume_id: id.into() }).await.unwrap().into_inner();
    r.status.and_then(|s| s.volume_condition).unwrap_or_default()
}

#[test]
fn a_volume_whose_partition_is_gone_is_lost_everywhere_until_deleted_and_a_returning_drive_brings_its_volumes_back() {
    require_host();
    let tmp = short_tempdir();
    let mut a = LoopDrive::new(tmp.path(), "a.img", 512 * MIB);
    sh("udevadm", &["settle"]);
    std::fs::create_dir_all(tmp.path().join("kubelet")).unwrap();
    let mut agent = Agent::start(tmp.path(), AgentOpts::default());
    let rt = rt();

    // Found at start-up: the drive was replaced by a blank one while drivelet was down.
    let gone = rt.block_on(async { create(&mut Csi::connect(&agent).await, "pvc-gone").await.unwrap() });
    assert_eq!(agent.stop(), 0);
    swap_drive(&mut a, false);
    agent.spawn();
    wait_managed(&agent, &a);
    let v = volume(&agent, &gone).expect("the record is kept");
    assert_eq!(v["lost"], true, "ctl volumes -o json: {v}");
    let table = {
        let out = std::process::Command::new(bin()).args(["ctl", "--socket", agent.admin_socket.to_str().unwrap(), "volumes"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let row = table.lines().find(|l| l.starts_with(&gone)).unwrap_or_else(|| panic!("{table}"));
    assert!(row.split_whitespace().any(|w| w == "lost"), "STATE is lost: {row}");
    rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        let cond = condition(&mut c, &gone).await;
        assert!(cond.abnormal && cond.message.contains("the data is gone"), "{cond:?}");
        let e = create(&mut c, "pvc-gone").await.expect_err("never a success for a lost volume");
        assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
        assert!(e.message().contains("the data is gone") && e.message().contains("delete"), "{e}");
        let stage = tmp.path().join("kubelet/stage-gone");
        std::fs::create_dir_all(&stage).unwrap();
        let e = c.node.node_stage_volume(stage_req(&gone, &stage, block_cap())).await.expect_err("a lost volume is not staged");
        assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
        assert!(kernel_parts(&a.dev).is_empty(), "nothing was written for the lost volume: {:?}", kernel_parts(&a.dev));
        // DeleteVolume clears the way; the name then makes a new, empty volume.
        delete(&mut c, &gone).await;
        assert!(volume(&agent, &gone).is_none());
        let again = create(&mut c, "pvc-gone").await.unwrap();
        assert_eq!(again, gone, "same name, same id");
        assert!(!condition(&mut c, &again).await.abnormal);
    });

    // Found while running: the drive goes and comes back blank.
    rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        let found = Instant::now();
        swap_drive(&mut a, false);
        wait_volume(&agent, &gone, "lost", |v| v.is_some_and(|v| v["lost"] == true));
        println!("blank drive back -> volume lost: {:?}", found.elapsed());
        wait_managed(&agent, &a);
        let cond = condition(&mut c, &gone).await;
        assert!(cond.abnormal && cond.message.contains("the data is gone"), "{cond:?}");
        delete(&mut c, &gone).await;
    });

    // The drive goes and comes back as it was: its volumes come back, including one
    // deleted while it was away (only its record could go then).
    rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        let kept = create(&mut c, "pvc-kept").await.unwrap_or_else(|e| panic!("{e}\n{}\n{}", agent.ctl_drives(), agent.log_tail(30)));
        let away = create(&mut c, "pvc-away").await.unwrap();
        a.detach();
        wait_volume(&agent, &kept, "abnormal (drive missing)", |_| true);
        let start = Instant::now();
        while !condition(&mut c, &kept).await.abnormal {
            assert!(start.elapsed() < Duration::from_secs(10), "the missing drive is not reported");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        delete(&mut c, &away).await;
        assert!(volume(&agent, &away).is_none());
        a.dev = PathBuf::from(sh("losetup", &["--find", "--show", "--partscan", a.file.to_str().unwrap()]));
        wait_managed(&agent, &a);
        wait_volume(&agent, &away, "listed again", |v| v.is_some_and(|v| v["lost"] != true));
        let start = Instant::now();
        while condition(&mut c, &kept).await.abnormal {
            assert!(start.elapsed() < Duration::from_secs(10), "the returned drive's volume stays abnormal");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(volume(&agent, &kept).unwrap()["lost"], serde_json::Value::Null, "not lost");
        delete(&mut c, &away).await;
        delete(&mut c, &kept).await;
    });
    assert_eq!(agent.stop(), 0);
}
