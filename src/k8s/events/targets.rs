//! Who hears about a volume: its claim, found through its PV, and the pods of this node
//! using the claim. Pure decisions over the listed objects.
//!
//! Rules:
//! - The PV whose `spec.csi.driver` is our driver and whose `spec.csi.volumeHandle` is the
//!   volume id leads to its claim (`spec.claimRef`); a PV without a claimRef, or Released
//!   (its claim was deleted), has no one to tell ([`find_claim`], [`claim_of`]).
//! - The pods are those in the claim's namespace, scheduled to this node
//!   (`spec.nodeName`), not finished (phase neither Succeeded nor Failed), with a volume
//!   naming the claim ([`pods_using`]), in list order.

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, Pod};
use kube::{Resource, ResourceExt};

/// What a volume's PV says about who to tell.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ClaimLookup {
    /// No PV of our driver has this volume handle.
    NoVolume,
    /// The PV is not bound to a claim (no claimRef, or one without namespace or name).
    Unclaimed {
        /// The PV's name.
        pv: String,
    },
    /// The PV is Released: its claim was deleted.
    Released {
        /// The PV's name.
        pv: String,
    },
    /// The PV is bound to this claim.
    Claimed {
        /// The PV's name.
        pv: String,
        /// The claim, as an Event's `regarding` (apiVersion, kind, namespace, name, uid).
        claim: ObjectReference,
    },
}

/// Whether `pv` is the PV of `volume_id` under `driver`.
pub(crate) fn is_volume(pv: &PersistentVolume, driver: &str, volume_id: &str) -> bool {
    pv.spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .is_some_and(|csi| csi.driver == driver && csi.volume_handle == volume_id)
}

/// The claim of one PV (see [`ClaimLookup`]).
pub(crate) fn claim_of(pv: &PersistentVolume) -> ClaimLookup {
    let name = pv.name_any();
    if pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released") {
        return ClaimLookup::Released { pv: name };
    }
    let claim_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
    match claim_ref.and_then(|c| Some((c.namespace.clone()?, c.name.clone()?, c.uid.clone()))) {
        Some((namespace, claim, uid)) => ClaimLookup::Claimed {
            pv: name,
            claim: ObjectReference {
                api_version: Some("v1".to_string()),
                kind: Some("PersistentVolumeClaim".to_string()),
                namespace: Some(namespace),
                name: Some(claim),
                uid,
                ..Default::default()
            },
        },
        None => ClaimLookup::Unclaimed { pv: name },
    }
}

/// The claim of the PV of `volume_id` under `driver`, among `pvs`.
pub(crate) fn find_claim<'a>(
    pvs: impl IntoIterator<Item = &'a PersistentVolume>,
    driver: &str,
    volume_id: &str,
) -> ClaimLookup {
    pvs.into_iter().find(|pv| is_volume(pv, driver, volume_id)).map_or(ClaimLookup::NoVolume, claim_of)
}

/// The pods among `pods` that use `claim` on `node` and have not finished, as Events'
/// `regarding`, in list order.
pub(crate) fn pods_using<'a>(pods: impl IntoIterator<Item = &'a Pod>, claim: &ObjectReference, node: &str) -> Vec<ObjectReference> {
    let (Some(namespace), Some(claim_name)) = (claim.namespace.as_deref(), claim.name.as_deref()) else {
        return Vec::new();
    };
    pods.into_iter()
        .filter(|pod| pod.metadata.namespace.as_deref() == Some(namespace))
        .filter(|pod| {
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .filter(|pod| {
            let Some(spec) = pod.spec.as_ref() else { return false };
            spec.node_name.as_deref() == Some(node)
                && spec.volumes.iter().flatten().any(|v| {
                    v.persistent_volume_claim.as_ref().is_some_and(|c| c.claim_name == claim_name)
                })
        })
        .map(|pod| pod.object_ref(&()))
        .collect()
}
