//! The snapshot journey (issue 25): VolumeSnapshots of claims through the cluster's
//! snapshot-controller (v8.2.0, no distributed snapshotting) and drivelet's in-process
//! snapshotter, restored through the real external-provisioner, for ext4, xfs and block,
//! with the classes of `deploy/snapshots` (`drivelet-snapshot`, the default, and
//! `drivelet-snapshot-freeze`):
//! - pods write data into an ext4, an xfs and a block claim (random bytes and their
//!   checksum);
//! - a snapshot of the ext4 claim in use with the default class is refused: a
//!   `SnapshotCreationFailed` Warning on the VolumeSnapshot says how to get one
//!   (`drivelet.io/freeze`), and the VolumeSnapshot deleted goes away cleanly;
//! - the ext4 and xfs claims in use are snapshotted with the freeze class, the block
//!   claim (which cannot be frozen) once its writer is gone, with the default class: each
//!   VolumeSnapshot becomes readyToUse, its content is labelled with the node, and the
//!   `SnapshotTaken` Event names the node, the size and, for the frozen ones, the stall;
//! - the pods write more; then the source pods and claims are deleted, and the drivelet
//!   pod is restarted: the snapshots are still ready and listed by `ctl snapshots`;
//! - claims restored from the snapshots (pods pinned to the node) hold exactly the first
//!   data (checksums; the later writes absent);
//! - the restores deleted, then the VolumeSnapshots: their contents and snapshots go, and
//!   GetCapacity and CSIStorageCapacity give their space back (exactly the snapshots'
//!   size on the drives, once the cleaner has zeroed it: measured on a node with nothing
//!   being cleaned).
//!
//! It runs on the real node (pods must run), in the real node's chain of journeys: the
//! journeys beside it there assert exact capacities and restart the drivelet pod, so it
//! cannot run at the same time as they do; it runs beside the journeys across nodes.
//! Every wait polls the API (no fixed sleep).

use super::*;

const SNAP_NODE_LABEL: &str = "drivelet.io/node";

/// A VolumeSnapshot of claim `source` with `class`.
fn volume_snapshot(name: &str, source: &str, class: &str) -> String {
    format!(
        "apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata:
  name: {name}
  namespace: {NS}
spec:
  volumeSnapshotClassName: {class}
  source:
    persistentVolumeClaimName: {source}
---
"
    )
}

/// A claim of `class` restored from VolumeSnapshot `snapshot`.
fn restore_claim(name: &str, class: &str, size_mib: u64, mode: &str, snapshot: &str) -> String {
    let plain = claim(name, class, size_mib, mode, "ReadWriteOnce");
    let spec = plain.strip_suffix("---\n").expect("a claim ends its YAML document with ---");
    format!("{spec}  dataSource:\n    apiGroup: snapshot.storage.k8s.io\n    kind: VolumeSnapshot\n    name: {snapshot}\n---\n")
}

fn snapshot_json(name: &str) -> Result<Value, String> {
    get_json(&["get", "volumesnapshot", "-n", NS, name])
}

/// Waits until VolumeSnapshot `name` is readyToUse; its content's name.
fn wait_ready(name: &str, timeout: Duration) -> Result<String, String> {
    wait_for(&format!("VolumeSnapshot {name} readyToUse"), timeout, || {
        let s = snapshot_json(name)?;
        let content = s["status"]["boundVolumeSnapshotContentName"].as_str().map(str::to_string);
        if s["status"]["readyToUse"] == true {
            return Ok(content);
        }
        Err(format!("status {}", s["status"]))
    })
}

/// `ctl snapshots` in the drivelet pod.
fn ctl_snapshots() -> Result<Vec<Value>, String> {
    Ok(drivelet_json(&["ctl", "-c", CONFIG, "snapshots"])?.as_array().cloned().unwrap_or_default())
}

/// The note of the first `reason` Event on VolumeSnapshot `name`, once there is one.
fn wait_event(name: &str, reason: &str, timeout: Duration) -> Result<String, String> {
    wait_for(&format!("a {reason} Event on VolumeSnapshot {name}"), timeout, || {
        let ev = events_for("VolumeSnapshot", name, reason)?;
        Ok(ev.first().map(|e| e["message"].as_str().unwrap_or_default().to_string()))
    })
}

/// The freeze stall in a `SnapshotTaken` note ("frozen for N ms"), if it says one.
fn stall_ms(note: &str) -> Option<u64> {
    let rest = note.split("frozen for ").nth(1)?;
    rest.split(' ').next()?.parse().ok()
}

/// Waits until no drive of the node has space being cleaned (freed space is handed out,
/// and counted in GetCapacity, once it is zeroed).
fn wait_clean(what: &str) -> Check {
    wait_for(&format!("{what} cleaned"), Duration::from_secs(120), || {
        let busy: Vec<String> = ctl_drives()?.iter().filter(|d| !d["cleaning"].is_null()).map(|d| format!("{}: {}", d["id"], d["cleaning"])).collect();
        if busy.is_empty() {
            return Ok(Some(()));
        }
        Err(busy.join("; "))
    })
}

struct Source {
    /// Claim, pod, VolumeSnapshot, restored claim and its pod share this stem.
    stem: &'static str,
    class: &'static str,
    size_mib: u64,
    block: bool,
}

const SOURCES: [Source; 3] = [
    Source { stem: "snap-ext4", class: "drivelet-e2e-ext4", size_mib: 64, block: false },
    Source { stem: "snap-xfs", class: "drivelet-e2e-xfs", size_mib: 320, block: false },
    Source { stem: "snap-block", class: "drivelet-e2e-ext4", size_mib: 32, block: true },
];

/// The first data: 8 MiB of random bytes (at the start of a block device) and the
/// checksum, kept where [`SUM`] reads it.
const WRITE_FS: &str = "dd if=/dev/urandom of=/data/blob bs=1M count=8 2>/dev/null && md5sum /data/blob | cut -d' ' -f1 > /data/sum && sync";
const WRITE_BLOCK: &str =
    "dd if=/dev/urandom of=/dev/e2e-block bs=1M count=8 conv=fsync 2>/dev/null && dd if=/dev/e2e-block bs=1M count=8 2>/dev/null | md5sum | cut -d' ' -f1 > /tmp/sum";
/// The later writes: the blob changed and a new file (a block device overwritten).
const MORE_FS: &str = "dd if=/dev/urandom of=/data/blob bs=1M count=2 conv=notrunc 2>/dev/null && echo later > /data/more && sync";
const MORE_BLOCK: &str = "dd if=/dev/urandom of=/dev/e2e-block bs=1M count=8 conv=fsync 2>/dev/null";
/// What a restored claim holds: the blob's checksum, the one recorded, and whether the
/// later file is there.
const READ_FS: &str = "md5sum /data/blob | cut -d' ' -f1; cat /data/sum; [ -e /data/more ] && echo more || echo no-more";
const READ_BLOCK: &str = "dd if=/dev/e2e-block bs=1M count=8 2>/dev/null | md5sum | cut -d' ' -f1";

fn sum_of(s: &Source) -> Result<String, String> {
    let script = if s.block { "cat /tmp/sum" } else { "cat /data/sum" };
    wait_for(&format!("the checksum written in {}", s.stem), Duration::from_secs(30), || {
        Ok(in_pod(s.stem, script).ok().filter(|v| v.len() == 32))
    })
}

pub(super) fn journey_snapshots(ctx: &mut Ctx) -> Check {
    kubectl(&["create", "namespace", NS]).or_else(|e| if e.contains("AlreadyExists") { Ok(String::new()) } else { Err(e) })?;
    let classes = kubectl(&["get", "volumesnapshotclass", "-o", "name"])?;
    ensure(classes.contains("drivelet-snapshot\n") && classes.contains("drivelet-snapshot-freeze"), || {
        format!("the VolumeSnapshotClasses of deploy/snapshots are not installed: {classes}")
    })?;

    // Pods write the first data.
    let mut objects = String::new();
    for s in &SOURCES {
        let mode = if s.block { "Block" } else { "Filesystem" };
        objects += &claim(s.stem, s.class, s.size_mib, mode, "ReadWriteOnce");
        objects += &pod(s.stem, s.stem, s.block, "", if s.block { WRITE_BLOCK } else { WRITE_FS });
    }
    apply(&objects)?;
    for s in &SOURCES {
        wait_pod_running(s.stem, Duration::from_secs(120))?;
    }
    let sums: Vec<String> = SOURCES.iter().map(sum_of).collect::<Result<_, _>>()?;

    // The ext4 claim in use, with the default class: refused, saying how to get one.
    apply(&volume_snapshot("snap-refused", "snap-ext4", "drivelet-snapshot"))?;
    let refused = wait_event("snap-refused", "SnapshotCreationFailed", Duration::from_secs(60))?;
    ensure(refused.contains("drivelet.io/freeze") && refused.contains("mounted read-write"), || format!("the refusal does not say how to get a snapshot: {refused}"))?;
    println!("e2e:   refused while in use: {refused}");
    let s = snapshot_json("snap-refused")?;
    ensure(s["status"]["readyToUse"] != true, || format!("the refused snapshot is ready: {}", s["status"]))?;
    kubectl(&["delete", "volumesnapshot", "-n", NS, "snap-refused", "--wait=true", "--timeout=60s"])?;

    // The block writer goes (a block volume in use cannot be frozen); the three are
    // snapshotted at once: ext4 and xfs in use, frozen; block unused.
    kubectl(&["delete", "pod", "-n", NS, "snap-block", "--wait=true", "--timeout=60s"])?;
    super::clone::wait_unused("snap-block")?;
    let t = Instant::now();
    let mut objects = volume_snapshot("snap-ext4", "snap-ext4", "drivelet-snapshot-freeze");
    objects += &volume_snapshot("snap-xfs", "snap-xfs", "drivelet-snapshot-freeze");
    objects += &volume_snapshot("snap-block", "snap-block", "drivelet-snapshot");
    apply(&objects)?;
    let mut contents = Vec::new();
    for s in &SOURCES {
        let content = wait_ready(s.stem, Duration::from_secs(120))?;
        ctx.measured.insert(format!("VolumeSnapshot of {} created -> readyToUse", s.stem), format!("{:.1}s", t.elapsed().as_secs_f64()));
        let c = get_json(&["get", "volumesnapshotcontent", &content])?;
        ensure(c["metadata"]["labels"][SNAP_NODE_LABEL] == ctx.node.as_str(), || format!("content {content} is not labelled with node {}: {}", ctx.node, c["metadata"]))?;
        ensure(c["metadata"]["annotations"]["snapshot.storage.kubernetes.io/volumesnapshot-being-created"].is_null(), || {
            format!("content {content} keeps the being-created annotation")
        })?;
        let size = c["status"]["restoreSize"].as_u64().unwrap_or(0);
        ensure(size == s.size_mib * MIB, || format!("content {content}: restoreSize {size}, want {} MiB", s.size_mib))?;
        let note = wait_event(s.stem, "SnapshotTaken", Duration::from_secs(30))?;
        ensure(note.contains(&format!("on node {}", ctx.node)) && note.contains(" MiB"), || format!("SnapshotTaken of {}: {note}", s.stem))?;
        match (s.block, stall_ms(&note)) {
            (false, Some(ms)) => {
                ctx.measured.insert(format!("freeze stall of {} in use (from its Event)", s.stem), format!("{ms} ms"));
            }
            (true, None) => {}
            (block, stall) => return Err(format!("SnapshotTaken of {} (block: {block}) tells stall {stall:?}: {note}", s.stem)),
        }
        contents.push(content);
    }

    // More data after the snapshots: a new block writer, the fs pods write on.
    apply(&pod("snap-block2", "snap-block", true, "", MORE_BLOCK))?;
    for s in SOURCES.iter().filter(|s| !s.block) {
        in_pod(s.stem, MORE_FS)?;
    }
    wait_pod_running("snap-block2", Duration::from_secs(120))?;
    wait_for("the block claim overwritten", Duration::from_secs(30), || {
        Ok(in_pod("snap-block2", READ_BLOCK).ok().filter(|v| v.len() == 32 && *v != sums[2]).map(|_| ()))
    })?;

    // The sources go, then the drivelet pod: the snapshots stay.
    let source_pvs: Vec<String> = SOURCES.iter().filter_map(|s| pv_of(s.stem).ok()).collect();
    kubectl(&["delete", "pod", "-n", NS, "snap-ext4", "snap-xfs", "snap-block2", "--wait=true", "--timeout=60s"])?;
    kubectl(&["delete", "pvc", "-n", NS, "snap-ext4", "snap-xfs", "snap-block", "--wait=true", "--timeout=90s"])?;
    wait_for("the source claims' PVs gone", Duration::from_secs(90), || Ok(source_pvs.iter().all(|pv| kubectl(&["get", "pv", pv]).is_err()).then_some(())))?;
    let before = drivelet_pod()?;
    kubectl(&["delete", "pod", "-n", SYSTEM_NS, &before, "--wait=true", "--timeout=60s"])?;
    wait_for("a new drivelet pod Ready", Duration::from_secs(90), || Ok(drivelet_pod().ok().filter(|p| *p != before)))?;
    let held = ctl_snapshots()?;
    let handles: Vec<String> = contents
        .iter()
        .map(|c| get_json(&["get", "volumesnapshotcontent", c]).map(|v| v["status"]["snapshotHandle"].as_str().unwrap_or_default().to_string()))
        .collect::<Result<_, _>>()?;
    for h in &handles {
        ensure(held.iter().any(|s| s["id"] == h.as_str() && s["state"] == "ready"), || format!("after the restart drivelet does not hold snapshot {h} ready: {held:?}"))?;
    }
    for s in &SOURCES {
        ensure(snapshot_json(s.stem)?["status"]["readyToUse"] == true, || format!("VolumeSnapshot {} not ready after the restart", s.stem))?;
    }

    // Restored claims, their pods pinned to the node, hold exactly the first data.
    let t = Instant::now();
    let mut objects = String::new();
    for s in &SOURCES {
        let mode = if s.block { "Block" } else { "Filesystem" };
        let name = format!("{}-restored", s.stem);
        objects += &restore_claim(&name, s.class, s.size_mib, mode, s.stem);
        objects += &pod(&name, &name, s.block, "", "true");
    }
    apply(&objects)?;
    for (s, sum) in SOURCES.iter().zip(&sums) {
        let name = format!("{}-restored", s.stem);
        wait_pod_running(&name, Duration::from_secs(180))?;
        ctx.measured.insert(format!("restore of {} -> pod Running", s.stem), format!("{:.1}s", t.elapsed().as_secs_f64()));
        let got = in_pod(&name, if s.block { READ_BLOCK } else { READ_FS })?;
        let want = if s.block { sum.clone() } else { format!("{sum}\n{sum}\nno-more") };
        ensure(got == want, || format!("claim {name} reads {got:?}, the snapshot held {want:?}"))?;
    }

    // The restores deleted, then the VolumeSnapshots: contents, snapshots and their space go.
    let restored: Vec<String> = SOURCES.iter().map(|s| format!("{}-restored", s.stem)).collect();
    let restored_pvs: Vec<String> = restored.iter().filter_map(|c| pv_of(c).ok()).collect();
    let mut del = vec!["delete", "pod", "-n", NS, "--wait=true", "--timeout=60s"];
    del.extend(restored.iter().map(String::as_str));
    kubectl(&del)?;
    let mut del = vec!["delete", "pvc", "-n", NS, "--wait=true", "--timeout=90s"];
    del.extend(restored.iter().map(String::as_str));
    kubectl(&del)?;
    wait_for("the restored claims' PVs gone", Duration::from_secs(90), || Ok(restored_pvs.iter().all(|pv| kubectl(&["get", "pv", pv]).is_err()).then_some(())))?;
    // Freed space counts once the cleaner has zeroed it: measure from a quiet node.
    wait_clean("the restored claims' space")?;
    let on_drive: u64 = ctl_snapshots()?.iter().filter(|s| handles.iter().any(|h| s["id"] == h.as_str())).map(|s| s["size"].as_u64().unwrap_or(0)).sum();
    let (cap_before, _) = get_capacity()?;
    let t = Instant::now();
    kubectl(&["delete", "volumesnapshot", "-n", NS, "snap-ext4", "snap-xfs", "snap-block", "--wait=true", "--timeout=90s"])?;
    wait_for("the snapshot contents gone", Duration::from_secs(90), || {
        Ok(contents.iter().all(|c| kubectl(&["get", "volumesnapshotcontent", c]).is_err()).then_some(()))
    })?;
    let left: Vec<Value> = ctl_snapshots()?.into_iter().filter(|s| handles.iter().any(|h| s["id"] == h.as_str())).collect();
    ensure(left.is_empty(), || format!("snapshots left after their VolumeSnapshots were deleted: {left:?}"))?;
    wait_clean("the deleted snapshots' space")?;
    let (cap, _) = get_capacity()?;
    ensure(cap == cap_before + on_drive, || format!("GetCapacity {cap_before} -> {cap} after deleting snapshots of {on_drive} bytes"))?;
    wait_for("CSIStorageCapacity follows the space the snapshots freed", Duration::from_secs(60), || {
        Ok(capacity_object("drivelet-e2e-ext4")?.filter(|c| c.0 == cap).map(|_| ()))
    })?;
    ctx.measured.insert("VolumeSnapshots deleted -> CSIStorageCapacity updated".into(), format!("{:.1}s", t.elapsed().as_secs_f64()));
    Ok(())
}
