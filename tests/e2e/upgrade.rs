//! The upgrade from the two-container DaemonSet (drivelet and the csi-provisioner
//! sidecar, the pod of the releases before provisioning moved in process) to the
//! one-container DaemonSet, as a user does it: `kubectl apply -k` of the new manifest
//! over the old, then the sidecar's roles deleted by hand (deploy/README.md, "Upgrading
//! from the two-container DaemonSet").
//!
//! - Before: `tests/e2e/upgrade` (the suite's overlay with the sidecar, its roles, and
//!   drivelet leaving provisioning and capacity to it). A claim is provisioned by the
//!   sidecar and used by a pod that writes a marker; the sidecar's capacity objects show.
//! - After: the suite's overlay again. The pod runs drivelet alone; the claim's PV is the
//!   same object (uid, volume handle), the claim is not provisioned again (no Event of
//!   drivelet's about it), the pod kept running and reads its marker, the sidecar's
//!   capacity objects are gone and drivelet's are there; deleting the claim deletes the
//!   sidecar's PV and its volume, as for a PV drivelet made.
//!
//! What runs "before" is this release's image with the old manifest (what deploy/README.md
//! says about running the new image under it), not the previous release's binary: the
//! objects the sidecar made, and their handling after the switch, are what is proven.

use std::time::{Duration, Instant};

use super::{
    apply, capacity_object, claim, ctl_volumes, drivelet_pod, ensure, events_for, get_json, in_pod, kubectl, pod, pv_of, real_node,
    volume_id_of, wait_for, wait_pod_running, Check, Ctx, NS, SYSTEM_NS,
};

/// The sidecar's finalizer on the PVs it made, which drivelet keeps using.
const FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";

/// The containers of the one drivelet pod, once it is ready.
fn containers() -> Result<Vec<String>, String> {
    let name = drivelet_pod()?;
    let p = get_json(&["get", "pod", "-n", SYSTEM_NS, &name])?;
    Ok(p["spec"]["containers"].as_array().into_iter().flatten().filter_map(|c| c["name"].as_str().map(str::to_string)).collect())
}

/// The names of the sidecar's CSIStorageCapacity objects of the real node.
fn sidecar_capacities() -> Result<Vec<String>, String> {
    let label = format!("csi.storage.k8s.io/managed-by=external-provisioner-{}", real_node());
    let list = get_json(&["get", "csistoragecapacities", "-n", SYSTEM_NS, "-l", &label])?;
    Ok(list["items"].as_array().into_iter().flatten().filter_map(|o| o["metadata"]["name"].as_str().map(str::to_string)).collect())
}

fn rollout() -> Check {
    kubectl(&["rollout", "status", "-n", SYSTEM_NS, "ds/drivelet", "--timeout=120s"]).map(|_| ())
}

pub(crate) fn journey_upgrade(ctx: &mut Ctx) -> Check {
    let before_dir = ctx.root.join("tests/e2e/upgrade");
    let after_dir = ctx.overlay();

    // Before: the two-container pod.
    kubectl(&["apply", "-k", &before_dir.display().to_string()])?;
    rollout()?;
    wait_for("the drivelet pod with the csi-provisioner sidecar Ready", Duration::from_secs(90), || {
        Ok(containers().ok().filter(|c| c == &["drivelet", "csi-provisioner"]).map(|_| ()))
    })?;
    apply(&(claim("up-old", "drivelet-e2e-ext4", 64, "Filesystem", "ReadWriteOnce")
        + &pod("up-old", "up-old", false, "", "echo before-upgrade > /data/marker && sync")))?;
    wait_pod_running("up-old", Duration::from_secs(120))?;
    let pv_name = pv_of("up-old")?;
    let pv = get_json(&["get", "pv", &pv_name])?;
    let (uid, handle) = (pv["metadata"]["uid"].clone(), pv["spec"]["csi"]["volumeHandle"].clone());
    ensure(pv["metadata"]["finalizers"].as_array().is_some_and(|f| f.iter().any(|f| f == FINALIZER)), || format!("the sidecar's PV has no {FINALIZER}: {pv}"))?;
    let made = events_for("PersistentVolumeClaim", "up-old", "ProvisioningSucceeded")?;
    ensure(made.len() == 1 && made[0]["message"].as_str().is_some_and(|m| m.starts_with("Successfully provisioned")), || {
        format!("the claim was not provisioned by the sidecar alone: {made:?}")
    })?;
    wait_for("the sidecar's CSIStorageCapacity objects of the node", Duration::from_secs(60), || Ok((!sidecar_capacities()?.is_empty()).then_some(())))?;

    // The upgrade, as deploy/README.md says: apply the new manifest, delete the sidecar's roles.
    let t = Instant::now();
    kubectl(&["apply", "-k", &after_dir])?;
    rollout()?;
    wait_for("the drivelet pod Ready with drivelet alone", Duration::from_secs(90), || {
        Ok(containers().ok().filter(|c| c == &["drivelet"]).map(|_| ()))
    })?;
    ctx.measured.insert("upgrade from the two-container DaemonSet: apply -> one-container pod Ready".into(), format!("{:.1}s", t.elapsed().as_secs_f64()));
    kubectl(&["delete", "clusterrole,clusterrolebinding", "drivelet-external-provisioner"])?;
    kubectl(&["delete", "-n", SYSTEM_NS, "role,rolebinding", "drivelet-external-provisioner"])?;

    // Every object kept and served; nothing provisioned again.
    let now = get_json(&["get", "pv", &pv_name])?;
    ensure(now["metadata"]["uid"] == uid && now["spec"]["csi"]["volumeHandle"] == handle, || format!("PV {pv_name} was made again: {now}"))?;
    ensure(pv_of("up-old")? == pv_name, || "the claim is bound to another PV".into())?;
    let p = get_json(&["get", "pod", "-n", NS, "up-old"])?;
    ensure(p["status"]["phase"] == "Running", || format!("the claim's pod stopped in the upgrade: {}", p["status"]))?;
    ensure(in_pod("up-old", "cat /data/marker")? == "before-upgrade", || "the marker written before the upgrade is not read after it".into())?;
    ensure(in_pod("up-old", "echo after-upgrade > /data/after && sync && cat /data/after")? == "after-upgrade", || "the volume is not writable after the upgrade".into())?;
    let made = events_for("PersistentVolumeClaim", "up-old", "ProvisioningSucceeded")?;
    ensure(made.len() == 1, || format!("the claim was provisioned again after the upgrade: {made:?}"))?;
    let id = volume_id_of("up-old")?;
    ensure(ctl_volumes()?.iter().any(|v| v["id"] == id.as_str()), || format!("drivelet does not serve the sidecar's volume {id}"))?;
    wait_for("the sidecar's CSIStorageCapacity objects deleted by drivelet", Duration::from_secs(30), || {
        let left = sidecar_capacities()?;
        if left.is_empty() {
            Ok(Some(()))
        } else {
            Err(format!("left: {left:?}"))
        }
    })?;
    wait_for("drivelet's own CSIStorageCapacity of the ext4 class", Duration::from_secs(30), || Ok(capacity_object("drivelet-e2e-ext4")?.map(|_| ())))?;

    // The sidecar's PV is deleted as one drivelet made: volume first, then the PV.
    kubectl(&["delete", "pod", "-n", NS, "up-old", "--wait=true", "--timeout=60s"])?;
    kubectl(&["delete", "pvc", "-n", NS, "up-old", "--wait=true", "--timeout=60s"])?;
    let t = Instant::now();
    wait_for(&format!("the sidecar's PV {pv_name} deleted"), Duration::from_secs(90), || Ok(kubectl(&["get", "pv", &pv_name]).is_err().then_some(())))?;
    ctx.measured.insert("upgrade: the sidecar's claim deleted -> its PV gone".into(), format!("{:.1}s", t.elapsed().as_secs_f64()));
    ensure(!ctl_volumes()?.iter().any(|v| v["id"] == id.as_str()), || format!("the sidecar's volume {id} is left after its PV went"))
}
