//! Who drivelet is to the API server: its driver and node (only VolumeAttachments and
//! Events of this pair are its business), the finalizer it puts on objects it attaches,
//! and the name it reports Events and writes patches under.
//!
//! Rules:
//! - the finalizer is the external-attacher's (`external-attacher/<driver>` with every
//!   `/` as `-`), so an object drivelet attached can be detached by the sidecar and back;
//! - every Event drivelet records is reported by controller [`REPORTER`] from this node's
//!   instance, whichever part of the Kubernetes front records it.

use kube::runtime::events::Reporter;

/// The controller name on Events and the field manager on patches.
pub(crate) const REPORTER: &str = "drivelet";

/// Who we are: only VolumeAttachments for this driver and this node are ours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identity {
    /// The CSI driver name (`spec.attacher`).
    pub driver: String,
    /// This node's name (`spec.nodeName`).
    pub node: String,
}

impl Identity {
    /// Our finalizer on VolumeAttachments and PVs.
    pub(crate) fn finalizer(&self) -> String {
        finalizer_name(&self.driver)
    }

    /// The reporter of our Events: controller [`REPORTER`], this node's instance.
    pub(crate) fn reporter(&self) -> Reporter {
        Reporter { controller: REPORTER.to_string(), instance: Some(self.node.clone()) }
    }
}

/// The external-attacher's finalizer for a driver: `external-attacher/<driver>` with every
/// `/` in the driver name replaced by `-`.
pub(crate) fn finalizer_name(driver: &str) -> String {
    format!("external-attacher/{}", driver.replace('/', "-"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finalizer_name_replaces_every_slash_in_the_driver_name() {
        assert_eq!(finalizer_name("drivelet.io/local"), "external-attacher/drivelet.io-local");
        assert_eq!(finalizer_name("a/b/c"), "external-attacher/a-b-c");
        assert_eq!(finalizer_name("plain"), "external-attacher/plain");
    }
}
