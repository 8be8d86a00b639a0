//! The claims journey: a class that binds immediately, and claims that wait with a reason.
//!
//! - A class with `volumeBindingMode: Immediate` and `allowedTopologies` naming the real
//!   node: a claim of it is given that node by the elected agent (its selected-node
//!   annotation, a Normal `NodeSelected` Event), provisioned there before any pod exists
//!   (its PV pinned to the node), and a pod using it runs there and keeps what it wrote.
//! - Claims that wait, each with a Warning Event in drivelet's words, and no volume:
//!   a claim of the fstype vfat class (`NotSupportedByDrivelet`, naming "vfat" and "ext4
//!   or xfs", recorded once however many rounds pass); a claim of an Immediate class whose
//!   allowed topologies name a node that does not exist (`NoNodeForClaim`, naming it); a
//!   claim of the Immediate class larger than the real node can make (`NoNodeForClaim`,
//!   naming the node and how much it can make).
//!
//! Everything it makes is deleted at its end (claims, PVs, classes).

use std::time::Duration;

use super::*;

const NOW: &str = "drivelet-e2e-now";
const NOWHERE: &str = "drivelet-e2e-now-nowhere";

/// The journey's classes: Immediate, allowed on `node` (ext4), and Immediate allowed
/// only on a node that does not exist.
fn classes(node: &str) -> String {
    let class = |name: &str, allowed: &str| {
        format!(
            "apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: {name}
provisioner: {DRIVER}
parameters:
  media: virtual
  csi.storage.k8s.io/fstype: ext4
volumeBindingMode: Immediate
reclaimPolicy: Delete
allowedTopologies:
  - matchLabelExpressions:
      - key: {TOPOLOGY_KEY}
        values: [{allowed}]
---
"
        )
    };
    class(NOW, node) + &class(NOWHERE, "no-such-node")
}

/// The one Warning (or Normal) Event of `reason` on claim `name`, once there is one.
fn event_on(claim: &str, reason: &str, within: Duration) -> Result<Value, String> {
    wait_every(&format!("a {reason} Event on claim {claim}"), within, Duration::from_secs(1), || {
        Ok(events_for("PersistentVolumeClaim", claim, reason)?.into_iter().next())
    })
}

/// The Event's message must name each of `words`.
fn names(event: &Value, words: &[&str]) -> Check {
    let message = event["message"].as_str().unwrap_or_default();
    for w in words {
        ensure(message.contains(w), || format!("the Event does not name {w}: {message}"))?;
    }
    Ok(())
}

/// Checks that claim `name` has no volume and no node selected.
fn still_waiting(name: &str) -> Check {
    let c = get_json(&["get", "pvc", "-n", NS, name])?;
    ensure(c["status"]["phase"] == "Pending", || format!("claim {name} is not Pending: {}", c["status"]))?;
    ensure(c["spec"]["volumeName"].as_str().unwrap_or_default().is_empty(), || format!("claim {name} got a volume: {c}"))?;
    let selected = &c["metadata"]["annotations"]["volume.kubernetes.io/selected-node"];
    ensure(selected.is_null(), || format!("claim {name} got a node: {selected}"))
}

pub(crate) fn journey_claims_waiting(ctx: &mut Ctx) -> Check {
    let node = real_node().to_string();
    kubectl(&["create", "namespace", NS]).or_else(|e| if e.contains("AlreadyExists") { Ok(String::new()) } else { Err(e) })?;
    apply(&classes(&node))?;
    // Made before any pod: the claims wait for nothing but drivelet.
    apply(&(claim("now", NOW, 64, "Filesystem", "ReadWriteOnce")
        + &claim("fat", "drivelet-e2e-vfat", 64, "Filesystem", "ReadWriteOnce")
        + &claim("nowhere", NOWHERE, 64, "Filesystem", "ReadWriteOnce")
        + &claim("too-large", NOW, 64 * 1024, "Filesystem", "ReadWriteOnce")))?;

    // Immediate, allowed on the real node: given that node, provisioned there, no pod yet.
    let started = Instant::now();
    let pv = wait_every("claim now Bound", Duration::from_secs(180), Duration::from_secs(1), || {
        let c = get_json(&["get", "pvc", "-n", NS, "now"])?;
        Ok((c["status"]["phase"] == "Bound").then(|| c["spec"]["volumeName"].as_str().unwrap_or_default().to_string()))
    })?;
    ctx.measured.insert("Immediate claim bound (s)".into(), format!("{:.1}", started.elapsed().as_secs_f64()));
    let c = get_json(&["get", "pvc", "-n", NS, "now"])?;
    let selected = c["metadata"]["annotations"]["volume.kubernetes.io/selected-node"].as_str().unwrap_or_default().to_string();
    ensure(selected == node, || format!("claim now was given node {selected:?}, not {node}"))?;
    let pv_json = get_json(&["get", "pv", &pv])?;
    let pinned = pv_json["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"][0]
        .as_str()
        .unwrap_or_default()
        .to_string();
    ensure(pinned == node, || format!("PV {pv} is pinned to {pinned:?}, not {node}: {}", pv_json["spec"]["nodeAffinity"]))?;
    let selected_event = event_on("now", "NodeSelected", Duration::from_secs(30))?;
    names(&selected_event, &[&node, "binds immediately"])?;
    ctx.measured.insert("Immediate claim's NodeSelected Event".into(), selected_event["message"].as_str().unwrap_or_default().into());
    apply(&pod("now-pod", "now", false, "", "echo immediate > /data/f && sync"))?;
    wait_every("pod now-pod Running", Duration::from_secs(120), Duration::from_secs(1), || {
        let p = get_json(&["get", "pod", "-n", NS, "now-pod"])?;
        Ok((p["status"]["phase"] == "Running").then_some(()))
    })?;
    let p = get_json(&["get", "pod", "-n", NS, "now-pod"])?;
    ensure(p["spec"]["nodeName"] == node.as_str(), || format!("pod now-pod runs on {}, not {node}", p["spec"]["nodeName"]))?;
    let read = wait_for("the pod's write", Duration::from_secs(30), || {
        Ok(in_pod("now-pod", "cat /data/f").ok().filter(|s| s == "immediate"))
    })?;
    ensure(read == "immediate", || format!("read back {read:?}"))?;

    // A filesystem drivelet does not make: said on the claim, in words, once.
    let fat = event_on("fat", "NotSupportedByDrivelet", Duration::from_secs(90))?;
    names(&fat, &["\"vfat\"", "ext4 or xfs", "drivelet-e2e-vfat"])?;
    ensure(fat["type"] == "Warning", || format!("not a Warning: {fat}"))?;
    ctx.measured.insert("claim of an fstype vfat class, Event".into(), fat["message"].as_str().unwrap_or_default().into());

    // Allowed only on a node that does not exist.
    let nowhere = event_on("nowhere", "NoNodeForClaim", Duration::from_secs(90))?;
    names(&nowhere, &["no-such-node", "binds immediately", "no such node exists"])?;
    ensure(nowhere["type"] == "Warning", || format!("not a Warning: {nowhere}"))?;
    ctx.measured.insert("Immediate claim no node can serve, Event".into(), nowhere["message"].as_str().unwrap_or_default().into());

    // Larger than the allowed node can make.
    let large = event_on("too-large", "NoNodeForClaim", Duration::from_secs(90))?;
    names(&large, &[&node, "64.0 GiB", "can make at most"])?;
    ctx.measured.insert("Immediate claim too large for its node, Event".into(), large["message"].as_str().unwrap_or_default().into());

    // Two more rounds of the claim watch (10 s each): no claim warned again, none served.
    std::thread::sleep(Duration::from_secs(21));
    for (claim, reason) in [("fat", "NotSupportedByDrivelet"), ("nowhere", "NoNodeForClaim"), ("too-large", "NoNodeForClaim")] {
        still_waiting(claim)?;
        let evs = events_for("PersistentVolumeClaim", claim, reason)?;
        let count: u64 = evs.iter().map(|e| e["count"].as_u64().unwrap_or(1).max(1)).sum();
        ensure(evs.len() == 1 && count == 1, || format!("claim {claim}: {reason} recorded {count} times: {evs:?}"))?;
    }

    // Clean up: the pod, the claims, the PV, the classes.
    kubectl(&["delete", "pod", "-n", NS, "now-pod", "--wait=true", "--timeout=60s"])?;
    kubectl(&["delete", "pvc", "-n", NS, "now", "fat", "nowhere", "too-large", "--wait=true", "--timeout=60s"])?;
    wait_for(&format!("PV {pv} gone"), Duration::from_secs(90), || Ok(kubectl(&["get", "pv", &pv]).is_err().then_some(())))?;
    kubectl_stdin(&["delete", "--ignore-not-found", "-f", "-"], Some(&classes(&node)))?;
    Ok(())
}
