//! Object builders shared by the target tests and the fake API server tests.

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolumeClaimVolumeSource, PersistentVolumeSpec, PersistentVolumeStatus,
    PodSpec, PodStatus, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, Pod};

use super::VolumeConditionChanged;
use crate::actors::volumes::conditions::Reason;
use crate::k8s::attach::fixtures::{DRIVER, NODE};

/// A PV of our driver for `volume_id`, bound to `ns/claim` when given.
pub(crate) fn bound_pv(name: &str, volume_id: &str, claim: Option<(&str, &str)>) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta { name: Some(name.to_string()), ..Default::default() },
        spec: Some(PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                driver: DRIVER.to_string(),
                volume_handle: volume_id.to_string(),
                ..Default::default()
            }),
            claim_ref: claim.map(|(ns, claim)| ObjectReference {
                api_version: Some("v1".to_string()),
                kind: Some("PersistentVolumeClaim".to_string()),
                namespace: Some(ns.to_string()),
                name: Some(claim.to_string()),
                uid: Some(format!("uid-{claim}")),
                resource_version: Some("42".to_string()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: Some(PersistentVolumeStatus { phase: Some("Bound".to_string()), ..Default::default() }),
    }
}

/// A running pod in `ns` on `node` using the claims named.
pub(crate) fn pod(ns: &str, name: &str, node: &str, claims: &[&str]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(ns.to_string()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.to_string()),
            volumes: Some(
                claims
                    .iter()
                    .map(|c| Volume {
                        name: format!("vol-{c}"),
                        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                            claim_name: c.to_string(),
                            read_only: None,
                        }),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        status: Some(PodStatus { phase: Some("Running".to_string()), ..Default::default() }),
    }
}

/// A pod on this node.
pub(crate) fn local_pod(ns: &str, name: &str, claims: &[&str]) -> Pod {
    pod(ns, name, NODE, claims)
}

/// The claim reference the lookup yields for `ns/claim`.
pub(crate) fn claim_ref(ns: &str, claim: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".to_string()),
        kind: Some("PersistentVolumeClaim".to_string()),
        namespace: Some(ns.to_string()),
        name: Some(claim.to_string()),
        uid: Some(format!("uid-{claim}")),
        ..Default::default()
    }
}

/// A condition change as the volume manager sends it: its typed reasons are the one
/// finding the test's message describes (a missing drive, a full filesystem, else a
/// failing drive); none when normal.
pub(crate) fn change(volume_id: &str, abnormal: bool, message: &str) -> VolumeConditionChanged {
    let reason = if message.contains("missing") {
        Reason::DriveMissing
    } else if message.contains("full") {
        Reason::FilesystemFull
    } else {
        Reason::DriveFailed
    };
    let reasons = if abnormal { vec![reason] } else { Vec::new() };
    VolumeConditionChanged { volume_id: volume_id.to_string(), abnormal, message: message.to_string(), reasons }
}
