//! ListVolumes pagination over a store seeded with 1000 volumes: pages of 7 return each
//! volume exactly once, and tokens that are malformed or from an earlier run are
//! ABORTED.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::*;
use drivelet::actors::inventory::model::LayoutKind;
use drivelet::actors::volumes::model::{VolumeRecord, VolumeState};
use drivelet::config::Media;
use drivelet::grpc::proto::csi;
use drivelet::store::Store;
use tonic::Code;

fn seed(dir: &std::path::Path, n: u32) -> BTreeSet<String> {
    let store = Store::open(&dir.join("state")).unwrap();
    let mut ids = BTreeSet::new();
    for i in 0..n {
        let name = format!("pvc-seed-{i:04}");
        let guid = drivelet::disk::gpt::volume_partition_guid(&name);
        let rec = VolumeRecord {
            id: guid.to_string(),
            name,
            // A drive that is not on this node: the records are kept, and reported
            // with a "missing drive" condition.
            drive_id: "seeded-absent-drive".into(),
            part_guid: guid,
            start: (1 + i as u64) << 20,
            size: 1 << 20,
            layout: LayoutKind::Partition,
            media: Media::Virtual,
            block: true,
            fs_type: String::new(),
            parameters: BTreeMap::new(),
            state: VolumeState::Available,
            formatted: false,
            staging: None,
            targets: BTreeMap::new(),
            created_unix: 0,
            rebuilt: false,
            failed: false,
            published_node: None,
            adopted: None,
            lost: false,
            clone_of: None,
        };
        store.put(&rec.id, &rec).unwrap();
        ids.insert(rec.id);
    }
    ids
}

async fn list_all(c: &mut Csi, page: i32) -> (Vec<String>, usize, String) {
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    let mut first_token = String::new();
    loop {
        let r = c
            .ctrl
            .list_volumes(csi::ListVolumesRequest { max_entries: page, starting_token: token.clone() })
            .await
            .unwrap()
            .into_inner();
        pages += 1;
        assert!(r.entries.len() <= page as usize, "a page holds at most max_entries");
        for e in &r.entries {
            let v = e.volume.as_ref().unwrap();
            let cond = e.status.as_ref().unwrap().volume_condition.as_ref().unwrap();
            assert!(cond.abnormal && cond.message.contains("missing"), "{}", cond.message);
            seen.push(v.volume_id.clone());
        }
        if pages == 2 {
            first_token = token.clone();
        }
        if r.next_token.is_empty() {
            break;
        }
        token = r.next_token;
    }
    (seen, pages, first_token)
}

#[test]
fn a_thousand_volumes_in_pages_of_seven_come_back_exactly_once_and_stale_tokens_abort() {
    require_host();
    let tmp = short_tempdir();
    let ids = seed(tmp.path(), 1000);
    let mut agent = Agent::start(tmp.path(), AgentOpts::default());
    let rt = rt();
    let stale = rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        let (seen, pages, token) = list_all(&mut c, 7).await;
        assert_eq!(seen.len(), 1000, "every volume once");
        assert_eq!(seen.iter().cloned().collect::<BTreeSet<_>>(), ids, "the very volumes seeded");
        assert_eq!(pages, 143, "1000 / 7 rounded up");
        // Everything in one call when max_entries is 0.
        let all = c.ctrl.list_volumes(csi::ListVolumesRequest::default()).await.unwrap().into_inner();
        assert_eq!(all.entries.len(), 1000);
        assert!(all.next_token.is_empty());
        for bad in ["garbage", "0:", ":x", "zzzz:pvc"] {
            let e = c
                .ctrl
                .list_volumes(csi::ListVolumesRequest { max_entries: 7, starting_token: bad.into() })
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::Aborted, "{bad}: {e:?}");
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
        let e = c.ctrl.list_volumes(csi::ListVolumesRequest { max_entries: 7, starting_token: stale }).await.unwrap_err();
        assert_eq!(e.code(), Code::Aborted, "{e:?}");
        assert!(e.message().contains("list again"), "{}", e.message());
    });
}
