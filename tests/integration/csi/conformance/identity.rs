//! The Identity service and what every service advertises: GetPluginInfo, Probe, the three
//! capability lists, and that every RPC behind an advertised capability is served while
//! every other one is UNIMPLEMENTED [GetPluginCapabilities, ControllerGetCapabilities,
//! NodeGetCapabilities].

use crate::common::*;
use super::harness::*;
use drivelet::grpc::proto::csi;
use csi::controller_service_capability::{rpc::Type as CR, Type as CT};
use csi::node_service_capability::{rpc::Type as NR, Type as NT};
use csi::plugin_capability::volume_expansion::Type as VE;
use csi::plugin_capability::{service::Type as S, Type as PT};
use tonic::{Code, Status};

/// The three capability lists as answered, and their entries parsed.
struct Lists {
    pc: csi::GetPluginCapabilitiesResponse,
    cc: csi::ControllerGetCapabilitiesResponse,
    nc: csi::NodeGetCapabilitiesResponse,
    plugin: Vec<S>,
    expansion: Vec<VE>,
    ctrl: Vec<CR>,
    node: Vec<NR>,
}

/// Asks for the three capability lists; an entry of an unknown type is a violation.
async fn capability_lists(c: &mut Csi, r: &mut Report) -> Lists {
    let pc = must("GetPluginCapabilities", c.id.get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {}).await);
    let cc = must("ControllerGetCapabilities", c.ctrl.controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {}).await);
    let nc = must("NodeGetCapabilities", c.node.node_get_capabilities(csi::NodeGetCapabilitiesRequest {}).await);
    let mut plugin = Vec::new();
    let mut expansion = Vec::new();
    for cap in &pc.capabilities {
        match &cap.r#type {
            Some(PT::Service(s)) if S::try_from(s.r#type).is_ok_and(|t| t != S::Unknown) => plugin.push(S::try_from(s.r#type).unwrap()),
            Some(PT::VolumeExpansion(e)) if VE::try_from(e.r#type).is_ok_and(|t| t != VE::Unknown) => expansion.push(VE::try_from(e.r#type).unwrap()),
            other => r.fail(format!("GetPluginCapabilities lists {other:?}: an unknown service or expansion type")),
        }
    }
    let mut ctrl = Vec::new();
    for cap in &cc.capabilities {
        match &cap.r#type {
            Some(CT::Rpc(rpc)) if CR::try_from(rpc.r#type).is_ok_and(|t| t != CR::Unknown) => ctrl.push(CR::try_from(rpc.r#type).unwrap()),
            other => r.fail(format!("ControllerGetCapabilities lists {other:?}")),
        }
    }
    let mut node = Vec::new();
    for cap in &nc.capabilities {
        match &cap.r#type {
            Some(NT::Rpc(rpc)) if NR::try_from(rpc.r#type).is_ok_and(|t| t != NR::Unknown) => node.push(NR::try_from(rpc.r#type).unwrap()),
            other => r.fail(format!("NodeGetCapabilities lists {other:?}")),
        }
    }
    Lists { pc, cc, nc, plugin, expansion, ctrl, node }
}

#[test]
fn plugin_info_is_a_domain_name_with_a_version_and_never_changes() {
    conform(&[GIB], async |_fx, c, r| {
        let info = must("GetPluginInfo", c.id.get_plugin_info(csi::GetPluginInfoRequest {}).await);
        r.check(valid_plugin_name(&info.name), || format!("GetPluginInfo name {:?} is not domain notation of <= 63 characters", info.name));
        r.check(!info.vendor_version.is_empty(), || "GetPluginInfo vendor_version is empty".into());
        let again = must("GetPluginInfo again", c.id.get_plugin_info(csi::GetPluginInfoRequest {}).await);
        r.check(again == info, || format!("GetPluginInfo changed between calls: {info:?} then {again:?}"));
        // drivelet's own answer, exactly.
        assert_eq!(info.name, "csi.drivelet.io");
        assert_eq!(info.vendor_version, env!("CARGO_PKG_VERSION"));
        assert_eq!(info.manifest.get("node").map(String::as_str), Some(NODE));
    });
}

#[test]
fn probe_is_ready_after_start_up_and_stays_ready() {
    conform(&[GIB], async |_fx, c, r| {
        for i in 0..2 {
            if let Some(p) = r.ok("Probe", c.id.probe(csi::ProbeRequest {}).await) {
                r.check(p.ready != Some(false), || format!("Probe #{i} says not ready after start-up"));
            }
        }
        // drivelet says so explicitly.
        assert_eq!(c.id.probe(csi::ProbeRequest {}).await.unwrap().into_inner().ready, Some(true));
    });
}

#[test]
fn capability_lists_hold_known_values_never_change_and_include_everything_implemented() {
    conform(&[GIB], async |_fx, c, r| {
        let Lists { pc, cc, nc, plugin, expansion, ctrl, node } = capability_lists(c, r).await;
        let pc2 = must("GetPluginCapabilities again", c.id.get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {}).await);
        let cc2 = must("ControllerGetCapabilities again", c.ctrl.controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {}).await);
        let nc2 = must("NodeGetCapabilities again", c.node.node_get_capabilities(csi::NodeGetCapabilitiesRequest {}).await);
        r.check(pc2 == pc && cc2 == cc && nc2 == nc, || "a capability list changed between calls".into());
        for s in [S::ControllerService, S::VolumeAccessibilityConstraints] {
            r.check(plugin.contains(&s), || format!("plugin capabilities {plugin:?} lack {s:?}"));
        }
        for t in [CR::CreateDeleteVolume, CR::GetCapacity, CR::SingleNodeMultiWriter, CR::CloneVolume] {
            r.check(ctrl.contains(&t), || format!("controller capabilities {ctrl:?} lack {t:?}"));
        }
        for t in [NR::StageUnstageVolume, NR::SingleNodeMultiWriter] {
            r.check(node.contains(&t), || format!("node capabilities {node:?} lack {t:?}"));
        }
        // Volume expansion: ONLINE (partitions grow while published), with both RPCs.
        r.check(expansion == [VE::Online], || format!("plugin volume expansion {expansion:?}, want [Online]"));
        r.check(ctrl.contains(&CR::ExpandVolume) && node.contains(&NR::ExpandVolume), || {
            format!("online expansion without EXPAND_VOLUME on both services: controller {ctrl:?}, node {node:?}")
        });

        // drivelet's own lists, exactly and in order.
        let got: Vec<String> = pc
            .capabilities
            .iter()
            .map(|c| match &c.r#type {
                Some(PT::Service(s)) => format!("service {}", s.r#type),
                Some(PT::VolumeExpansion(e)) => format!("expansion {}", e.r#type),
                other => panic!("unexpected capability {other:?}"),
            })
            .collect();
        let want = [
            format!("service {}", S::ControllerService as i32),
            format!("service {}", S::VolumeAccessibilityConstraints as i32),
            format!("expansion {}", VE::Online as i32),
        ];
        assert_eq!(got, want);
        let got: Vec<i32> = nc
            .capabilities
            .iter()
            .map(|c| match &c.r#type {
                Some(NT::Rpc(r)) => r.r#type,
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(
            got,
            vec![
                NR::StageUnstageVolume as i32,
                NR::SingleNodeMultiWriter as i32,
                NR::GetVolumeStats as i32,
                NR::VolumeCondition as i32,
                NR::ExpandVolume as i32,
            ]
        );
        let got: Vec<i32> = cc
            .capabilities
            .iter()
            .map(|c| match &c.r#type {
                Some(CT::Rpc(r)) => r.r#type,
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(
            got,
            vec![
                CR::CreateDeleteVolume as i32,
                CR::PublishUnpublishVolume as i32,
                CR::GetCapacity as i32,
                CR::SingleNodeMultiWriter as i32,
                CR::ListVolumes as i32,
                CR::ListVolumesPublishedNodes as i32,
                CR::GetVolume as i32,
                CR::VolumeCondition as i32,
                CR::ExpandVolume as i32,
                CR::CloneVolume as i32,
                CR::CreateDeleteSnapshot as i32,
                CR::ListSnapshots as i32,
            ]
        );
    });
}

#[test]
fn rpcs_behind_advertised_capabilities_are_served_and_every_other_one_is_unimplemented() {
    conform(&[GIB], async |fx, c, r| {
        let Lists { plugin, ctrl, node, .. } = capability_lists(c, r).await;
        // Advertisement matches behaviour: every RPC behind an advertised capability is
        // served (answers anything but UNIMPLEMENTED), every other one is UNIMPLEMENTED
        // with a message. A real volume, so "unimplemented" is not mistaken for "not found".
        let vol = must("CreateVolume", c.ctrl.create_volume(vol_req("conf-id-vol", 16 * MIB_I, 0, vec![block_cap()], &[])).await);
        let id = vol.volume.unwrap().volume_id;
        let range = Some(csi::CapacityRange { required_bytes: 32 * MIB_I, limit_bytes: 0 });
        let path = fx.kubelet.join("pods/p0/volumes/x").display().to_string();
        let mut served = |what: &str, advertised: bool, got: Result<(), Status>| {
            if advertised {
                if let Err(s) = &got {
                    r.check(s.code() != Code::Unimplemented, || format!("{what} is advertised but UNIMPLEMENTED: {}", s.message()));
                }
            } else {
                r.code(&format!("{what} (not advertised)"), got, Code::Unimplemented);
            }
        };
        let has = |t: CR| ctrl.contains(&t);
        served(
            "CreateVolume",
            has(CR::CreateDeleteVolume),
            c.ctrl.create_volume(vol_req("conf-id-vol", 16 * MIB_I, 0, vec![block_cap()], &[])).await.map(drop),
        );
        served("DeleteVolume", has(CR::CreateDeleteVolume), c.ctrl.delete_volume(del_req(UNKNOWN_ID)).await.map(drop));
        served(
            "ControllerPublishVolume",
            has(CR::PublishUnpublishVolume),
            c.ctrl
                .controller_publish_volume(csi::ControllerPublishVolumeRequest {
                    volume_id: id.clone(),
                    node_id: NODE.into(),
                    volume_capability: Some(block_cap()),
                    ..Default::default()
                })
                .await
                .map(drop),
        );
        served(
            "ControllerUnpublishVolume",
            has(CR::PublishUnpublishVolume),
            c.ctrl
                .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest { volume_id: id.clone(), node_id: NODE.into(), ..Default::default() })
                .await
                .map(drop),
        );
        served("ListVolumes", has(CR::ListVolumes), c.ctrl.list_volumes(csi::ListVolumesRequest::default()).await.map(drop));
        served("GetCapacity", has(CR::GetCapacity), c.ctrl.get_capacity(csi::GetCapacityRequest::default()).await.map(drop));
        served(
            "CreateSnapshot",
            has(CR::CreateDeleteSnapshot),
            c.ctrl
                .create_snapshot(csi::CreateSnapshotRequest { source_volume_id: id.clone(), name: "conf-snap".into(), ..Default::default() })
                .await
                .map(drop),
        );
        served(
            "DeleteSnapshot",
            has(CR::CreateDeleteSnapshot),
            c.ctrl.delete_snapshot(csi::DeleteSnapshotRequest { snapshot_id: "conf-snap".into(), ..Default::default() }).await.map(drop),
        );
        served("ListSnapshots", has(CR::ListSnapshots), c.ctrl.list_snapshots(csi::ListSnapshotsRequest::default()).await.map(drop));
        served(
            "GetSnapshot",
            has(CR::GetSnapshot),
            c.ctrl.get_snapshot(csi::GetSnapshotRequest { snapshot_id: "conf-snap".into(), ..Default::default() }).await.map(drop),
        );
        served(
            "ControllerExpandVolume",
            has(CR::ExpandVolume),
            c.ctrl
                .controller_expand_volume(csi::ControllerExpandVolumeRequest { volume_id: id.clone(), capacity_range: range, ..Default::default() })
                .await
                .map(drop),
        );
        served(
            "ControllerGetVolume",
            has(CR::GetVolume),
            c.ctrl.controller_get_volume(csi::ControllerGetVolumeRequest { volume_id: id.clone() }).await.map(drop),
        );
        served(
            "ControllerModifyVolume",
            has(CR::ModifyVolume),
            c.ctrl
                .controller_modify_volume(csi::ControllerModifyVolumeRequest {
                    volume_id: id.clone(),
                    mutable_parameters: kv(&[("media", "ssd")]),
                    ..Default::default()
                })
                .await
                .map(drop),
        );
        let hasn = |t: NR| node.contains(&t);
        served(
            "NodeUnstageVolume",
            hasn(NR::StageUnstageVolume),
            c.node.node_unstage_volume(unstage_req(&id, &fx.kubelet.join("plugins/none"))).await.map(drop),
        );
        served(
            "NodeGetVolumeStats",
            hasn(NR::GetVolumeStats) || hasn(NR::VolumeCondition),
            c.node
                .node_get_volume_stats(csi::NodeGetVolumeStatsRequest { volume_id: id.clone(), volume_path: path.clone(), ..Default::default() })
                .await
                .map(drop),
        );
        served(
            "NodeExpandVolume",
            hasn(NR::ExpandVolume),
            c.node
                .node_expand_volume(csi::NodeExpandVolumeRequest { volume_id: id.clone(), volume_path: path, capacity_range: range, ..Default::default() })
                .await
                .map(drop),
        );
        let ch = fx.agent.csi().await;
        let groups = plugin.contains(&S::GroupControllerService);
        let mut group = csi::group_controller_client::GroupControllerClient::new(ch.clone());
        served(
            "GroupControllerGetCapabilities",
            groups,
            group.group_controller_get_capabilities(csi::GroupControllerGetCapabilitiesRequest {}).await.map(drop),
        );
        served(
            "CreateVolumeGroupSnapshot",
            groups,
            group
                .create_volume_group_snapshot(csi::CreateVolumeGroupSnapshotRequest {
                    name: "conf-group".into(),
                    source_volume_ids: vec![id.clone()],
                    ..Default::default()
                })
                .await
                .map(drop),
        );
        served(
            "DeleteVolumeGroupSnapshot",
            groups,
            group.delete_volume_group_snapshot(csi::DeleteVolumeGroupSnapshotRequest { group_snapshot_id: "g".into(), ..Default::default() }).await.map(drop),
        );
        served(
            "GetVolumeGroupSnapshot",
            groups,
            group.get_volume_group_snapshot(csi::GetVolumeGroupSnapshotRequest { group_snapshot_id: "g".into(), ..Default::default() }).await.map(drop),
        );
        let metadata = plugin.contains(&S::SnapshotMetadataService);
        let mut meta = csi::snapshot_metadata_client::SnapshotMetadataClient::new(ch);
        served(
            "GetMetadataAllocated",
            metadata,
            meta.get_metadata_allocated(csi::GetMetadataAllocatedRequest { snapshot_id: "s".into(), ..Default::default() }).await.map(drop),
        );
        served(
            "GetMetadataDelta",
            metadata,
            meta.get_metadata_delta(csi::GetMetadataDeltaRequest {
                base_snapshot_id: "s1".into(),
                target_snapshot_id: "s2".into(),
                ..Default::default()
            })
            .await
            .map(drop),
        );

        // Expansion is served: a request without a capacity range is refused, not unknown.
        let e = c
            .ctrl
            .controller_expand_volume(csi::ControllerExpandVolumeRequest { volume_id: "v".into(), ..Default::default() })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        let e = c.node.node_expand_volume(csi::NodeExpandVolumeRequest::default()).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);

        must("DeleteVolume", c.ctrl.delete_volume(del_req(&id)).await);
    });
}
