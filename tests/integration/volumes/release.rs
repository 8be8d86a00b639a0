//! The drive replacement workflow through `drivelet ctl drive release`: a releasing
//! drive takes no new volumes and its volumes say so; it is released once empty (or at
//! once with --force, failing what is left); a released drive that is pulled is
//! forgotten, and a drive put in its place is managed again.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;
use drivelet::grpc::proto::csi;

fn ctl(agent: &Agent, args: &[&str]) -> (bool, String) {
    let out = Command::new(bin()).args(["ctl", "--socket", agent.admin_socket.to_str().unwrap()]).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
}

fn usage_of(agent: &Agent, drive_id: &str) -> Option<String> {
    let d = agent.ctl_drives();
    d.as_array()?.iter().find(|d| d["id"] == drive_id).map(|d| d["usage"].as_str().unwrap_or("").to_string())
}

fn drive_of_volume(agent: &Agent, id: &str) -> String {
    let out = Command::new(bin())
        .args(["ctl", "--socket", agent.admin_socket.to_str().unwrap(), "volumes", "-o", "json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v.as_array().unwrap().iter().find(|v| v["id"] == id).unwrap()["drive_id"].as_str().unwrap().to_string()
}

fn wait(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(10), "{what} within 10 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn releasing_a_drive_moves_new_volumes_away_and_a_pulled_released_drive_is_forgotten() {
    require_host();
    let tmp = short_tempdir();
    let mut a = LoopDrive::new(tmp.path(), "a.img", GIB);
    let _b = LoopDrive::new(tmp.path(), "b.img", GIB);
    // Both drives probed by udev before the first scan: an unprobed one is foreign until
    // its udev event, and the volumes this test moves off drive a need drive b managed.
    sh("udevadm", &["settle"]);
    let agent = Agent::start(tmp.path(), AgentOpts::default());
    let rt = rt();
    let mut c = rt.block_on(Csi::connect(&agent));
    let create = |c: &mut Csi, name: &str| {
        rt.block_on(async {
            c.ctrl.create_volume(create_req(name, 16 * MIB, block_cap())).await.map(|r| r.into_inner().volume.unwrap().volume_id)
        })
    };
    let condition = |c: &mut Csi, id: &str| {
        rt.block_on(async {
            let r = c.ctrl.controller_get_volume(csi::ControllerGetVolumeRequest { volume_id: id.into() }).await.unwrap();
            r.into_inner().status.unwrap().volume_condition.unwrap()
        })
    };
    let v1 = create(&mut c, "pvc-rel-1").unwrap();
    let d1 = drive_of_volume(&agent, &v1);
    let (ok, out) = ctl(&agent, &["drive", "release", "no-such-drive"]);
    assert!(!ok && out.contains("no drive with id"), "{out}");

    // Release with a volume on it: releasing, the volume says so, new volumes go elsewhere.
    let (ok, out) = ctl(&agent, &["drive", "release", &d1]);
    assert!(ok && out.contains("releasing"), "{out}");
    assert_eq!(usage_of(&agent, &d1).as_deref(), Some("releasing"));
    let cond = condition(&mut c, &v1);
    assert!(cond.abnormal && cond.message.contains("releasing"), "{}", cond.message);
    for i in 0..3 {
        let v = create(&mut c, &format!("pvc-rel-other-{i}")).unwrap();
        assert_ne!(drive_of_volume(&agent, &v), d1, "no new volume on a releasing drive");
    }
    let (_, table) = ctl(&agent, &["drives"]);
    assert!(table.contains("USAGE") && table.contains("releasing"), "{table}");

    // Its last volume deleted: released.
    rt.block_on(async { c.ctrl.delete_volume(csi::DeleteVolumeRequest { volume_id: v1.clone(), ..Default::default() }).await.unwrap() });
    assert_eq!(usage_of(&agent, &d1).as_deref(), Some("released"));

    // Pulled: forgotten. Put back (empty), it is a managed, active drive again.
    let file = a.file.clone();
    a.detach();
    wait("the pulled drive to vanish", || usage_of(&agent, &d1).is_none());
    a.dev = sh("losetup", &["--find", "--show", "--partscan", file.to_str().unwrap()]).into();
    wait("the drive put back to be active", || usage_of(&agent, &d1).as_deref() == Some("active"));
    let v2 = create(&mut c, "pvc-rel-2").unwrap();
    let _ = v2;

    // A forced release fails the volumes left on the drive.
    let other = drive_of_volume(&agent, &create(&mut c, "pvc-rel-3").unwrap());
    let on_other: Vec<String> = ["pvc-rel-other-0", "pvc-rel-other-1", "pvc-rel-other-2", "pvc-rel-3"]
        .iter()
        .map(|n| drivelet::disk::gpt::volume_partition_guid(n).to_string())
        .filter(|id| drive_of_volume(&agent, id) == other)
        .collect();
    assert!(!on_other.is_empty());
    let (ok, out) = ctl(&agent, &["drive", "release", &other, "--force"]);
    assert!(ok && out.contains("released"), "{out}");
    for id in &on_other {
        let cond = condition(&mut c, id);
        assert!(cond.abnormal && cond.message.contains("volume failed"), "{}", cond.message);
    }
}

#[test]
fn a_cordoned_drive_takes_no_new_volumes_serves_its_own_and_is_uncordoned_and_kept_over_a_restart() {
    require_host();
    let tmp = short_tempdir();
    let _a = LoopDrive::new(tmp.path(), "a.img", GIB);
    let _b = LoopDrive::new(tmp.path(), "b.img", GIB);
    sh("udevadm", &["settle"]);
    let mut agent = Agent::start(tmp.path(), AgentOpts::default());
    let rt = rt();
    let mut c = rt.block_on(Csi::connect(&agent));
    let create = |c: &mut Csi, name: &str| {
        rt.block_on(async {
            c.ctrl.create_volume(create_req(name, 16 * MIB, block_cap())).await.map(|r| r.into_inner().volume.unwrap().volume_id)
        })
    };
    let v1 = create(&mut c, "pvc-cordon-1").unwrap();
    let d1 = drive_of_volume(&agent, &v1);
    let (ok, out) = ctl(&agent, &["drive", "cordon", "no-such-drive"]);
    assert!(!ok && out.contains("no drive with id"), "{out}");

    let (ok, out) = ctl(&agent, &["drive", "cordon", &d1]);
    assert!(ok && out.contains("cordoned"), "{out}");
    assert_eq!(usage_of(&agent, &d1).as_deref(), Some("cordoned"));
    let (ok, out) = ctl(&agent, &["drive", "cordon", &d1]);
    assert!(ok && out.contains("cordoned"), "a repeat is no error: {out}");
    for i in 0..3 {
        let v = create(&mut c, &format!("pvc-cordon-other-{i}")).unwrap();
        assert_ne!(drive_of_volume(&agent, &v), d1, "no new volume on a cordoned drive");
    }
    // Its own volume stays well and may be attached.
    let cond = rt.block_on(async {
        let r = c.ctrl.controller_get_volume(csi::ControllerGetVolumeRequest { volume_id: v1.clone() }).await.unwrap();
        r.into_inner().status.unwrap().volume_condition.unwrap()
    });
    assert!(!cond.abnormal, "a cordoned drive's volume is normal: {}", cond.message);

    // Kept over a restart.
    drop(c);
    agent.stop();
    agent.spawn();
    assert_eq!(usage_of(&agent, &d1).as_deref(), Some("cordoned"));

    let (ok, out) = ctl(&agent, &["drive", "uncordon", &d1]);
    assert!(ok && out.contains("active"), "{out}");
    assert_eq!(usage_of(&agent, &d1).as_deref(), Some("active"));
    // An uncordon does not undo a release.
    let (ok, _) = ctl(&agent, &["drive", "release", &d1]);
    assert!(ok);
    let (ok, out) = ctl(&agent, &["drive", "uncordon", &d1]);
    assert!(ok && out.contains("releasing"), "{out}");
}
