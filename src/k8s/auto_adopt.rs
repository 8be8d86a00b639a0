//! Adoption without a command, where there is no doubt: a disk of this cluster whose
//! owner's Node object is deleted (the admin's word that the node is not coming back,
//! as the cluster duties read it) is adopted by the node it now sits in, when the config
//! allows it (`drives.adopt_from_deleted_nodes`, off by default). The usual case: a node
//! reinstalled and rejoined under a new name with its old disks, or a disk moved out of
//! a retired node.
//!
//! Rules:
//! - never a disk of another cluster, never one whose owner cannot be read, never one
//!   whose owner's Node object exists or cannot be checked now (the API unreachable: ask
//!   again later); the decision is [`decide`], a pure function;
//! - the adoption itself is the inventory's [`AdoptDrive`], the same as an admin's;
//! - drives are looked at every [`EVERY`] and only when one is owned elsewhere in this
//!   cluster is the API asked, once per owner node.
//! - A task spawned for the agent's life on a timer ([`run`]), not a controller of the
//!   shell (`crate::k8s::shell`): its input is the inventory's drives, and the API is
//!   asked only whether an owner's Node exists, rarely; nothing is watched or queued.

use std::collections::BTreeMap;
use std::time::Duration;

use actix::Addr;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use tracing::{info, warn};

use crate::actors::inventory::DriveInventory;
use crate::actors::messages::{AdoptDrive, ListDrives};
use crate::words::{DriveClass, DriveOwner, Owner};

/// How often drives are looked at.
pub const EVERY: Duration = Duration::from_secs(15);

/// What to do with one drive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Not a candidate at all (this node's, not a drivelet disk, another cluster's).
    Skip,
    /// Its owner node of this cluster: ask the API whether its Node object exists.
    AskFor(String),
    /// Adopt it: its owner's Node object is deleted.
    Adopt,
    /// Leave it: why, in words (logged once).
    Leave(String),
}

/// The decision for a drive of class `class` and owner `owner`, as seen by `me`, given
/// whether its owner's Node object exists (`None`: not asked yet, or the API did not
/// answer).
pub fn decide(class: DriveClass, owner: &DriveOwner, me: &Owner, node_exists: Option<bool>) -> Decision {
    if class != DriveClass::OwnedElsewhere {
        return Decision::Skip;
    }
    match owner {
        DriveOwner::Elsewhere { owner, .. } if owner.cluster != me.cluster => Decision::Skip,
        DriveOwner::Elsewhere { owner, .. } if owner.node == me.node => Decision::Skip,
        DriveOwner::Elsewhere { owner, .. } => match node_exists {
            None => Decision::AskFor(owner.node.clone()),
            Some(false) => Decision::Adopt,
            Some(true) => Decision::Leave(format!("node {} still exists in the cluster: adopt it by hand if its disk is here for good", owner.node)),
        },
        _ => Decision::Skip,
    }
}

/// Whether the Node object `name` exists: `None` when the API did not answer.
async fn node_exists(api: &Api<Node>, name: &str) -> Option<bool> {
    match api.get_opt(name).await {
        Ok(n) => Some(n.is_some()),
        Err(e) => {
            warn!(node.name = %name, error = %e, "cannot tell whether node {name} exists; its disks here wait");
            None
        }
    }
}

/// Runs until the inventory is gone.
pub async fn run(client: kube::Client, inventory: Addr<DriveInventory>, me: Owner) {
    let nodes: Api<Node> = Api::all(client);
    let mut said: BTreeMap<String, String> = BTreeMap::new();
    loop {
        tokio::time::sleep(EVERY).await;
        let Ok(drives) = inventory.send(ListDrives).await else { return };
        let mut asked: BTreeMap<String, Option<bool>> = BTreeMap::new();
        for d in drives {
            let mut decision = decide(d.class, &d.owner, &me, None);
            if let Decision::AskFor(node) = &decision {
                let exists = match asked.get(node) {
                    Some(e) => *e,
                    None => {
                        let e = node_exists(&nodes, node).await;
                        asked.insert(node.clone(), e);
                        e
                    }
                };
                decision = decide(d.class, &d.owner, &me, exists);
            }
            match decision {
                Decision::Adopt => match inventory.send(AdoptDrive { drive_id: d.id.clone() }).await {
                    Ok(Ok(a)) => info!(drive.id = %d.id, volumes = a.volumes.len(), "drive of {}, whose Node object is deleted, adopted (drives.adopt_from_deleted_nodes)", a.from),
                    Ok(Err(e)) => warn!(drive.id = %d.id, error = %e, "cannot adopt the drive of a deleted node"),
                    Err(_) => return,
                },
                Decision::Leave(why) => {
                    if said.get(&d.id) != Some(&why) {
                        info!(drive.id = %d.id, "drive owned elsewhere left alone: {why}");
                        said.insert(d.id.clone(), why);
                    }
                }
                Decision::Skip | Decision::AskFor(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(cluster: &str, node: &str) -> DriveOwner {
        DriveOwner::Elsewhere { owner: Owner { cluster: cluster.into(), node: node.into() }, volumes: vec![] }
    }

    #[test]
    fn only_a_disk_of_this_cluster_whose_node_is_deleted_is_adopted() {
        let me = Owner { cluster: "c1".into(), node: "node-new".into() };
        let e = DriveClass::OwnedElsewhere;
        let cases: Vec<(&str, DriveClass, DriveOwner, Option<bool>, Decision)> = vec![
            ("a managed disk", DriveClass::Managed, DriveOwner::Ours, Some(false), Decision::Skip),
            ("a foreign disk", DriveClass::Foreign, DriveOwner::Unknown, Some(false), Decision::Skip),
            ("another cluster's, its node gone", e, owned("c2", "node-old"), Some(false), Decision::Skip),
            ("an unreadable note", e, DriveOwner::Unreadable { reason: "torn".into() }, Some(false), Decision::Skip),
            ("no note", e, DriveOwner::NoNote, Some(false), Decision::Skip),
            ("this cluster's, not asked yet", e, owned("c1", "node-old"), None, Decision::AskFor("node-old".into())),
            ("this cluster's, its node deleted", e, owned("c1", "node-old"), Some(false), Decision::Adopt),
        ];
        for (what, class, owner, exists, want) in cases {
            assert_eq!(decide(class, &owner, &me, exists), want, "{what}");
        }
        assert!(matches!(decide(e, &owned("c1", "node-old"), &me, Some(true)), Decision::Leave(w) if w.contains("node node-old still exists")));
    }
}
