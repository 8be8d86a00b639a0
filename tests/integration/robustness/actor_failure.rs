//! Actor failures: each supervised actor (drive inventory, volume manager, health
//! poller) is made to fail once while volume lifecycles run, and the service carries on.
//!
//! The failures come from fail points compiled in with the `failpoints` feature and
//! armed with `1*return`, so each fires once: `actor.inventory.stop` while answering
//! ListDrives (armed through the admin socket when its turn comes, since the volume
//! manager and the health poller ask for the drives from the start; `ctl drives` then
//! asks), `actor.volumes.stop` while answering ControllerGetVolume (ListVolumes reads
//! the manager's published view, no message), `actor.health.stop` at a
//! volume check cycle (every second here). The actor stops itself, as an actor
//! that fails does; a panic would not do: the actor's task would die with it and its
//! supervisor never restart it (src/actors/supervisor.rs has the test that shows it).
//!
//! Rules checked:
//! - each failure is followed by the actor's `restarting` line in the log;
//! - a lifecycle thread keeps creating, staging, publishing, writing, reading,
//!   unpublishing, unstaging and deleting volumes throughout; a call cut short by a
//!   restart is answered UNAVAILABLE or ABORTED and succeeds when retried; no other
//!   error is allowed;
//! - afterwards Probe says ready, ListVolumes answers and lists the volume made before
//!   the failures, whose published data still reads back, and a new volume is
//!   created, staged, published and written;
//! - at the end nothing is left (no kernel partition, no GPT entry, no mount, no
//!   record), the agent stops cleanly and its log has no panic.
//!
//! Needs the `failpoints` feature; without it the test fails and says so.
#![allow(clippy::assertions_on_constants)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use drivelet::grpc::proto::csi;
use tonic::{Code, Status};

/// Each actor's `restarting` log line, and the call (if any) that makes it fail.
const ACTORS: &[(&str, &str)] = &[
    ("actor.inventory.stop", "restarting: rebuilding the drive set from udev"),
    ("actor.volumes.stop", "restarting: rebuilding volumes from the store, the drives and the mounts"),
    ("actor.health.stop", "restarting the health poller"),
];

/// How long a retried call may keep failing with a retryable code.
const RETRY_FOR: Duration = Duration::from_secs(60);

/// Runs `f` against the agent (fresh connection) until it is answered with anything but
/// UNAVAILABLE or ABORTED; those are retried for [`RETRY_FOR`].
fn retried<T>(agent: &Agent, what: &str, f: impl Fn(Csi) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, Status>>>>) -> T {
    let deadline = Instant::now() + RETRY_FOR;
    loop {
        let res = rt().block_on(async {
            let c = match channel(&agent.csi_socket).await {
                Ok(ch) => Csi {
                    ctrl: csi::controller_client::ControllerClient::new(ch.clone()),
                    node: csi::node_client::NodeClient::new(ch.clone()),
                    id: csi::identity_client::IdentityClient::new(ch),
                },
                Err(e) => return Err(Status::unavailable(e.to_string())),
            };
            tokio::time::timeout(Duration::from_secs(60), f(c)).await.unwrap_or_else(|_| Err(Status::deadline_exceeded("hung for 60s")))
        });
        match res {
            Ok(v) => return v,
            Err(s) if matches!(s.code(), Code::Unavailable | Code::Aborted) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(s) => panic!("{what} failed with {:?}: {}; log:\n{}", s.code(), s.message(), agent.log_tail(40)),
        }
    }
}

/// Paths of one volume.
struct Paths {
    staging: PathBuf,
    target: PathBuf,
}

fn paths(kubelet: &Path, name: &str) -> Paths {
    let staging = kubelet.join("plugins/stage").join(name);
    let target = kubelet.join("pods").join(name).join("volumes/v");
    std::fs::create_dir_all(&staging).unwrap();
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    Paths { staging, target }
}

/// Creates, stages and publishes an ext4 volume and writes `text` to it; its id.
fn bring_up(agent: &Agent, name: &str, p: &Paths, text: &str) -> String {
    let n = name.to_string();
    let id = retried(agent, &format!("CreateVolume {name}"), move |mut c| {
        let n = n.clone();
        Box::pin(async move { Ok(c.ctrl.create_volume(create_req(&n, 64 * MIB, mount_cap("ext4"))).await?.into_inner().volume.unwrap_or_default().volume_id) })
    });
    let (i, s, t) = (id.clone(), p.staging.clone(), p.target.clone());
    retried(agent, &format!("NodeStageVolume {name}"), move |mut c| {
        let (i, s) = (i.clone(), s.clone());
        Box::pin(async move { c.node.node_stage_volume(stage_req(&i, &s, mount_cap("ext4"))).await.map(drop) })
    });
    let (i, s2) = (id.clone(), p.staging.clone());
    retried(agent, &format!("NodePublishVolume {name}"), move |mut c| {
        let (i, s, t) = (i.clone(), s2.clone(), t.clone());
        Box::pin(async move { c.node.node_publish_volume(publish_req(&i, &s, &t, mount_cap("ext4"), false)).await.map(drop) })
    });
    std::fs::write(p.target.join("data.txt"), text).unwrap_or_else(|e| panic!("write to {name}: {e}"));
    id
}

/// Unpublishes, unstages and deletes a volume.
fn tear_down(agent: &Agent, name: &str, id: &str, p: &Paths) {
    let (i, t) = (id.to_string(), p.target.display().to_string());
    retried(agent, &format!("NodeUnpublishVolume {name}"), move |mut c| {
        let req = csi::NodeUnpublishVolumeRequest { volume_id: i.clone(), target_path: t.clone() };
        Box::pin(async move { c.node.node_unpublish_volume(req).await.map(drop) })
    });
    let (i, s) = (id.to_string(), p.staging.display().to_string());
    retried(agent, &format!("NodeUnstageVolume {name}"), move |mut c| {
        let req = csi::NodeUnstageVolumeRequest { volume_id: i.clone(), staging_target_path: s.clone() };
        Box::pin(async move { c.node.node_unstage_volume(req).await.map(drop) })
    });
    let i = id.to_string();
    retried(agent, &format!("DeleteVolume {name}"), move |mut c| {
        let req = csi::DeleteVolumeRequest { volume_id: i.clone(), ..Default::default() };
        Box::pin(async move { c.ctrl.delete_volume(req).await.map(drop) })
    });
}

/// Waits up to `within` for `line` to appear in the agent's log `times` times.
fn wait_for_log(agent: &Agent, line: &str, times: usize, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if agent.logs().matches(line).count() >= times {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Waits up to 30 s for Probe to say ready.
fn wait_probe_ready(agent: &Agent, after: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = rt().block_on(async {
            let ch = channel(&agent.csi_socket).await.ok()?;
            csi::identity_client::IdentityClient::new(ch).probe(csi::ProbeRequest {}).await.ok()?.into_inner().ready
        });
        if ready == Some(true) {
            return;
        }
        assert!(Instant::now() < deadline, "Probe not ready 30 s after {after}; log:\n{}", agent.log_tail(40));
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn each_actor_failing_once_mid_lifecycle_is_restarted_and_the_service_carries_on() {
    assert!(cfg!(feature = "failpoints"), "actor failure tests need `--features failpoints`; scripts/test.sh passes it");
    require_host();
    let tmp = short_tempdir();
    let drive = LoopDrive::new(tmp.path(), "a.img", 2 * GIB);
    sh("udevadm", &["settle"]);
    let kubelet = tmp.path().join("kubelet");
    let _unmount = Unmounter(tmp.path().to_path_buf());
    let armed: Vec<String> =
        ACTORS.iter().filter(|(p, _)| *p != "actor.inventory.stop").map(|(p, _)| format!("{p}=1*return")).collect();
    let opts = AgentOpts { extra_toml: "[health]\nvolume_check_interval = \"1s\"\n".into(), ..Default::default() };
    let agent = Agent::start_with(tmp.path(), opts, &[("FAILPOINTS", &armed.join(";"))]);
    let binary_has_points = std::process::Command::new("grep").args(["-q", "-a", "-F", "actor.volumes.stop", bin()]).status().expect("grep");
    assert!(binary_has_points.success(), "{} has no fail points compiled in: rebuild with `--features failpoints`", bin());
    let agent = Arc::new(agent);

    // A volume that lives through every failure.
    let kept = paths(&kubelet, "kept");
    let kept_id = bring_up(&agent, "pvc-kept", &kept, "written before the failures");

    // Lifecycles run throughout.
    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicUsize::new(0));
    let churn = {
        let (agent, stop, cycles, kubelet) = (agent.clone(), stop.clone(), cycles.clone(), kubelet.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                let name = format!("pvc-churn-{n}");
                let p = paths(&kubelet, &name);
                let text = format!("churn {n}");
                let id = bring_up(&agent, &name, &p, &text);
                let back = std::fs::read_to_string(p.target.join("data.txt")).unwrap_or_else(|e| panic!("{name}: read back: {e}"));
                assert_eq!(back, text, "{name}: data read back");
                tear_down(&agent, &name, &id, &p);
                cycles.fetch_add(1, Ordering::SeqCst);
                n += 1;
            }
        })
    };

    // The inventory fails while answering ListDrives, the volume manager while
    // answering ListVolumes, the health poller at its next volume check.
    let capacity = |what: &str| {
        retried(&agent, what, |mut c| Box::pin(async move { c.ctrl.get_capacity(csi::GetCapacityRequest::default()).await.map(drop) }))
    };
    let list = |what: &str| -> Vec<String> {
        retried(&agent, what, |mut c| {
            Box::pin(async move {
                let r = c.ctrl.list_volumes(csi::ListVolumesRequest::default()).await?.into_inner();
                Ok(r.entries.into_iter().filter_map(|e| e.volume).map(|v| v.volume_id).collect())
            })
        })
    };
    for (point, line) in ACTORS {
        let before = cycles.load(Ordering::SeqCst);
        while cycles.load(Ordering::SeqCst) == before && !churn.is_finished() {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(150));
        match *point {
            "actor.inventory.stop" => {
                agent.arm(point, "1*return");
                agent.ctl_drives();
            }
            "actor.volumes.stop" => {
                let id = kept_id.clone();
                retried(&agent, "ControllerGetVolume (the volume manager fails)", move |mut c| {
                    let volume_id = id.clone();
                    Box::pin(async move { c.ctrl.controller_get_volume(csi::ControllerGetVolumeRequest { volume_id }).await.map(drop) })
                })
            }
            _ => {}
        }
        assert!(
            wait_for_log(&agent, line, 1, Duration::from_secs(20)),
            "{point}: no {line:?} in the log within 20 s; log:\n{}",
            agent.log_tail(40)
        );
        assert!(agent.logs().contains("failure injected"), "{point}: the injected failure is not logged");
        wait_probe_ready(&agent, &format!("{point} fired"));
        // Each point fires once: the actor answers from now on.
        capacity("GetCapacity after the failure");
        assert!(list("ListVolumes after the failure").contains(&kept_id), "{point}: ListVolumes lost the kept volume");
    }
    // The lifecycles went on after the last failure, then stop.
    let before = cycles.load(Ordering::SeqCst);
    while cycles.load(Ordering::SeqCst) < before + 2 && !churn.is_finished() {
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::SeqCst);
    if let Err(e) = churn.join() {
        let msg = e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
        panic!("the lifecycle thread failed: {msg}");
    }
    assert!(cycles.load(Ordering::SeqCst) >= 5, "lifecycles ran: {}", cycles.load(Ordering::SeqCst));
    for (point, line) in ACTORS {
        assert_eq!(agent.logs().matches(line).count(), 1, "{point}: the actor restarted once, not {} times", agent.logs().matches(line).count());
    }

    // The service carries on.
    wait_probe_ready(&agent, "the failures");
    assert!(list("ListVolumes at the end").contains(&kept_id), "ListVolumes lists the volume made before the failures");
    let back = std::fs::read_to_string(kept.target.join("data.txt")).expect("the kept volume's data");
    assert_eq!(back, "written before the failures");
    let fresh = paths(&kubelet, "fresh");
    let fresh_id = bring_up(&agent, "pvc-fresh", &fresh, "written after the failures");
    assert_eq!(std::fs::read_to_string(fresh.target.join("data.txt")).unwrap(), "written after the failures");
    tear_down(&agent, "pvc-fresh", &fresh_id, &fresh);
    tear_down(&agent, "pvc-kept", &kept_id, &kept);

    // Nothing is left.
    assert!(kernel_parts(&drive.dev).is_empty(), "kernel partitions left: {:?}", kernel_parts(&drive.dev));
    assert!(gpt_entries(&drive.dev).is_empty(), "GPT entries left: {:?}", gpt_entries(&drive.dev));
    assert!(mounts_under(tmp.path()).is_empty(), "mounts left: {:?}", mounts_under(tmp.path()));
    let ids = agent.ctl_volume_ids().expect("`drivelet ctl volumes`");
    assert!(ids.is_empty(), "volume records left: {ids:?}");
    // What the restarts looked like, for the record (`--nocapture`).
    for l in agent.logs().lines().filter(|l| ["restarting", "failure injected", "reconciliation", "first drive scan", "manager ready"].iter().any(|w| l.contains(w))) {
        println!("{l}");
    }
    let mut agent = Arc::try_unwrap(agent).unwrap_or_else(|_| panic!("the agent is still shared"));
    assert_eq!(agent.stop(), 0, "the agent stops cleanly; log:\n{}", agent.log_tail(40));
    assert!(!agent.logs().contains("panicked"), "the agent's log has a panic:\n{}", agent.log_tail(80));
}
