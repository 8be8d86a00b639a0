//! Object builders shared by the decision tests and the fake API server tests.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::*;
use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolumeSpec};
use k8s_openapi::api::storage::v1::{VolumeAttachmentSource, VolumeAttachmentSpec, VolumeAttachmentStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

pub(crate) const DRIVER: &str = "drivelet.io/local";
pub(crate) const NODE: &str = "node-a";
pub(crate) const FINALIZER: &str = "external-attacher/drivelet.io-local";

pub(crate) fn identity() -> Identity {
    Identity { driver: DRIVER.to_string(), node: NODE.to_string() }
}

pub(crate) fn deleted() -> Option<Time> {
    Some(Time(Timestamp::from_second(1_700_000_000).expect("valid timestamp")))
}

pub(crate) fn va(name: &str, pv: &str) -> VolumeAttachment {
    VolumeAttachment {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            resource_version: Some("1".to_string()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        },
        spec: VolumeAttachmentSpec {
            attacher: DRIVER.to_string(),
            node_name: NODE.to_string(),
            source: VolumeAttachmentSource {
                persistent_volume_name: Some(pv.to_string()),
                ..Default::default()
            },
        },
        status: None,
    }
}

pub(crate) fn with_finalizer(mut va: VolumeAttachment) -> VolumeAttachment {
    va.metadata.finalizers = Some(vec![FINALIZER.to_string()]);
    va
}

pub(crate) fn attached(mut va: VolumeAttachment) -> VolumeAttachment {
    va.status = Some(VolumeAttachmentStatus { attached: true, ..Default::default() });
    va
}

pub(crate) fn pv(name: &str, volume_id: &str) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            resource_version: Some("7".to_string()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                driver: DRIVER.to_string(),
                volume_handle: volume_id.to_string(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

pub(crate) fn pv_with_finalizer(mut pv: PersistentVolume) -> PersistentVolume {
    pv.metadata.finalizers = Some(vec![FINALIZER.to_string()]);
    pv
}

pub(crate) fn context() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("devicePath".to_string(), "/dev/sdb3".to_string()),
        ("partitionGuid".to_string(), "6f1c0a3e-0000-4000-8000-000000000001".to_string()),
    ])
}

pub(crate) fn usable() -> VolumeState {
    VolumeState::Usable
}

pub(crate) fn publish(volume_id: &str) -> Action {
    Action::Publish(PublishSpec { volume_id: volume_id.to_string(), block: false, fs_type: String::new() })
}
