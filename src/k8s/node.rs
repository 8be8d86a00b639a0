//! Labelling this node's Node object with drivelet's topology segments (`label_node`).
//!
//! Rules:
//! - Only the operator's choice: nothing is written unless `kubernetes.label_node` is on.
//! - Only our keys are written (the `driver.topology` keys and
//!   `topology.drivelet.io/node`), with a merge patch, so other labels are untouched;
//!   a label already carrying the value is not written again.
//! - A failure is retried with backoff until it succeeds or the agent stops; the node
//!   serves CSI meanwhile (kubelet still learns the topology through NodeGetInfo).
//! - The retry is the shell's policy ([`RetryPolicy::backoff`], `kubernetes.retry_base`
//!   .. `retry_cap`); the loop itself is a task spawned once, not a controller of the
//!   shell: one object written once needs no watch and no queue.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::Client;
use serde_json::{json, Value};
use tracing::{info, warn};

use crate::k8s::shell::RetryPolicy;

/// The merge patch setting `wanted` on a node that has `current` labels; `None` when
/// every label already has its value.
pub(crate) fn label_patch(current: Option<&BTreeMap<String, String>>, wanted: &BTreeMap<String, String>) -> Option<Value> {
    let missing: BTreeMap<&String, &String> =
        wanted.iter().filter(|(k, v)| current.and_then(|c| c.get(*k)) != Some(*v)).collect();
    if missing.is_empty() {
        None
    } else {
        Some(json!({ "metadata": { "labels": missing } }))
    }
}

/// Reads the node and writes the labels it lacks.
pub(crate) async fn label_once(client: &Client, node: &str, wanted: &BTreeMap<String, String>) -> Result<bool, kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let current = nodes.get(node).await?;
    let Some(patch) = label_patch(current.metadata.labels.as_ref(), wanted) else { return Ok(false) };
    nodes.patch(node, &PatchParams::default(), &Patch::Merge(patch)).await?;
    Ok(true)
}

/// Labels the node, retrying with the policy's backoff until it works.
pub(crate) async fn label_node(client: Client, node: String, wanted: BTreeMap<String, String>, policy: RetryPolicy) {
    let mut attempt = 0;
    loop {
        match label_once(&client, &node, &wanted).await {
            Ok(written) => {
                info!(node.name = %node, labels = ?wanted, written, "node carries drivelet's topology labels");
                return;
            }
            Err(e) => {
                let after = policy.backoff(attempt);
                warn!(node.name = %node, error = %e, retry.after_ms = after.as_millis() as u64, "cannot label the node; retrying");
                tokio::time::sleep(after).await;
                attempt = attempt.saturating_add(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use http::Method;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use crate::k8s::fake_api::{fake_api, respond, respond_error};

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn patch_holds_only_labels_that_are_missing_or_different() {
        let wanted = labels(&[("topology.drivelet.io/node", "n1"), ("example.com/rack", "r7")]);
        assert_eq!(
            label_patch(None, &wanted),
            Some(json!({"metadata": {"labels": {"topology.drivelet.io/node": "n1", "example.com/rack": "r7"}}}))
        );
        let current = labels(&[("topology.drivelet.io/node", "n1"), ("example.com/rack", "r6"), ("other", "x")]);
        assert_eq!(label_patch(Some(&current), &wanted), Some(json!({"metadata": {"labels": {"example.com/rack": "r7"}}})));
        let done = labels(&[("topology.drivelet.io/node", "n1"), ("example.com/rack", "r7")]);
        assert_eq!(label_patch(Some(&done), &wanted), None);
    }

    #[tokio::test(start_paused = true)]
    async fn node_is_read_then_patched_with_the_missing_labels_after_a_failure() {
        let (client, mut api) = fake_api();
        let wanted = labels(&[("topology.drivelet.io/node", "n1")]);
        let policy = RetryPolicy { base: Duration::from_secs(1), cap: Duration::from_secs(8), ..Default::default() };
        let task = tokio::spawn(label_node(client, "n1".into(), wanted, policy));

        let call = api.next("node read").await;
        assert_eq!(call.method, Method::GET);
        assert_eq!(call.path(), "/api/v1/nodes/n1");
        respond_error(call.reply, 503, "the API server is unavailable");

        let call = api.next("node read again after the backoff").await;
        assert_eq!(call.path(), "/api/v1/nodes/n1");
        let node = Node {
            metadata: ObjectMeta { name: Some("n1".into()), labels: Some(labels(&[("kubernetes.io/hostname", "n1")])), ..Default::default() },
            ..Default::default()
        };
        respond(call.reply, &node);

        let call = api.next("node patch").await;
        assert_eq!(call.method, Method::PATCH);
        assert_eq!(call.path(), "/api/v1/nodes/n1");
        assert_eq!(call.headers["content-type"], "application/merge-patch+json");
        assert_eq!(call.body, json!({"metadata": {"labels": {"topology.drivelet.io/node": "n1"}}}));
        respond(call.reply, &node);
        task.await.expect("labelling ends once written");
    }
}
