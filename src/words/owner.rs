//! Who a drive belongs to, as its own note says ([`crate::disk::note`]): a cluster and a
//! node; and what an admin is shown of a drive that is not this node's.

use serde::{Deserialize, Serialize};

/// The owner of a drive: one node of one cluster.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Owner {
    /// The cluster's id: the uid of the cluster's `kube-system` namespace (made by the
    /// cluster, new when it is rebuilt; see [`crate::k8s::cluster_id`]), or the config's
    /// `driver.cluster_id` when set (`standalone` without Kubernetes and without it).
    pub cluster: String,
    /// The node's name (`driver.node_name`).
    pub node: String,
}

impl Owner {
    /// "node NODE of this cluster" or "node NODE of cluster ID", as seen by `me`.
    pub fn words(&self, me: &Owner) -> String {
        if self.cluster == me.cluster {
            format!("node {} of this cluster", self.node)
        } else {
            format!("node {} of another cluster ({})", self.node, self.cluster)
        }
    }
}

/// Whose a drive is, from its note, as its listings show it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum DriveOwner {
    /// Not read, or nothing that could carry a note (a blank or foreign disk).
    #[default]
    Unknown,
    /// This node of this cluster.
    Ours,
    /// A drivelet disk with no note: written before drives carried their owner, or
    /// not by drivelet at all.
    NoNote,
    /// Another node of this cluster, or another cluster.
    Elsewhere {
        /// Who the note names.
        owner: Owner,
        /// What the note says its volumes are.
        volumes: Vec<HeldVolume>,
    },
    /// A note is there but cannot be read (torn, corrupt, or of a newer drivelet).
    Unreadable {
        /// Why, in words.
        reason: String,
    },
}

/// A volume a drive of someone else holds, as its note tells.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldVolume {
    /// The volume id.
    pub id: String,
    /// Its size in bytes.
    pub size_bytes: u64,
    /// `namespace/name` of the claim it serves, when known.
    pub claim: Option<String>,
    /// The PV's name, when known.
    pub pv: Option<String>,
}

/// What a volume serves in Kubernetes: its PV and claim, as far as they are known.
/// Written to the volume's entry in its drive's note, so the volume can be given back
/// to its claim from the disk alone.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Binding {
    /// The PV's name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pv: String,
    /// The claim's namespace.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub claim_namespace: String,
    /// The claim's name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub claim_name: String,
    /// The claim's uid (empty until the cluster is asked).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub claim_uid: String,
    /// The claim's StorageClass (empty until the cluster is asked).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub storage_class: String,
}

impl Binding {
    /// `namespace/name` of the claim, when known.
    pub fn claim(&self) -> Option<String> {
        (!self.claim_name.is_empty()).then(|| format!("{}/{}", self.claim_namespace, self.claim_name))
    }

    /// Whether nothing is known.
    pub fn is_empty(&self) -> bool {
        self == &Binding::default()
    }
}
