//! The resize journey: claims grown by editing them, through drivelet's in-process
//! resizer and kubelet's NodeExpandVolume, on empty drives (it runs right after
//! deploy and leaves the drives empty again):
//! (a) an xfs claim in use by a pod grows and the pod's `df` shows the new size;
//! (b) an ext4 claim grows while no pod uses it (the kit withholds CAP_SYS_RESOURCE, so
//!     a mounted ext4 cannot grow): `FileSystemResizePending` until a pod starts, then
//!     the pod sees the new size and the data;
//! (c) a request larger than the drive: a `VolumeResizeFailed` Event saying why, and no
//!     change (PV capacity, partition); lowered again (above `status.capacity`), the
//!     claim grows to it;
//! (d) an xfs claim in use with another claim's volume right after it on its drive, grown
//!     past that: it can grow only by moving, which needs it unused, so the claim gets
//!     one `VolumeResizeDeferred` Event and the annotation `drivelet.io/resize-deferred`,
//!     and nothing changes; once its pod is deleted (unstaged, detached) the resizer's
//!     next try moves it to a bigger extent and grows it: the same volume id on another
//!     place, the annotation gone, a `VolumeMoved` Event saying where it went and the
//!     size it grew to, and a new pod sees the new size and the data.
//!
//! They overlap: (a) and (c) wait for kubelet's next look at their pods (a minute or
//! more) side by side, and (b) and (d) run meanwhile; each claim is made once the one
//! before has grown its partition, so none is placed where another must grow (but for
//! (d)'s, on purpose).
//!
//! Measured: claim edited -> PV capacity written, and -> the pod's `df` shows the size.

use super::*;

/// The claim's JSON.
fn claim_json(name: &str) -> Result<Value, String> {
    get_json(&["get", "pvc", "-n", NS, name])
}

/// Sets claim `name`'s request.
fn request(name: &str, size: &str) -> Check {
    let patch = format!(r#"{{"spec":{{"resources":{{"requests":{{"storage":"{size}"}}}}}}}}"#);
    kubectl(&["patch", "pvc", "-n", NS, name, "--type", "merge", "-p", &patch]).map(|_| ())
}

/// The PV's `spec.capacity.storage` in bytes.
fn pv_capacity(pv: &str) -> Result<u64, String> {
    let v = get_json(&["get", "pv", pv])?;
    parse_quantity(v["spec"]["capacity"]["storage"].as_str().unwrap_or("0"))
}

/// Total bytes of /data as `df` in the pod shows them.
fn df_bytes(pod: &str) -> Result<u64, String> {
    let kib = in_pod(pod, "df -k /data | tail -n 1 | awk '{print $2}'")?;
    kib.trim().parse::<u64>().map(|k| k * 1024).map_err(|e| format!("df in pod {pod}: {kib:?}: {e}"))
}

/// Waits until the claim's `status.capacity` is `want` and no resize is in progress.
fn wait_claim_done(name: &str, want: u64) -> Check {
    wait_for(&format!("claim {name}: status.capacity {want} and the resize finished"), Duration::from_secs(90), || {
        let c = claim_json(name)?;
        let cap = parse_quantity(c["status"]["capacity"]["storage"].as_str().unwrap_or("0"))?;
        let state = &c["status"]["allocatedResourceStatuses"]["storage"];
        let conditions = c["status"]["conditions"].as_array().map_or(0, Vec::len);
        if cap == want && state.is_null() && conditions == 0 {
            return Ok(Some(()));
        }
        Err(format!("capacity {cap}, status {state}, conditions {}", c["status"]["conditions"]))
    })
}

/// The message of the first Event of `reason` on claim `claim`, once there is one.
fn first_event_message(claim: &str, reason: &str, timeout: Duration) -> Result<String, String> {
    let event = wait_for(&format!("a {reason} Event on claim {claim}"), timeout, || {
        Ok(events_for("PersistentVolumeClaim", claim, reason)?.first().cloned())
    })?;
    Ok(event["message"].as_str().unwrap_or_default().to_string())
}

fn reasons_on(claim: &str) -> Result<Vec<String>, String> {
    let sel = format!("involvedObject.kind=PersistentVolumeClaim,involvedObject.name={claim}");
    let ev = get_json(&["get", "events", "-n", NS, "--field-selector", &sel])?;
    Ok(ev["items"].as_array().into_iter().flatten().filter_map(|e| e["reason"].as_str().map(str::to_string)).collect())
}

/// Deletes pods and claims and waits until their PVs (and so the partitions) are gone.
fn delete_all(pods: &[&str], claims: &[&str]) -> Check {
    let pvs: Vec<String> = claims.iter().filter_map(|c| pv_of(c).ok()).collect();
    for p in pods {
        kubectl(&["delete", "pod", "-n", NS, p, "--ignore-not-found", "--wait=true", "--timeout=60s"])?;
    }
    for c in claims {
        kubectl(&["delete", "pvc", "-n", NS, c, "--ignore-not-found", "--wait=true", "--timeout=60s"])?;
    }
    wait_for("the resized claims' PVs gone", Duration::from_secs(90), || Ok(pvs.iter().all(|pv| kubectl(&["get", "pv", pv]).is_err()).then_some(())))
}

/// (d): a claim in use that only a move can grow waits, told so once, and grows by
/// moving once its pod is gone.
fn grows_by_moving_once_unused(ctx: &mut Ctx) -> Check {
    apply(&(claim("move-xfs", "drivelet-e2e-xfs", 320, "Filesystem", "ReadWriteOnce")
        + &pod("move-xfs", "move-xfs", false, "", "echo kept-moved > /data/kept && sync")))?;
    wait_pod_running("move-xfs", Duration::from_secs(120))?;
    // A neighbour right after it: the tightest drive that fits is the one it is on, at
    // the start of the free space after it.
    apply(&(claim("move-neighbour", "drivelet-e2e-xfs", 320, "Filesystem", "ReadWriteOnce")
        + &pod("move-neighbour", "move-neighbour", false, "", "true")))?;
    wait_pod_running("move-neighbour", Duration::from_secs(120))?;
    let (rec, next) = (record_of("move-xfs")?, record_of("move-neighbour")?);
    let end = rec["start"].as_u64().unwrap_or(0) + rec["size"].as_u64().unwrap_or(0);
    ensure(next["drive_id"] == rec["drive_id"] && next["start"].as_u64() == Some(end), || {
        format!("the journey needs the neighbour right after the volume on its drive; placement put them at {rec} and {next}")
    })?;
    let (id, from_drive, from_start) = (rec["id"].clone(), rec["drive_id"].clone(), rec["start"].clone());
    let pv = pv_of("move-xfs")?;
    let before = df_bytes("move-xfs")?;
    request("move-xfs", "960Mi")?;
    let note = first_event_message("move-xfs", "VolumeResizeDeferred", Duration::from_secs(60))?;
    ensure(note.contains("once no pod uses it"), || format!("the Event does not say when it grows: {note:?}"))?;
    println!("e2e:   VolumeResizeDeferred: {note}");
    let c = claim_json("move-xfs")?;
    ensure(c["metadata"]["annotations"]["drivelet.io/resize-deferred"] == (960 * MIB).to_string().as_str(), || {
        format!("the waiting claim does not carry the size it was told of: {}", c["metadata"])
    })?;
    ensure(pv_capacity(&pv)? == 320 * MIB && record_of("move-xfs")?["start"] == from_start, || "the volume changed while in use".into())?;
    // Retries while it waits tell the claim nothing more.
    std::thread::sleep(Duration::from_secs(4));
    let told = events_for("PersistentVolumeClaim", "move-xfs", "VolumeResizeDeferred")?;
    ensure(told.len() == 1 && told[0]["count"].as_u64().unwrap_or(1) == 1, || format!("told more than once: {told:?}"))?;

    let t = Instant::now();
    kubectl(&["delete", "pod", "-n", NS, "move-xfs", "--wait=true", "--timeout=60s"])?;
    wait_for("moved and grown: PV capacity 960Mi", Duration::from_secs(90), || Ok((pv_capacity(&pv)? == 960 * MIB).then_some(())))?;
    let to_pv = t.elapsed();
    let moved = record_of("move-xfs")?;
    ensure(moved["id"] == id && moved["size"].as_u64() == Some(960 * MIB), || format!("not the same volume at 960 MiB: {moved}"))?;
    ensure(moved["drive_id"] != from_drive || moved["start"] != from_start, || format!("the volume did not move: {moved}"))?;
    let c = claim_json("move-xfs")?;
    ensure(c["metadata"]["annotations"].get("drivelet.io/resize-deferred").is_none(), || format!("the annotation stayed after the growth: {}", c["metadata"]))?;
    let said = first_event_message("move-xfs", "VolumeMoved", Duration::from_secs(30))?;
    ensure(said.contains("to grow to 960.0 MiB"), || format!("the VolumeMoved Event does not say the growth: {said:?}"))?;
    apply(&pod("move-xfs-again", "move-xfs", false, "", "true"))?;
    wait_pod_running("move-xfs-again", Duration::from_secs(120))?;
    // xfs's df leaves out its log (sized at mkfs): the growth shows as the 640 MiB added.
    let df = wait_for("the moved volume's df shows the new size", Duration::from_secs(120), || {
        let d = df_bytes("move-xfs-again")?;
        if d > before + 600 * MIB {
            return Ok(Some(d));
        }
        Err(format!("df shows {d} bytes, {before} before the growth"))
    })?;
    ensure(in_pod("move-xfs-again", "cat /data/kept")? == "kept-moved", || "data lost in the move".into())?;
    wait_claim_done("move-xfs", 960 * MIB)?;
    ctx.measured.insert("resize by a move once unused: pod deleted -> PV capacity".into(), format!("{to_pv:.2?}"));
    let (from, to) = (from_drive.as_str().unwrap_or_default(), moved["drive_id"].as_str().unwrap_or_default());
    println!("e2e:   {} -> {} bytes by a move from {from} to {to} once its pod was gone ({before} -> {df} by df)", 320 * MIB, 960 * MIB);
    Ok(())
}

pub(crate) fn journey_resize(ctx: &mut Ctx) -> Check {
    kubectl(&["create", "namespace", NS]).or_else(|e| if e.contains("AlreadyExists") { Ok(String::new()) } else { Err(e) })?;

    // (a) xfs in use: grows under the running pod. Its partition grows at once; its
    // filesystem when kubelet next looks at the pod (a minute or more), which (c) and
    // (b) do not wait for. Each claim's partition has grown before the next claim is
    // placed, so none is placed where another must grow.
    apply(&(claim("grow-xfs", "drivelet-e2e-xfs", 320, "Filesystem", "ReadWriteOnce")
        + &pod("grow-xfs", "grow-xfs", false, "", "echo kept-xfs > /data/kept && sync")))?;
    wait_pod_running("grow-xfs", Duration::from_secs(120))?;
    let xfs_pv = pv_of("grow-xfs")?;
    let xfs_before = df_bytes("grow-xfs")?;
    let xfs_t = Instant::now();
    request("grow-xfs", "640Mi")?;
    wait_for("xfs: PV capacity 640Mi", Duration::from_secs(60), || Ok((pv_capacity(&xfs_pv)? == 640 * MIB).then_some(())))?;
    let xfs_to_pv = xfs_t.elapsed();

    // (c) more than the drive holds: a clear Event, nothing changes; lowered, it grows.
    apply(&(claim("too-big", "drivelet-e2e-xfs", 320, "Filesystem", "ReadWriteOnce") + &pod("too-big", "too-big", false, "", "true")))?;
    wait_pod_running("too-big", Duration::from_secs(120))?;
    let big_pv = pv_of("too-big")?;
    let big_before = df_bytes("too-big")?;
    request("too-big", "100Gi")?;
    let note = first_event_message("too-big", "VolumeResizeFailed", Duration::from_secs(60))?;
    ensure(note.contains("100.0 GiB") && note.contains("at most"), || format!("the Event does not say why: {note:?}"))?;
    println!("e2e:   VolumeResizeFailed: {note}");
    let c = claim_json("too-big")?;
    ensure(c["status"]["allocatedResourceStatuses"]["storage"] == "ControllerResizeInfeasible", || format!("claim status {}", c["status"]))?;
    ensure(pv_capacity(&big_pv)? == 320 * MIB, || "the PV's capacity changed".into())?;
    ensure(record_of("too-big")?["size"].as_u64() == Some(320 * MIB), || "the partition changed".into())?;
    ensure(df_bytes("too-big")? == big_before, || "the filesystem changed".into())?;
    request("too-big", "384Mi")?;
    wait_for("recovered: PV capacity 384Mi", Duration::from_secs(60), || Ok((pv_capacity(&big_pv)? == 384 * MIB).then_some(())))?;

    // (b) ext4 not in use: the partition grows at once; the filesystem when a pod starts.
    apply(&(claim("grow-ext4", "drivelet-e2e-ext4", 128, "Filesystem", "ReadWriteOnce")
        + &pod("grow-ext4", "grow-ext4", false, "", "echo kept-ext4 > /data/kept && sync")))?;
    wait_pod_running("grow-ext4", Duration::from_secs(120))?;
    let before = df_bytes("grow-ext4")?;
    let pv = pv_of("grow-ext4")?;
    kubectl(&["delete", "pod", "-n", NS, "grow-ext4", "--wait=true", "--timeout=60s"])?;
    wait_for("ext4: the volume unstaged and detached", Duration::from_secs(60), || {
        let r = record_of("grow-ext4")?;
        if r["staging"].is_null() && r["published_node"].is_null() {
            return Ok(Some(()));
        }
        Err(format!("record {r}"))
    })?;
    let t = Instant::now();
    request("grow-ext4", "256Mi")?;
    wait_for("ext4: PV capacity 256Mi", Duration::from_secs(60), || Ok((pv_capacity(&pv)? == 256 * MIB).then_some(())))?;
    let to_pv = t.elapsed();
    let c = claim_json("grow-ext4")?;
    let pending = c["status"]["conditions"].as_array().into_iter().flatten().any(|c| c["type"] == "FileSystemResizePending");
    ensure(pending && c["status"]["allocatedResourceStatuses"]["storage"] == "NodeResizePending", || {
        format!("ext4: the claim does not wait for kubelet: {}", c["status"])
    })?;
    ensure(record_of("grow-ext4")?["size"].as_u64() == Some(256 * MIB), || "ext4: the partition did not grow".into())?;
    let t = Instant::now();
    apply(&pod("grow-ext4-again", "grow-ext4", false, "", "true"))?;
    wait_pod_running("grow-ext4-again", Duration::from_secs(120))?;
    let after = df_bytes("grow-ext4-again")?;
    ensure(after > before + 100 * MIB, || format!("ext4: df shows {after} bytes after the growth, {before} before"))?;
    ensure(in_pod("grow-ext4-again", "cat /data/kept")? == "kept-ext4", || "ext4 data lost in the growth".into())?;
    ctx.measured.insert("resize ext4 unused: claim edited -> PV capacity; pod started -> df in the pod".into(), format!("{to_pv:.2?}; {:.2?}", t.elapsed()));
    wait_claim_done("grow-ext4", 256 * MIB)?;
    println!("e2e:   ext4 {} -> {} bytes offline ({before} -> {after} by df)", 128 * MIB, 256 * MIB);

    // (d) meanwhile.
    grows_by_moving_once_unused(ctx)?;

    // (a) and (c), once kubelet has looked at their pods again.
    let xfs_after = wait_for("xfs: the pod's df shows the new size", Duration::from_secs(180), || {
        let d = df_bytes("grow-xfs")?;
        Ok((d > xfs_before + 300 * MIB).then_some(d))
    })?;
    let to_pod = xfs_t.elapsed();
    ctx.measured.insert("resize xfs in use: claim edited -> PV capacity / -> df in the pod".into(), format!("{xfs_to_pv:.2?} / {to_pod:.2?}"));
    ensure(in_pod("grow-xfs", "cat /data/kept")? == "kept-xfs", || "xfs data lost in the growth".into())?;
    wait_claim_done("grow-xfs", 640 * MIB)?;
    let rec = record_of("grow-xfs")?;
    ensure(rec["size"].as_u64() == Some(640 * MIB), || format!("xfs: drivelet's volume is not 640 MiB: {rec}"))?;
    let reasons = reasons_on("grow-xfs")?;
    for want in ["Resizing", "FileSystemResizeRequired", "FileSystemResizeSuccessful"] {
        ensure(reasons.iter().any(|r| r == want), || format!("xfs: no {want} Event on the claim: {reasons:?}"))?;
    }
    if !reasons.iter().any(|r| r == "ExternalExpanding") {
        println!("e2e: note: kube-controller-manager recorded no ExternalExpanding Event ({reasons:?})");
    }
    println!("e2e:   xfs {} -> {} bytes in the pod ({xfs_before} -> {xfs_after} by df)", 320 * MIB, 640 * MIB);
    wait_for("recovered: the pod's df grows", Duration::from_secs(180), || Ok((df_bytes("too-big")? > big_before).then_some(())))?;
    wait_claim_done("too-big", 384 * MIB)?;

    delete_all(&["grow-xfs", "grow-ext4-again", "too-big", "move-xfs-again", "move-neighbour"], &["grow-xfs", "grow-ext4", "too-big", "move-xfs", "move-neighbour"])?;
    ensure(ctl_volumes()?.is_empty(), || "volumes left after the resize journey".into())
}
