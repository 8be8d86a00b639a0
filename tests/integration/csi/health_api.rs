//! Conformance of the CSI v1.13 health API (ControllerGetVolumeHealth,
//! ControllerListVolumeHealth, NodeGetVolumeHealth, NodeGetStorageHealth) served beside
//! v1.12's volume conditions, through the real binary on loop drives:
//! - the four capabilities are advertised (at their upstream enum values) next to
//!   VOLUME_CONDITION and GET_VOLUME only with `driver.advertise_volume_health`, and
//!   every RPC behind them is served either way;
//! - empty ids are INVALID_ARGUMENT, unknown ids NOT_FOUND, bad optional paths
//!   INVALID_ARGUMENT;
//! - ControllerListVolumeHealth lists only unhealthy volumes, pages by `max_entries`
//!   with tokens, and answers ABORTED to a malformed token or one from before a
//!   restart;
//! - a detached drive shows in both generations from the same event, within a second
//!   (once v1.12 says abnormal in ControllerGetVolume and ListVolumes, v1.13 says
//!   INACCESSIBLE/DriveMissing at the next call), NodeGetStorageHealth reports the drive
//!   STORAGE_UNREACHABLE, and re-attaching it clears all three and its volumes serve
//!   again (an ext4 volume stages); this is the one home of that behaviour;
//! - a SUSPECT drive is DEGRADED/DriveSuspect, a BAD one DATA_LOSS/DriveFailed and
//!   STORAGE_DEGRADED; an unmounted target is INACCESSIBLE/MountLost.
//!
//! Latency is measured by `benches/removal_latency.rs`, not here.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::*;
use drivelet::grpc::proto::csi;
use tonic::Code;

/// SMART thresholds such that the reallocated/pending fixture is SUSPECT rather than BAD.
const MORE: &str = "[health.smart]\nreallocated_sectors_bad = 100000\npending_sectors_bad = 100000";

fn start(dir: &Path) -> (Agent, SmartStandIn) {
    start_health_agent(dir, MORE)
}

async fn create(c: &mut Csi, name: &str, bytes: u64, cap: csi::VolumeCapability) -> (String, String) {
    let v = c.ctrl.create_volume(create_req(name, bytes, cap)).await.unwrap_or_else(|e| panic!("create {name}: {e:?}"));
    let v = v.into_inner().volume.unwrap();
    (v.volume_id, v.volume_context["drivelet.io/drive"].clone())
}

/// (status, reason) pairs of a volume health.
fn kinds(h: &csi::VolumeHealth) -> Vec<(csi::VolumeHealthErrorType, String)> {
    h.health_statuses.iter().map(|e| (e.status(), e.reason.clone())).collect()
}

async fn ctrl_health(c: &mut Csi, id: &str) -> csi::VolumeHealth {
    c.ctrl
        .controller_get_volume_health(csi::ControllerGetVolumeHealthRequest { volume_id: id.into(), ..Default::default() })
        .await
        .unwrap_or_else(|e| panic!("ControllerGetVolumeHealth {id}: {e:?}"))
        .into_inner()
        .volume_health
        .expect("volume_health is REQUIRED")
}

async fn node_health(c: &mut Csi, id: &str) -> csi::VolumeHealth {
    c.node
        .node_get_volume_health(csi::NodeGetVolumeHealthRequest { volume_id: id.into(), ..Default::default() })
        .await
        .unwrap_or_else(|e| panic!("NodeGetVolumeHealth {id}: {e:?}"))
        .into_inner()
        .volume_health
        .expect("volume_health is REQUIRED")
}

async fn condition(c: &mut Csi, id: &str) -> csi::VolumeCondition {
    let r = c.ctrl.controller_get_volume(csi::ControllerGetVolumeRequest { volume_id: id.into() }).await.unwrap().into_inner();
    r.status.and_then(|s| s.volume_condition).expect("ControllerGetVolume carries the v1.12 condition")
}

async fn storage(c: &mut Csi) -> Vec<(csi::StorageHealthErrorType, String, String)> {
    let r = c.node.node_get_storage_health(csi::NodeGetStorageHealthRequest::default()).await.expect("NodeGetStorageHealth").into_inner();
    r.backend_health.into_iter().map(|e| (e.status(), e.reason.clone(), e.message)).collect()
}

/// Polls until the controller's v1.13 health of `id` satisfies `want`.
async fn wait_health(c: &mut Csi, agent: &Agent, id: &str, what: &str, want: impl Fn(&csi::VolumeHealth) -> bool) -> csi::VolumeHealth {
    let t0 = Instant::now();
    loop {
        let h = ctrl_health(c, id).await;
        if want(&h) {
            return h;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "volume {id}: no health {what} within 10 s; last {h:?}\nlog:\n{}", agent.log_tail(40));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The whole ControllerListVolumeHealth, `max` per page; the ids per page.
async fn list_all(c: &mut Csi, max: i32) -> Vec<Vec<csi::VolumeHealth>> {
    let mut pages = Vec::new();
    let mut token = String::new();
    loop {
        let r = c
            .ctrl
            .controller_list_volume_health(csi::ControllerListVolumeHealthRequest { max_entries: max, starting_token: token, ..Default::default() })
            .await
            .expect("ControllerListVolumeHealth")
            .into_inner();
        assert!(max == 0 || r.entries.len() <= max as usize, "a page holds at most max_entries: {}", r.entries.len());
        pages.push(r.entries);
        if r.next_token.is_empty() {
            return pages;
        }
        assert!(pages.len() < 100, "paging does not end");
        token = r.next_token;
    }
}

/// `drivelet csi --endpoint SOCKET ARGS...`: its plain-words output (must succeed).
fn cli(agent: &Agent, args: &[&str]) -> String {
    let sock = agent.csi_socket.display().to_string();
    let out = std::process::Command::new(bin()).args(["csi", "--endpoint", sock.as_str()]).args(args).output().unwrap();
    assert!(out.status.success(), "csi {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let plain = !args.contains(&"-o");
    for debug in ["Some(", "r#type", "{", "VolumeHealthEntry"].into_iter().filter(|d| plain || *d != "{") {
        assert!(!text.contains(debug), "Debug output {debug:?} in:\n{text}");
    }
    text
}

/// The v1.13 health capabilities a running agent advertises: (controller, node).
async fn health_capabilities(c: &mut Csi) -> (Vec<csi::controller_service_capability::rpc::Type>, Vec<csi::node_service_capability::rpc::Type>) {
    use csi::controller_service_capability::{rpc::Type as CR, Type as CT};
    use csi::node_service_capability::{rpc::Type as NR, Type as NT};
    let cc = c.ctrl.controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {}).await.unwrap().into_inner();
    let ctrl: Vec<CR> = cc
        .capabilities
        .iter()
        .filter_map(|c| match &c.r#type {
            Some(CT::Rpc(r)) => CR::try_from(r.r#type).ok(),
            _ => None,
        })
        .collect();
    let nc = c.node.node_get_capabilities(csi::NodeGetCapabilitiesRequest {}).await.unwrap().into_inner();
    let node: Vec<NR> = nc
        .capabilities
        .iter()
        .filter_map(|c| match &c.r#type {
            Some(NT::Rpc(r)) => NR::try_from(r.r#type).ok(),
            _ => None,
        })
        .collect();
    (ctrl, node)
}

/// Each v1.13 RPC is served, advertised or not: a healthy volume has no entry, the
/// node's healthy drive no storage entry.
async fn health_rpcs_are_served(c: &mut Csi, name: &str) {
    let (id, _) = create(c, name, 16 * MIB, block_cap()).await;
    let h = ctrl_health(c, &id).await;
    assert_eq!((h.volume_id.as_str(), h.health_statuses.len()), (id.as_str(), 0), "healthy: {h:?}");
    let h = node_health(c, &id).await;
    assert_eq!((h.volume_id.as_str(), h.health_statuses.len()), (id.as_str(), 0), "healthy on the node: {h:?}");
    let pages = list_all(c, 0).await;
    assert!(pages.concat().is_empty(), "no unhealthy volume is listed: {pages:?}");
    assert!(storage(c).await.is_empty(), "a healthy drive is no storage condition");
    // And v1.12 still says the same in its own words.
    assert!(!condition(c, &id).await.abnormal);
}

#[test]
fn the_health_capabilities_are_advertised_at_their_upstream_values_when_asked_and_served() {
    require_host();
    let tmp = short_tempdir();
    let _a = LoopDrive::new(tmp.path(), "a.img", 256 * MIB);
    std::fs::create_dir_all(tmp.path().join("kubelet")).unwrap();
    let smart = SmartStandIn::install(tmp.path());
    let agent = Agent::start_with(tmp.path(), health_opts(&smart, MORE), &[("DRIVELET__DRIVER__ADVERTISE_VOLUME_HEALTH", "true")]);
    rt().block_on(async {
        let mut c = Csi::connect(&agent).await;
        use csi::controller_service_capability::rpc::Type as CR;
        use csi::node_service_capability::rpc::Type as NR;
        // The numbers CSI v1.13 gives them (proto/csi.proto says where they come from).
        assert_eq!((CR::VolumeCondition as i32, CR::GetVolume as i32, CR::ListVolumeHealth as i32, CR::GetVolumeHealth as i32), (11, 12, 16, 17));
        assert_eq!((NR::VolumeCondition as i32, NR::GetVolumeHealth as i32, NR::GetStorageHealth as i32), (4, 7, 8));
        let (ctrl, node) = health_capabilities(&mut c).await;
        for t in [CR::ListVolumeHealth, CR::GetVolumeHealth, CR::VolumeCondition, CR::GetVolume] {
            assert!(ctrl.contains(&t), "controller capabilities {ctrl:?} lack {t:?}");
        }
        for t in [NR::GetVolumeHealth, NR::GetStorageHealth, NR::VolumeCondition, NR::GetVolumeStats] {
            assert!(node.contains(&t), "node capabilities {node:?} lack {t:?}");
        }
        health_rpcs_are_served(&mut c, "cap-vol").await;
    });
}

#[test]
fn by_default_the_health_capabilities_are_not_advertised_but_their_rpcs_are_served() {
    require_host();
    let tmp = short_tempdir();
    let _a = LoopDrive::new(tmp.path(), "a.img", 256 * MIB);
    let (agent, _smart) = start(tmp.path());
    rt().block_on(async {
        let mut c = Csi::connect(&agent).await;
        use csi::controller_service_capability::rpc::Type as CR;
        use csi::node_service_capability::rpc::Type as NR;
        let (ctrl, node) = health_capabilities(&mut c).await;
        for t in [CR::ListVolumeHealth, CR::GetVolumeHealth] {
            assert!(!ctrl.contains(&t), "controller capabilities {ctrl:?} advertise {t:?} by default");
        }
        for t in [NR::GetVolumeHealth, NR::GetStorageHealth] {
            assert!(!node.contains(&t), "node capabilities {node:?} advertise {t:?} by default");
        }
        // CSI v1.12's own health words stay advertised: they are what Kubernetes reads.
        assert!(ctrl.contains(&CR::VolumeCondition) && ctrl.contains(&CR::GetVolume), "controller: {ctrl:?}");
        assert!(node.contains(&NR::VolumeCondition) && node.contains(&NR::GetVolumeStats), "node: {node:?}");
        health_rpcs_are_served(&mut c, "cap-vol").await;
    });
}

#[test]
fn empty_ids_are_invalid_unknown_ids_not_found_and_bad_paths_invalid() {
    require_host();
    let tmp = short_tempdir();
    let _a = LoopDrive::new(tmp.path(), "a.img", 256 * MIB);
    let (agent, _smart) = start(tmp.path());
    rt().block_on(async {
        let mut c = Csi::connect(&agent).await;
        let (id, _) = create(&mut c, "ids-vol", 16 * MIB, block_cap()).await;
        let unknown = "0b1d4c3e-0000-4000-8000-000000000000";
        let cg = |v: &str| csi::ControllerGetVolumeHealthRequest { volume_id: v.into(), ..Default::default() };
        let ng = |v: &str| csi::NodeGetVolumeHealthRequest { volume_id: v.into(), ..Default::default() };
        let code = |r: Result<tonic::Response<csi::ControllerGetVolumeHealthResponse>, tonic::Status>| r.map(drop).unwrap_err().code();
        assert_eq!(code(c.ctrl.controller_get_volume_health(cg("")).await), Code::InvalidArgument);
        assert_eq!(code(c.ctrl.controller_get_volume_health(cg(unknown)).await), Code::NotFound);
        assert_eq!(code(c.ctrl.controller_get_volume_health(cg(&"x".repeat(200))).await), Code::InvalidArgument, "an id over 128 bytes");
        let ncode = |r: Result<tonic::Response<csi::NodeGetVolumeHealthResponse>, tonic::Status>| r.map(drop).unwrap_err().code();
        assert_eq!(ncode(c.node.node_get_volume_health(ng("")).await), Code::InvalidArgument);
        assert_eq!(ncode(c.node.node_get_volume_health(ng(unknown)).await), Code::NotFound);
        let bad_path = csi::NodeGetVolumeHealthRequest { volume_id: id.clone(), volume_publish_path: "relative/t".into(), ..Default::default() };
        assert_eq!(ncode(c.node.node_get_volume_health(bad_path).await), Code::InvalidArgument);
        let long_path = csi::NodeGetVolumeHealthRequest { volume_id: id.clone(), staging_target_path: format!("/{}", "s".repeat(5000)), ..Default::default() };
        let e = c.node.node_get_volume_health(long_path).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().len() < 200, "the reply does not repeat a 5000-byte path: {}", e.message().len());
        // Paths the volume was never staged or published at are fine: the CO may ask
        // about a volume whose staging failed.
        let kubelet = tmp.path().join("kubelet");
        let never = csi::NodeGetVolumeHealthRequest {
            volume_id: id.clone(),
            volume_publish_path: kubelet.join("pods/p/volumes/never").display().to_string(),
            staging_target_path: kubelet.join("plugins/never").display().to_string(),
        };
        let h = c.node.node_get_volume_health(never).await.expect("NodeGetVolumeHealth of an unstaged volume").into_inner();
        assert_eq!(h.volume_health.map(|h| h.health_statuses.len()), Some(0));
        // Negative max_entries and malformed tokens.
        let list = |max: i32, token: &str| csi::ControllerListVolumeHealthRequest { max_entries: max, starting_token: token.into(), ..Default::default() };
        assert_eq!(c.ctrl.controller_list_volume_health(list(-1, "")).await.unwrap_err().code(), Code::InvalidArgument);
        for t in ["garbage", "ffff:", &"z".repeat(5000)] {
            let e = c.ctrl.controller_list_volume_health(list(1, t)).await.unwrap_err();
            assert_eq!(e.code(), Code::Aborted, "token {:?}", &t[..t.len().min(20)]);
        }
    });
}

#[test]
fn a_detached_drive_shows_in_both_generations_within_a_second_pages_in_the_list_and_heals_when_it_returns() {
    require_host();
    let tmp = short_tempdir();
    let _u = Unmounter(tmp.path().to_path_buf());
    // Best fit puts the small volumes on the small drive A; the large one goes to B.
    let mut a = LoopDrive::new(tmp.path(), "a.img", 256 * MIB);
    let _b = LoopDrive::new(tmp.path(), "b.img", GIB);
    let (mut agent, _smart) = start(tmp.path());
    let ida = drive_id_of(&agent, &a);
    let rt = rt();
    let (on_a, healthy, fs_vol) = rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        let mut on_a = Vec::new();
        // Four block volumes and one ext4 volume, which must stage again once the drive
        // is back.
        let mut fs_vol = String::new();
        for i in 0..5 {
            let cap = if i == 4 { mount_cap("ext4") } else { block_cap() };
            let (id, drive) = create(&mut c, &format!("page-{i}"), 16 * MIB, cap).await;
            assert_eq!(drive, ida, "page-{i} lands on the small drive");
            if i == 4 {
                fs_vol = id.clone();
            }
            on_a.push(id);
        }
        let (healthy, drive) = create(&mut c, "page-big", 512 * MIB, block_cap()).await;
        assert_ne!(drive, ida);
        on_a.sort();

        // The drive goes away (nothing is staged: losetup -d is a real removal).
        let gone = Instant::now();
        a.detach();
        let first = on_a[0].clone();
        let (v12, v13) = loop {
            let cond = condition(&mut c, &first).await;
            if cond.abnormal {
                // Same event, same model: the very next v1.13 call says so too.
                break (gone.elapsed(), (cond, ctrl_health(&mut c, &first).await));
            }
            assert!(gone.elapsed() < Duration::from_secs(10), "the removal was not seen within 10 s\nlog:\n{}", agent.log_tail(40));
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let (cond, h) = v13;
        println!("drive detached -> v1.12 abnormal after {v12:?}; v1.13 at the next call: {:?}", kinds(&h));
        assert!(v12 < Duration::from_secs(1), "the condition took {v12:?} (limit 1s): {:?}", cond.message);
        let lc = listed_condition(&listed(&mut c, &first).await);
        assert!(lc.abnormal && lc.message.contains(&ida), "ListVolumes names the missing drive: {lc:?}");
        assert_eq!(kinds(&h), vec![(csi::VolumeHealthErrorType::Inaccessible, "DriveMissing".to_string())], "{h:?}");
        assert_eq!(h.health_statuses[0].message, cond.message, "one finding, one message in both generations");
        assert!(cond.message.contains(&ida) && cond.message.contains("missing"), "{cond:?}");
        assert_eq!(kinds(&node_health(&mut c, &first).await), kinds(&h), "the node says the same");

        // Only the five unhealthy volumes are listed, in pages of two.
        for id in &on_a {
            wait_health(&mut c, &agent, id, "DriveMissing", |h| !h.health_statuses.is_empty()).await;
        }
        let pages = list_all(&mut c, 2).await;
        let sizes: Vec<usize> = pages.iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![2, 2, 1], "five unhealthy volumes in pages of two");
        let listed: Vec<String> = pages.concat().iter().map(|h| h.volume_id.clone()).collect();
        assert_eq!(listed, on_a, "each unhealthy volume once, in id order; the healthy one left out");
        for h in pages.concat() {
            assert_eq!(kinds(&h), vec![(csi::VolumeHealthErrorType::Inaccessible, "DriveMissing".to_string())]);
        }
        assert_eq!(list_all(&mut c, 0).await.concat().len(), 5, "max_entries 0 is all");
        assert_eq!(list_all(&mut c, 100).await.len(), 1, "one page when it all fits");
        assert!(ctrl_health(&mut c, &healthy).await.health_statuses.is_empty(), "B's volume is healthy");

        // The node's storage: A unreachable, with its five volumes.
        let st = storage(&mut c).await;
        assert_eq!(st.len(), 1, "{st:?}");
        assert_eq!((st[0].0, st[0].1.as_str()), (csi::StorageHealthErrorType::StorageUnreachable, "DriveMissing"));
        assert!(st[0].2.contains(&ida) && st[0].2.contains("5 volumes"), "{:?}", st[0].2);

        // The same in plain words from `drivelet csi`.
        let all = cli(&agent, &["health"]);
        assert!(all.contains("summary: 5 volumes have an adverse condition\n"), "{all}");
        assert!(on_a.iter().all(|id| all.contains(id.as_str())) && !all.contains(healthy.as_str()), "{all}");
        let one = cli(&agent, &["health", &on_a[0]]);
        for want in ["healthy: false\n", "reason: DriveMissing\n", "status: INACCESSIBLE\n", "is missing from this node"] {
            assert!(one.contains(want), "{want:?} not in:\n{one}");
        }
        assert_eq!(cli(&agent, &["health", "--node", &on_a[0]]), one, "the node's view is the same");
        let sh = cli(&agent, &["storage-health"]);
        for want in ["healthy: false\n", "status: STORAGE_UNREACHABLE\n", "reason: DriveMissing\n"] {
            assert!(sh.contains(want), "{want:?} not in:\n{sh}");
        }
        let json: serde_json::Value = serde_json::from_str(&cli(&agent, &["-o", "json", "health", &healthy])).unwrap();
        assert_eq!((json["healthy"].as_bool(), json["conditions"].as_array().map(Vec::len)), (Some(true), Some(0)), "{json}");
        (on_a, healthy, fs_vol)
    });

    // A token from before a restart is stale: ABORTED, list again from the start.
    let stale = rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        let r = c
            .ctrl
            .controller_list_volume_health(csi::ControllerListVolumeHealthRequest { max_entries: 2, ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        assert!(!r.next_token.is_empty());
        r.next_token
    });
    assert_eq!(agent.stop(), 0);
    agent.spawn();
    rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        let e = c
            .ctrl
            .controller_list_volume_health(csi::ControllerListVolumeHealthRequest { max_entries: 2, starting_token: stale, ..Default::default() })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Aborted, "{e:?}");
        assert!(e.message().contains("list again"), "{}", e.message());
        let listed: Vec<String> = list_all(&mut c, 2).await.concat().iter().map(|h| h.volume_id.clone()).collect();
        assert_eq!(listed, on_a, "after the restart the missing drive's volumes are still listed");

        // The drive comes back: both generations clear, the storage is well again.
        a.dev = PathBuf::from(sh("losetup", &["--find", "--show", "--partscan", a.file.to_str().unwrap()]));
        for id in &on_a {
            wait_health(&mut c, &agent, id, "empty after the return", |h| h.health_statuses.is_empty()).await;
            assert!(!condition(&mut c, id).await.abnormal);
            assert!(node_health(&mut c, id).await.health_statuses.is_empty());
        }
        assert!(list_all(&mut c, 2).await.concat().is_empty(), "nothing unhealthy is listed");
        assert!(storage(&mut c).await.is_empty());
        assert!(cli(&agent, &["health"]).contains("summary: every volume is healthy\n"));
        assert!(cli(&agent, &["storage-health"]).contains("healthy: true\n"));
        assert!(ctrl_health(&mut c, &healthy).await.health_statuses.is_empty());

        // The same backing file came back (perhaps as another loop device): the drive id
        // comes from the backing file, so it is the same drive, and its volumes serve:
        // staging the ext4 one formats and mounts it.
        assert_eq!(drive_id_of(&agent, &a), ida, "the reattached drive has the same id");
        let stage = tmp.path().join("kubelet/plugins/stage-page-4");
        std::fs::create_dir_all(&stage).unwrap();
        c.node.node_stage_volume(stage_req(&fs_vol, &stage, mount_cap("ext4"))).await.unwrap();
        assert_eq!(sh("findmnt", &["-n", "-o", "FSTYPE", stage.to_str().unwrap()]), "ext4");
        c.node.node_unstage_volume(unstage_req(&fs_vol, &stage)).await.unwrap();
    });
}

#[test]
fn suspect_and_failing_drives_and_a_lost_mount_map_to_their_statuses() {
    require_host();
    let tmp = short_tempdir();
    let a = LoopDrive::new(tmp.path(), "a.img", GIB);
    let _u = Unmounter(tmp.path().to_path_buf());
    let (agent, smart) = start(tmp.path());
    smart.choose(&a.name(), "sata-hdd-healthy.json");
    let ida = drive_id_of(&agent, &a);
    wait_drive_health(&agent, &ida, "good", Duration::from_secs(5));
    rt().block_on(async {
        let mut c = Csi::connect(&agent).await;
        let (id, _) = create(&mut c, "pvc-smart", 64 * MIB, mount_cap("ext4")).await;
        let kubelet = tmp.path().join("kubelet");
        let stage = kubelet.join("plugins/stage-smart");
        let target = kubelet.join("pods/p-smart/volumes/smart");
        std::fs::create_dir_all(&stage).unwrap();
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        c.node.node_stage_volume(stage_req(&id, &stage, mount_cap("ext4"))).await.unwrap();
        c.node.node_publish_volume(publish_req(&id, &stage, &target, mount_cap("ext4"), false)).await.unwrap();
        wait_health(&mut c, &agent, &id, "healthy when published", |h| h.health_statuses.is_empty()).await;

        // The target is unmounted behind drivelet's back: INACCESSIBLE from this node.
        sh("umount", &[target.to_str().unwrap()]);
        let h = wait_health(&mut c, &agent, &id, "MountLost", |h| !h.health_statuses.is_empty()).await;
        assert_eq!(kinds(&h), vec![(csi::VolumeHealthErrorType::Inaccessible, "MountLost".to_string())]);
        assert!(h.health_statuses[0].message.contains(&target.display().to_string()), "{h:?}");
        let req = csi::NodeGetVolumeHealthRequest {
            volume_id: id.clone(),
            volume_publish_path: target.display().to_string(),
            staging_target_path: stage.display().to_string(),
        };
        let nh = c.node.node_get_volume_health(req).await.unwrap().into_inner().volume_health.unwrap();
        assert_eq!(kinds(&nh), kinds(&h));
        c.node.node_publish_volume(publish_req(&id, &stage, &target, mount_cap("ext4"), false)).await.unwrap();
        wait_health(&mut c, &agent, &id, "healthy when published again", |h| h.health_statuses.is_empty()).await;

        // Reallocated and pending sectors under the BAD threshold: SUSPECT, DEGRADED.
        smart.choose(&a.name(), "sata-hdd-reallocated-pending.json");
        let h = wait_health(&mut c, &agent, &id, "DriveSuspect", |h| !h.health_statuses.is_empty()).await;
        assert_eq!(kinds(&h), vec![(csi::VolumeHealthErrorType::Degraded, "DriveSuspect".to_string())]);
        let st = storage(&mut c).await;
        assert_eq!(st.iter().map(|s| (s.0, s.1.as_str())).collect::<Vec<_>>(), vec![(csi::StorageHealthErrorType::StorageDegraded, "DriveSuspect")]);
        assert!(st[0].2.contains(&ida) && st[0].2.contains("suspect"), "{:?}", st[0].2);
        assert!(condition(&mut c, &id).await.message.contains("suspect"), "v1.12 says the same");

        // SMART self-assessment failed: BAD, DATA_LOSS (and the drive starts releasing,
        // which is said once, as DriveFailed, not twice).
        smart.choose(&a.name(), "sata-hdd-smart-failed.json");
        let h = wait_health(&mut c, &agent, &id, "DriveFailed", |h| h.health_statuses.iter().any(|e| e.reason == "DriveFailed")).await;
        assert_eq!(kinds(&h), vec![(csi::VolumeHealthErrorType::DataLoss, "DriveFailed".to_string())], "{h:?}");
        let st = storage(&mut c).await;
        assert_eq!(st.iter().map(|s| (s.0, s.1.as_str())).collect::<Vec<_>>(), vec![(csi::StorageHealthErrorType::StorageDegraded, "DriveFailed")]);
        let listed = list_all(&mut c, 0).await.concat();
        assert_eq!(listed.iter().map(|h| h.volume_id.as_str()).collect::<Vec<_>>(), vec![id.as_str()]);
        let cond = condition(&mut c, &id).await;
        assert!(cond.abnormal && cond.message == h.health_statuses[0].message, "v1.12 {cond:?} and v1.13 {h:?} say the same");
    });
}
