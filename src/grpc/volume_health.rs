//! The CSI v1.13 health RPCs: ControllerGetVolumeHealth, ControllerListVolumeHealth,
//! NodeGetVolumeHealth and NodeGetStorageHealth, served from the same volume
//! conditions as v1.12's `volume_condition` (see `actors::volumes::conditions`):
//! validate ([`super::valid`]), ask ([`Front::ask`]), answer.
//!
//! CSI MUSTs honoured:
//! - an empty or malformed volume id is INVALID_ARGUMENT, an unknown volume NOT_FOUND;
//! - a volume with no adverse condition answers an empty `health_statuses` list; every
//!   entry has a status, a CamelCase reason and a message, and no (status, reason)
//!   repeats within a volume;
//! - `ControllerListVolumeHealth` lists only volumes with an adverse condition, in
//!   volume-id order, paged like ListVolumes: a negative `max_entries` is
//!   INVALID_ARGUMENT, `next_token` names the last volume returned and this run of the
//!   agent, a malformed token or one from before a restart is ABORTED;
//! - `NodeGetVolumeHealth` answers for any volume of this node, staged or not (the CO
//!   may ask about a volume whose staging failed); its optional paths only need to be
//!   absolute paths no longer than PATH_MAX;
//! - `NodeGetStorageHealth` reports this node's managed drives: missing drives that
//!   hold volumes STORAGE_UNREACHABLE, failing or suspect ones STORAGE_DEGRADED, one
//!   entry per reason (empty: all well);
//! - secrets are never read or logged.

use tonic::{Response, Status};

use super::proto::csi;
use super::valid;
use super::Front;
use crate::actors::volumes::conditions::{Condition, HealthStatus, StorageEntry, StorageStatus};
use crate::actors::volumes::{GetStorageHealth, GetVolumeStatus, ListVolumeStatuses};

/// The CSI v1.13 form of a volume's condition.
pub(crate) fn volume_health_of(volume_id: &str, c: &Condition) -> csi::VolumeHealth {
    use csi::VolumeHealthErrorType as T;
    csi::VolumeHealth {
        volume_id: volume_id.to_string(),
        health_statuses: c
            .entries
            .iter()
            .map(|e| csi::volume_health::VolumeHealthEntry {
                status: match e.status {
                    HealthStatus::Inaccessible => T::Inaccessible,
                    HealthStatus::DataLoss => T::DataLoss,
                    HealthStatus::Degraded => T::Degraded,
                } as i32,
                reason: e.reason.as_str().to_string(),
                message: e.message.clone(),
            })
            .collect(),
    }
}

fn storage_entry_of(e: &StorageEntry) -> csi::node_get_storage_health_response::StorageBackendHealth {
    use csi::StorageHealthErrorType as T;
    csi::node_get_storage_health_response::StorageBackendHealth {
        status: match e.status {
            StorageStatus::StorageUnreachable => T::StorageUnreachable,
            StorageStatus::StorageDegraded => T::StorageDegraded,
        } as i32,
        reason: e.reason.as_str().to_string(),
        message: e.message.clone(),
        volume_capability: None,
    }
}

impl Front {
    /// One volume's health (both ControllerGetVolumeHealth and NodeGetVolumeHealth:
    /// every volume lives on this node, so both sides see the same thing).
    async fn volume_health(&self, m: GetVolumeStatus) -> Result<csi::VolumeHealth, Status> {
        let st = self.ask(m).await?;
        Ok(volume_health_of(&st.record.id, &st.condition))
    }

    /// ControllerGetVolumeHealth.
    pub(crate) async fn controller_get_volume_health(
        &self,
        req: csi::ControllerGetVolumeHealthRequest,
    ) -> Result<Response<csi::ControllerGetVolumeHealthResponse>, Status> {
        let h = self.volume_health(valid::volume(req.volume_id)?).await?;
        Ok(Response::new(csi::ControllerGetVolumeHealthResponse { volume_health: Some(h) }))
    }

    /// ControllerListVolumeHealth.
    pub(crate) async fn controller_list_volume_health(
        &self,
        req: csi::ControllerListVolumeHealthRequest,
    ) -> Result<Response<csi::ControllerListVolumeHealthResponse>, Status> {
        let (max, after) = self.page_start(req.max_entries, &req.starting_token)?;
        let (page, next) = self.ask(ListVolumeStatuses { after, max, abnormal_only: true }).await?;
        Ok(Response::new(csi::ControllerListVolumeHealthResponse {
            entries: page.iter().map(|st| volume_health_of(&st.record.id, &st.condition)).collect(),
            next_token: next.map(|id| self.token(&id)).unwrap_or_default(),
        }))
    }

    /// NodeGetVolumeHealth.
    pub(crate) async fn node_get_volume_health(
        &self,
        req: csi::NodeGetVolumeHealthRequest,
    ) -> Result<Response<csi::NodeGetVolumeHealthResponse>, Status> {
        let h = self.volume_health(valid::node_volume_health(req)?).await?;
        Ok(Response::new(csi::NodeGetVolumeHealthResponse { volume_health: Some(h) }))
    }

    /// NodeGetStorageHealth.
    pub(crate) async fn node_get_storage_health(&self) -> Result<Response<csi::NodeGetStorageHealthResponse>, Status> {
        let entries = self.ask(GetStorageHealth).await?;
        Ok(Response::new(csi::NodeGetStorageHealthResponse { backend_health: entries.iter().map(storage_entry_of).collect() }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::volumes::conditions::{HealthEntry, Reason};

    #[test]
    fn entries_keep_their_status_reason_and_message_on_the_wire() {
        let c = Condition {
            abnormal: true,
            message: "a; b".into(),
            entries: vec![
                HealthEntry { status: HealthStatus::Inaccessible, reason: Reason::DriveMissing, message: "a".into() },
                HealthEntry { status: HealthStatus::DataLoss, reason: Reason::FilesystemCorrupt, message: "b".into() },
            ],
        };
        let h = volume_health_of("v1", &c);
        assert_eq!(h.volume_id, "v1");
        let got: Vec<(i32, &str, &str)> = h.health_statuses.iter().map(|e| (e.status, e.reason.as_str(), e.message.as_str())).collect();
        assert_eq!(got, vec![(1, "DriveMissing", "a"), (2, "FilesystemCorrupt", "b")], "INACCESSIBLE = 1, DATA_LOSS = 2 upstream");
        let healthy = Condition { abnormal: false, message: "volume is healthy".into(), entries: vec![] };
        assert!(volume_health_of("v1", &healthy).health_statuses.is_empty());
        let s = storage_entry_of(&StorageEntry { status: StorageStatus::StorageDegraded, reason: Reason::DriveSuspect, message: "m".into() });
        assert_eq!((s.status, s.reason.as_str()), (2, "DriveSuspect"), "STORAGE_DEGRADED = 2 upstream");
    }

    /// Hand-encoded protobuf bytes with the upstream v1.13 (and v1.12) field numbers
    /// decode into the generated types: the wire matches the published spec both ways.
    #[test]
    fn the_wire_uses_the_upstream_field_numbers() {
        use prost::Message;
        // ControllerGetVolumeHealthResponse{volume_health(1): VolumeHealth{volume_id(1): "v",
        // health_statuses(2): [{status(1): DATA_LOSS, reason(2): "R", message(3): "m"}]}}.
        let entry = [0x08, 0x02, 0x12, 0x01, b'R', 0x1a, 0x01, b'm'];
        let mut vh = vec![0x0a, 0x01, b'v', 0x12, entry.len() as u8];
        vh.extend(entry);
        let mut resp = vec![0x0a, vh.len() as u8];
        resp.extend(&vh);
        let got = csi::ControllerGetVolumeHealthResponse::decode(resp.as_slice()).unwrap();
        let h = got.volume_health.clone().unwrap();
        assert_eq!((h.volume_id.as_str(), h.health_statuses.len()), ("v", 1));
        let e = &h.health_statuses[0];
        assert_eq!((e.status(), e.reason.as_str(), e.message.as_str()), (csi::VolumeHealthErrorType::DataLoss, "R", "m"));
        assert_eq!(got.encode_to_vec(), resp, "and encodes back to the same bytes");
        assert_eq!(csi::NodeGetVolumeHealthResponse::decode(resp.as_slice()).unwrap().volume_health, got.volume_health);
        // ControllerListVolumeHealthResponse{entries(1): [VolumeHealth], next_token(2): "t"}.
        let mut list = vec![0x0a, vh.len() as u8];
        list.extend(&vh);
        list.extend([0x12, 0x01, b't']);
        let l = csi::ControllerListVolumeHealthResponse::decode(list.as_slice()).unwrap();
        assert_eq!((l.entries.len(), l.next_token.as_str()), (1, "t"));
        // Requests: max_entries(1), starting_token(2), secrets(3); volume_id(1),
        // volume_publish_path(2), staging_target_path(3); volume_id(1), secrets(2).
        let req = [0x08, 0x03, 0x12, 0x01, b't', 0x1a, 0x06, 0x0a, 0x01, b'k', 0x12, 0x01, b'v'];
        let r = csi::ControllerListVolumeHealthRequest::decode(&req[..]).unwrap();
        assert_eq!((r.max_entries, r.starting_token.as_str(), r.secrets.get("k").map(String::as_str)), (3, "t", Some("v")));
        let req = [0x0a, 0x01, b'v', 0x12, 0x01, b'p', 0x1a, 0x01, b's'];
        let r = csi::NodeGetVolumeHealthRequest::decode(&req[..]).unwrap();
        assert_eq!((r.volume_id.as_str(), r.volume_publish_path.as_str(), r.staging_target_path.as_str()), ("v", "p", "s"));
        let req = [0x0a, 0x01, b'v', 0x12, 0x06, 0x0a, 0x01, b'k', 0x12, 0x01, b'v'];
        let r = csi::ControllerGetVolumeHealthRequest::decode(&req[..]).unwrap();
        assert_eq!((r.volume_id.as_str(), r.secrets.len()), ("v", 1));
        let req = [0x0a, 0x06, 0x0a, 0x01, b'k', 0x12, 0x01, b'v'];
        assert_eq!(csi::NodeGetStorageHealthRequest::decode(&req[..]).unwrap().secrets.get("k").map(String::as_str), Some("v"), "secrets(1)");
        // NodeGetStorageHealthResponse{backend_health(1): [{status(1): STORAGE_UNREACHABLE,
        // reason(2): "D", message(3): "x", volume_capability(4): {}}]}.
        let b = [0x0a, 0x0a, 0x08, 0x01, 0x12, 0x01, b'D', 0x1a, 0x01, b'x', 0x22, 0x00];
        let s = csi::NodeGetStorageHealthResponse::decode(&b[..]).unwrap();
        let e = &s.backend_health[0];
        assert_eq!((e.status(), e.reason.as_str(), e.message.as_str(), e.volume_capability.is_some()), (csi::StorageHealthErrorType::StorageUnreachable, "D", "x", true));
        // Capabilities: controller LIST_VOLUME_HEALTH = 16, GET_VOLUME_HEALTH = 17; node
        // GET_VOLUME_HEALTH = 7, GET_STORAGE_HEALTH = 8; v1.12's VOLUME_CONDITION kept.
        use csi::controller_service_capability::rpc::Type as C;
        use csi::node_service_capability::rpc::Type as N;
        let cap = |n: u8| csi::ControllerServiceCapability::decode(&[0x0a, 0x02, 0x08, n][..]).unwrap();
        let ncap = |n: u8| csi::NodeServiceCapability::decode(&[0x0a, 0x02, 0x08, n][..]).unwrap();
        let ctype = |c: csi::ControllerServiceCapability| match c.r#type {
            Some(csi::controller_service_capability::Type::Rpc(r)) => r.r#type(),
            None => C::Unknown,
        };
        let ntype = |c: csi::NodeServiceCapability| match c.r#type {
            Some(csi::node_service_capability::Type::Rpc(r)) => r.r#type(),
            None => N::Unknown,
        };
        assert_eq!([ctype(cap(16)), ctype(cap(17)), ctype(cap(11)), ctype(cap(12))], [C::ListVolumeHealth, C::GetVolumeHealth, C::VolumeCondition, C::GetVolume]);
        assert_eq!([ntype(ncap(7)), ntype(ncap(8)), ntype(ncap(4))], [N::GetVolumeHealth, N::GetStorageHealth, N::VolumeCondition]);
        // v1.12: NodeGetVolumeStatsResponse.volume_condition(2){abnormal(1), message(2)}.
        let st = csi::NodeGetVolumeStatsResponse::decode(&[0x12, 0x05, 0x08, 0x01, 0x12, 0x01, b'm'][..]).unwrap();
        assert_eq!(st.volume_condition, Some(csi::VolumeCondition { abnormal: true, message: "m".into() }));
    }
}
