//! The Controller and Node services' views of volumes: ListVolumes (and its paging: this
//! is the one home of ListVolumes paging), ControllerGetVolume and NodeGetVolumeStats,
//! held to their tables when advertised (UNIMPLEMENTED otherwise, checked with the other
//! capabilities in `identity`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::common::*;
use super::harness::*;
use drivelet::actors::volumes::model::{VolumeRecord, VolumeState};
use drivelet::grpc::proto::csi;
use csi::controller_service_capability::{rpc::Type as CR, Type as CT};
use drivelet::store::Store;
use tonic::Code;

/// Two volumes, each staged and published, so every listing has something to show.
struct Two {
    fs: csi::Volume,
    blk: csi::Volume,
    /// Staging path and target of `fs`, then of `blk`.
    s1: PathBuf,
    t1: PathBuf,
    sb: PathBuf,
    tb: PathBuf,
}

async fn two_published(fx: &Fixture, c: &mut Csi) -> Two {
    let fs = must("CreateVolume fs", c.ctrl.create_volume(vol_req("conf-l-fs", 64 * MIB_I, 0, vec![mount_cap("ext4")], &[])).await).volume.unwrap();
    let blk = must("CreateVolume block", c.ctrl.create_volume(vol_req("conf-l-blk", 16 * MIB_I, 0, vec![block_cap()], &[])).await).volume.unwrap();
    let (s1, t1, sb, tb) = (fx.staging("fs"), fx.target("p1", "fs"), fx.staging("blk"), fx.target("p1", "blk"));
    must("NodeStageVolume", c.node.node_stage_volume(stage_req(&fs.volume_id, &s1, mount_cap("ext4"))).await);
    must("NodePublishVolume", c.node.node_publish_volume(publish_req(&fs.volume_id, &s1, &t1, mount_cap("ext4"), false)).await);
    must("NodeStageVolume", c.node.node_stage_volume(stage_req(&blk.volume_id, &sb, block_cap())).await);
    must("NodePublishVolume", c.node.node_publish_volume(publish_req(&blk.volume_id, &sb, &tb, block_cap(), false)).await);
    Two { fs, blk, s1, t1, sb, tb }
}

/// The RPC types ControllerGetCapabilities lists.
async fn controller_capabilities(c: &mut Csi) -> Vec<i32> {
    let cc = must("ControllerGetCapabilities", c.ctrl.controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {}).await);
    cc.capabilities.iter().filter_map(|x| x.r#type.as_ref().map(|CT::Rpc(rpc)| rpc.r#type)).collect()
}

#[test]
fn list_volumes_shows_each_volume_as_create_volume_returned_it_with_a_condition() {
    conform(&[GIB], async |fx, c, r| {
        let ctrl = controller_capabilities(c).await;
        let has = |t: CR| ctrl.contains(&(t as i32));

        // Capabilities that depend on others [ControllerServiceCapability].
        r.check(!has(CR::ListVolumesPublishedNodes) || has(CR::PublishUnpublishVolume), || {
            "LIST_VOLUMES_PUBLISHED_NODES is advertised without PUBLISH_UNPUBLISH_VOLUME, which the spec says the SP MUST also support".into()
        });

        let Two { fs, blk, .. } = two_published(&fx, c).await;
        let before = fx.state();
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
        } else {
            r.code("ListVolumes (not advertised)", c.ctrl.list_volumes(list(0, "")).await, Code::Unimplemented);
        }
        r.unchanged("listing and stats calls", &fx, &before);
    });
}

#[test]
fn list_volumes_one_entry_per_page_lists_every_volume_once_and_refuses_bad_tokens_and_limits() {
    conform(&[GIB], async |fx, c, r| {
        let ctrl = controller_capabilities(c).await;
        let has = |t: CR| ctrl.contains(&(t as i32));

        let Two { fs, blk, .. } = two_published(&fx, c).await;
        let before = fx.state();
        let list = |max: i32, token: &str| csi::ListVolumesRequest { max_entries: max, starting_token: token.into() };
        if has(CR::ListVolumes) {
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
        r.unchanged("listing and stats calls", &fx, &before);
    });
}

#[test]
fn controller_get_volume_follows_its_table_and_shows_the_volume_as_created() {
    conform(&[GIB], async |fx, c, r| {
        let ctrl = controller_capabilities(c).await;
        let has = |t: CR| ctrl.contains(&(t as i32));

        let Two { fs, blk, .. } = two_published(&fx, c).await;
        let before = fx.state();
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
        r.unchanged("listing and stats calls", &fx, &before);
    });
}

#[test]
fn node_get_volume_stats_follows_its_table_at_targets_and_staging_paths() {
    conform(&[GIB], async |fx, c, r| {
        use csi::node_service_capability::{rpc::Type as NR, Type as NT};
        let nc = must("NodeGetCapabilities", c.node.node_get_capabilities(csi::NodeGetCapabilitiesRequest {}).await);
        let node: Vec<i32> = nc.capabilities.iter().filter_map(|x| x.r#type.as_ref().map(|NT::Rpc(rpc)| rpc.r#type)).collect();
        let hasn = |t: NR| node.contains(&(t as i32));

        let Two { fs, blk, s1, t1, tb, .. } = two_published(&fx, c).await;
        let before = fx.state();
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
    });
}

#[test]
fn a_deleted_volume_is_no_longer_listed_or_found() {
    conform(&[GIB], async |fx, c, r| {
        let ctrl = controller_capabilities(c).await;
        let has = |t: CR| ctrl.contains(&(t as i32));

        let Two { fs, blk, s1, t1, sb, tb } = two_published(&fx, c).await;
        let list = |max: i32, token: &str| csi::ListVolumesRequest { max_entries: max, starting_token: token.into() };
        let get = |id: &str| csi::ControllerGetVolumeRequest { volume_id: id.into() };
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
}

// ---------------------------------------------------------------------------------
// Paging at scale, and tokens across a restart.
// ---------------------------------------------------------------------------------

/// Seeds the store with `n` volume records on a drive that is not on this node: the
/// records are kept, and reported with a "missing drive" condition.
fn seed(dir: &Path, n: u32) -> BTreeSet<String> {
    let store = Store::open(&dir.join("state")).unwrap();
    let mut ids = BTreeSet::new();
    for i in 0..n {
        let name = format!("pvc-seed-{i:04}");
        let guid = drivelet::disk::gpt::volume_partition_guid(&name);
        let rec = VolumeRecord {
            drive_id: "seeded-absent-drive".into(),
            part_guid: guid,
            start: (1 + i as u64) << 20,
            size: 1 << 20,
            block: true,
            ..VolumeRecord::new(guid.to_string(), name, VolumeState::Available, 0)
        };
        store.put(&rec.id, &rec).unwrap();
        ids.insert(rec.id);
    }
    ids
}

/// Lists every volume in pages of `page`: the ids in order, the number of pages, and the
/// token that fetched the second page.
async fn list_all(c: &mut Csi, page: i32) -> (Vec<String>, usize, String) {
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    let mut second = String::new();
    loop {
        let r = c
            .ctrl
            .list_volumes(csi::ListVolumesRequest { max_entries: page, starting_token: token.clone() })
            .await
            .unwrap_or_else(|e| panic!("ListVolumes page {pages} (token {token:?}): {e:?}"))
            .into_inner();
        pages += 1;
        assert!(r.entries.len() <= page as usize, "page {pages} has {} entries: a page holds at most max_entries", r.entries.len());
        assert!(!r.entries.is_empty(), "page {pages} is empty");
        for e in &r.entries {
            let v = e.volume.as_ref().unwrap();
            let cond = e.status.as_ref().unwrap().volume_condition.as_ref().unwrap();
            assert!(cond.abnormal && cond.message.contains("missing"), "{}", cond.message);
            seen.push(v.volume_id.clone());
        }
        if pages == 2 {
            second = token.clone();
        }
        if r.next_token.is_empty() {
            break;
        }
        token = r.next_token;
        assert!(pages < 1000, "ListVolumes never ends");
    }
    (seen, pages, second)
}

#[test]
fn list_volumes_pages_a_thousand_volumes_each_exactly_once_and_aborts_malformed_and_stale_tokens() {
    require_host();
    let tmp = short_tempdir();
    let ids = seed(tmp.path(), 1000);
    let mut agent = Agent::start(tmp.path(), AgentOpts::default());
    let rt = rt();
    const PAGE: i32 = 7;
    let stale = rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        let (seen, pages, token) = list_all(&mut c, PAGE).await;
        let got: BTreeSet<String> = seen.iter().cloned().collect();
        assert_eq!(seen.len(), got.len(), "no volume is listed twice");
        assert_eq!(seen.len(), 1000, "every volume once");
        assert_eq!(got, ids, "the very volumes seeded");
        assert_eq!(pages, 143, "1000 / 7 rounded up");
        // Everything in one call when max_entries is 0.
        let all = c.ctrl.list_volumes(csi::ListVolumesRequest::default()).await.unwrap().into_inner();
        assert_eq!(all.entries.len(), 1000);
        assert!(all.next_token.is_empty());
        for bad in ["garbage", "0:", ":x", "zzzz:pvc", "not-a-token", "zz:pvc", "0123456789abcdef:", ":"] {
            let e = c
                .ctrl
                .list_volumes(csi::ListVolumesRequest { max_entries: PAGE, starting_token: bad.into() })
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::Aborted, "malformed token {bad:?}: {e:?}");
        }
        let e = c.ctrl.list_volumes(csi::ListVolumesRequest { max_entries: -1, starting_token: String::new() }).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        token
    });
    assert!(!stale.is_empty());
    // A token from before a restart is stale.
    agent.kill();
    agent.spawn();
    rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        let e = c.ctrl.list_volumes(csi::ListVolumesRequest { max_entries: PAGE, starting_token: stale }).await.unwrap_err();
        assert_eq!(e.code(), Code::Aborted, "a token from before the restart: {e:?}");
        assert!(e.message().contains("list again"), "{}", e.message());
        // Listing from the start works, and this run's tokens resume.
        let first = c.ctrl.list_volumes(csi::ListVolumesRequest { max_entries: PAGE, starting_token: String::new() }).await.unwrap().into_inner();
        let second = c
            .ctrl
            .list_volumes(csi::ListVolumesRequest { max_entries: PAGE, starting_token: first.next_token.clone() })
            .await
            .unwrap()
            .into_inner();
        let listed: Vec<String> = first.entries.iter().chain(&second.entries).map(|e| e.volume.as_ref().unwrap().volume_id.clone()).collect();
        let expect: Vec<String> = ids.iter().take(2 * PAGE as usize).cloned().collect();
        assert_eq!(listed, expect, "after the restart, pages resume in id order");
    });
}
