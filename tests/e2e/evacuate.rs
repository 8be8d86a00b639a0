//! Drive evacuation through the Kubernetes API (issue 26): a drive holding three volumes,
//! one used by a running pod, evacuated with `kubectl drivelet drive evacuate`.
//!
//! Runs right after the deploy journey, on the real node's three empty drives (alone:
//! `E2E_JOURNEYS=evacuate`, with the deploy and the clean-up), and ends with the drive
//! replaced, so the journeys after it find three empty active drives again. It:
//! - puts three claims on one drive (the other two cordoned meanwhile): `ev-small` and
//!   `ev-big` (1.4 GiB) written and their pods deleted, `ev-used` written by a pod that
//!   keeps running; checksums of what each holds;
//! - evacuates the drive with `kubectl drivelet drive evacuate`; `ev-small` moves at
//!   once; while `ev-big` is being copied, the agent is killed with SIGKILL; once its
//!   container is back, the evacuation goes on and `ev-big` moves;
//! - `ev-used` waits meanwhile: the Drive's `status.evacuation` and the condition name
//!   its pod, and `kubectl drivelet volumes -o json` lists the pod of the volume;
//! - the pod deleted, `kubectl drivelet drive evacuate --wait` prints its progress and
//!   ends evacuated; the drive is released, holds no partition and no volume (`ctl`,
//!   the Drive object), an `Evacuated` Event is on it;
//! - every claim and PV is unchanged (uid, volume handle), each claim has a
//!   `VolumeMoved` Event naming the drive its data went to, and new pods on the node
//!   read back the same checksums;
//! - the drive is pulled (its loop device detached): its Drive object goes; a blank
//!   drive is put in (a new image file): managed and active on sight.

use std::process::Command;

use super::*;

const CLAIMS: [(&str, u64); 3] = [("ev-small", 64), ("ev-used", 64), ("ev-big", 1400)];
const SUM: &str = "md5sum /data/blob | cut -d' ' -f1";

use super::drive_actions::plugin_ok;

/// The real node's Drive object of `drive_id`, if any (the fake nodes, host processes,
/// see the real node's loop drives too, as excluded ones: never theirs).
fn real_object(drive_id: &str) -> Result<Option<Value>, String> {
    let objs = get_json(&["get", "drives"])?;
    Ok(objs["items"].as_array().into_iter().flatten().find(|o| o["spec"]["driveId"] == drive_id && o["spec"]["node"] == real_node()).cloned())
}

/// The real node's Drive object of `drive_id`.
fn object_of(drive_id: &str) -> Result<Value, String> {
    real_object(drive_id)?.ok_or(format!("no Drive object of {drive_id} on {}", real_node()))
}

fn condition(obj: &Value) -> Value {
    obj["status"]["conditions"].as_array().into_iter().flatten().find(|c| c["type"] == "ActionComplete").cloned().unwrap_or_default()
}

/// Where the evacuation of `drive` stands, as `ctl evacuations` says.
fn ctl_evacuation(drive: &str) -> Result<Value, String> {
    let all = drivelet_json(&["ctl", "-c", CONFIG, "evacuations"])?;
    Ok(all.as_array().into_iter().flatten().find(|e| e["drive_id"] == drive).cloned().unwrap_or_default())
}

fn pending_state(e: &Value, id: &str) -> Option<String> {
    e["pending"].as_array().into_iter().flatten().find(|p| p["volume_id"] == id).and_then(|p| p["state"].as_str().map(str::to_string))
}

/// The pid of the DaemonSet's drivelet process on this host (the fake nodes' agents run
/// from elsewhere: never them).
/// The agent itself, the child of the container's PID 1 (`drivelet::guardian`).
fn pod_agent_pid() -> Option<i32> {
    let dir = super::process_with(b"/usr/local/bin/drivelet\0run", b"/etc/drivelet/drivelet.toml")?;
    dir.file_name().and_then(|n| n.to_str()).and_then(|n| n.parse().ok())
}

fn partitions(dev: &str) -> Result<usize, String> {
    let out = Command::new("lsblk").args(["-nr", "-o", "TYPE", dev]).output().map_err(|e| e.to_string())?;
    Ok(String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.trim() == "part").count())
}

fn restart_count() -> Result<i64, String> {
    let pods = get_json(&["get", "pods", "-n", SYSTEM_NS, "-l", "app.kubernetes.io/name=drivelet"])?;
    Ok(pods["items"][0]["status"]["containerStatuses"].as_array().into_iter().flatten().filter_map(|c| c["restartCount"].as_i64()).sum())
}

pub(super) fn journey_evacuate(ctx: &mut Ctx) -> Check {
    kubectl(&["create", "namespace", NS]).or_else(|e| if e.contains("AlreadyExists") { Ok(String::new()) } else { Err(e) })?;
    let node = real_node().to_string();
    let mut managed: Vec<Value> = ctl_drives()?.into_iter().filter(|d| d["class"] == "managed" && d["usage"] == "active").collect();
    managed.sort_by_key(|d| d["id"].as_str().unwrap_or_default().to_string());
    ensure(managed.len() >= 3, || format!("three active managed drives wanted, {} found", managed.len()))?;
    let src = managed[0]["id"].as_str().unwrap_or_default().to_string();
    let dev = managed[0]["path"].as_str().unwrap_or_default().to_string();
    let file = managed[0]["backing_file"].as_str().unwrap_or_default().to_string();
    let others: Vec<String> = managed[1..].iter().filter_map(|d| d["id"].as_str().map(str::to_string)).collect();
    let target = format!("{node}/{src}");

    // Three claims on the source drive: the others cordoned while they are made.
    for o in &others {
        plugin_ok(&["drive", "cordon", &format!("{node}/{o}"), "--wait", "30s"])?;
    }
    for (name, size) in CLAIMS {
        let mib = if name == "ev-big" { 100 } else { 8 };
        let write = format!("dd if=/dev/urandom of=/data/blob bs=1M count={mib} 2>/dev/null && sync && {SUM} > /data/sum");
        apply(&(claim(name, "drivelet-e2e-ext4", size, "Filesystem", "ReadWriteOnce") + &pod(name, name, false, "", &write)))?;
    }
    let mut sums = BTreeMap::new();
    let mut before = BTreeMap::new();
    for (name, _) in CLAIMS {
        wait_pod_running(name, Duration::from_secs(120))?;
        let sum = wait_for(&format!("{name} written"), Duration::from_secs(60), || Ok(in_pod(name, "cat /data/sum 2>/dev/null").ok().filter(|s| s.len() == 32)))?;
        sums.insert(name, sum);
        let rec = record_of(name)?;
        ensure(rec["drive_id"] == src.as_str(), || format!("{name} landed on {} rather than {src}", rec["drive_id"]))?;
        let pvc = get_json(&["get", "pvc", "-n", NS, name])?;
        let pv = pv_of(name)?;
        before.insert(name, (pvc["metadata"]["uid"].clone(), pv.clone(), get_json(&["get", "pv", &pv])?["metadata"]["uid"].clone(), volume_id_of(name)?));
    }
    for o in &others {
        plugin_ok(&["drive", "uncordon", &format!("{node}/{o}"), "--wait", "30s"])?;
    }
    for name in ["ev-small", "ev-big"] {
        kubectl(&["delete", "pod", "-n", NS, name, "--wait=true", "--timeout=60s"])?;
    }
    let (small_id, used_id, big_id) = (before["ev-small"].3.clone(), before["ev-used"].3.clone(), before["ev-big"].3.clone());
    wait_for("ev-small and ev-big unstaged", Duration::from_secs(90), || {
        let vols = ctl_volumes()?;
        let staged = |id: &str| vols.iter().any(|v| v["id"] == id && !v["staging"].is_null());
        Ok((!staged(&small_id) && !staged(&big_id)).then_some(()))
    })?;

    // Evacuate; SIGKILL while ev-big is being copied.
    let asked = Instant::now();
    let out = plugin_ok(&["drive", "evacuate", &target])?;
    ensure(out.contains("evacuate asked") || out.contains("evacuate done"), || out.clone())?;
    let restarts = restart_count()?;
    let seen = wait_every("ev-big being copied", Duration::from_secs(120), Duration::from_millis(50), || {
        let e = ctl_evacuation(&src)?;
        Ok((pending_state(&e, &big_id).as_deref() == Some("moving")).then_some(e))
    })?;
    let pid = pod_agent_pid().ok_or("no drivelet process of the pod on this host")?;
    let out = Command::new("kill").args(["-9", &pid.to_string()]).output().map_err(|e| e.to_string())?;
    ensure(out.status.success(), || format!("kill -9 {pid}: {}", String::from_utf8_lossy(&out.stderr)))?;
    ctx.measured.insert("evacuation: agent killed mid-move".into(), format!("{:.1}s after the ask, while {}", asked.elapsed().as_secs_f64(), seen["pending"]));
    ensure(pending_state(&seen, &small_id).is_none(), || format!("ev-small had not moved first: {seen}"))?;
    wait_for("the drivelet container restarted and Ready", Duration::from_secs(120), || {
        Ok((restart_count()? > restarts && drivelet_pod().is_ok()).then_some(()))
    })?;

    // After the restart the evacuation goes on: ev-big moves; ev-used waits for its pod.
    let t = Instant::now();
    let obj = wait_for("the unused volumes moved, ev-used waiting for its pod", Duration::from_secs(180), || {
        let vols = ctl_volumes()?;
        let on = |id: &str| vols.iter().find(|v| v["id"] == id).map(|v| v["drive_id"].as_str().unwrap_or_default().to_string());
        let moved = [&small_id, &big_id].iter().all(|id| on(id).is_some_and(|d| d != src));
        let o = object_of(&src)?;
        let waits = o["status"]["evacuation"].as_array().into_iter().flatten().any(|v| {
            v["volume"] == used_id.as_str() && v["state"] == "waiting" && v["reason"].as_str().is_some_and(|r| r.contains(&format!("{NS}/ev-used")))
        });
        Ok((moved && waits).then_some(o))
    })?;
    ctx.measured.insert("evacuation: restart -> ev-big moved".into(), format!("{:.1}s", t.elapsed().as_secs_f64()));
    let c = condition(&obj);
    ensure(c["status"] == "False" && c["reason"] == "Evacuating" && c["message"].as_str().is_some_and(|m| m.contains(&format!("{NS}/ev-used"))), || {
        format!("condition while ev-used waits: {c}")
    })?;
    ensure(obj["status"]["usage"] == "releasing", || format!("{obj}"))?;
    let vols: Value = serde_json::from_str(&plugin_ok(&["volumes", "--node", &node, "-o", "json"])?).map_err(|e| e.to_string())?;
    let row = vols.as_array().into_iter().flatten().find(|v| v["id"] == used_id.as_str()).cloned().unwrap_or_default();
    ensure(row["pods"] == serde_json::json!([format!("{NS}/ev-used")]), || format!("kubectl drivelet volumes row of ev-used: {row}"))?;
    let wide = plugin_ok(&["volumes", "--node", &node, "-o", "wide"])?;
    ensure(wide.contains("PODS") && wide.contains(&format!("{NS}/ev-used")), || wide.clone())?;

    // The pod deleted: ev-used moves; --wait prints the steps and ends evacuated.
    kubectl(&["delete", "pod", "-n", NS, "ev-used", "--wait=true", "--timeout=60s"])?;
    let t = Instant::now();
    let out = plugin_ok(&["drive", "evacuate", &target, "--wait", "180s"])?;
    ctx.measured.insert("evacuation: ev-used's pod deleted -> evacuated (kubectl drivelet --wait)".into(), format!("{:.1}s", t.elapsed().as_secs_f64()));
    ensure(out.contains("evacuate done") && out.contains("may be pulled"), || out.clone())?;
    let obj = object_of(&src)?;
    let c = condition(&obj);
    ensure(c["status"] == "True" && c["reason"] == "Evacuated" && obj["status"]["usage"] == "released", || format!("{obj}"))?;
    ensure(obj["status"]["volumes"].as_array().is_none_or(|v| v.is_empty()), || format!("the evacuated drive's object lists volumes: {obj}"))?;
    ensure(!ctl_volumes()?.iter().any(|v| v["drive_id"] == src.as_str()), || "ctl volumes lists a volume on the evacuated drive".into())?;
    let d = ctl_drives()?.into_iter().find(|d| d["id"] == src.as_str()).unwrap_or_default();
    ensure(d["usage"] == "released", || format!("ctl drives: {d}"))?;
    wait_for("the evacuated drive holds no partition", Duration::from_secs(30), || Ok((partitions(&dev)? == 0).then_some(())))?;
    let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
    wait_for("an Evacuated Event on the Drive", Duration::from_secs(20), || Ok((!events_in("default", "Drive", &name, "Evacuated")?.is_empty()).then_some(())))?;

    // Claims and PVs unchanged; each claim says where its data went; the data is there.
    for (claim_name, _) in CLAIMS {
        let (claim_uid, pv, pv_uid, id) = &before[claim_name];
        let pvc = get_json(&["get", "pvc", "-n", NS, claim_name])?;
        let pv_now = get_json(&["get", "pv", pv])?;
        ensure(pvc["metadata"]["uid"] == *claim_uid && pvc["spec"]["volumeName"] == pv.as_str(), || format!("claim {claim_name} changed: {pvc}"))?;
        ensure(pv_now["metadata"]["uid"] == *pv_uid && pv_now["spec"]["csi"]["volumeHandle"] == id.as_str(), || format!("PV {pv} changed: {pv_now}"))?;
        let to = record_of(claim_name)?["drive_id"].as_str().unwrap_or_default().to_string();
        ensure(to != src && others.contains(&to), || format!("{claim_name} is on {to}"))?;
        let evs = wait_for(&format!("a VolumeMoved Event on claim {claim_name}"), Duration::from_secs(30), || {
            let evs = events_for("PersistentVolumeClaim", claim_name, "VolumeMoved")?;
            Ok((!evs.is_empty()).then_some(evs))
        })?;
        let note = evs[0]["message"].as_str().or(evs[0]["note"].as_str()).unwrap_or_default().to_string();
        ensure(note.contains(&format!("from drive {src} to drive {to}")) && note.contains("copied and verified"), || format!("Event on {claim_name}: {}", evs[0]))?;
        let again = format!("{claim_name}-again");
        apply(&pod(&again, claim_name, false, "", "true"))?;
        wait_pod_running(&again, Duration::from_secs(120))?;
        let sum = in_pod(&again, SUM)?;
        ensure(sum == sums[claim_name], || format!("{claim_name}: data checksum {sum}, written {}", sums[claim_name]))?;
        ensure(in_pod(&again, "cat /data/sum")? == sums[claim_name], || format!("{claim_name}: its checksum file changed"))?;
        kubectl(&["delete", "pod", "-n", NS, &again, "--wait=true", "--timeout=60s"])?;
    }
    for (claim_name, _) in CLAIMS {
        kubectl(&["delete", "pvc", "-n", NS, claim_name, "--wait=true", "--timeout=120s"])?;
    }
    // Detached and deleted (the attach-detach controller takes a moment after the pods).
    let pvs: Vec<String> = before.values().map(|b| b.1.clone()).collect();
    wait_for("the journey's VolumeAttachments and PVs gone", Duration::from_secs(120), || {
        let vas = get_json(&["get", "volumeattachments"])?;
        let attached = vas["items"].as_array().into_iter().flatten().any(|v| pvs.iter().any(|pv| v["spec"]["source"]["persistentVolumeName"] == pv.as_str()));
        Ok((!attached && pvs.iter().all(|pv| kubectl(&["get", "pv", pv]).is_err())).then_some(()))
    })?;

    // Pull the drive, put a blank one in its place.
    let out = Command::new("losetup").args(["-d", &dev]).output().map_err(|e| e.to_string())?;
    ensure(out.status.success(), || format!("losetup -d {dev}: {}", String::from_utf8_lossy(&out.stderr)))?;
    wait_for("the pulled drive forgotten: no Drive object, not listed", Duration::from_secs(30), || {
        let listed = ctl_drives()?.iter().any(|d| d["id"] == src.as_str());
        Ok((!listed && real_object(&src)?.is_none()).then_some(()))
    })?;
    let new = Path::new(&file).with_file_name("drive-0-replacement.img");
    let out = Command::new("truncate").args(["-s", "2G"]).arg(&new).output().map_err(|e| e.to_string())?;
    ensure(out.status.success(), || format!("truncate {}: {}", new.display(), String::from_utf8_lossy(&out.stderr)))?;
    let out = Command::new("losetup").args(["--find", "--show"]).arg(&new).output().map_err(|e| e.to_string())?;
    ensure(out.status.success(), || format!("losetup {}: {}", new.display(), String::from_utf8_lossy(&out.stderr)))?;
    let fresh = wait_for("the new blank drive managed and active", Duration::from_secs(30), || {
        Ok(ctl_drives()?.into_iter().find(|d| d["backing_file"] == new.display().to_string().as_str() && d["class"] == "managed" && d["usage"] == "active"))
    })?;
    let fresh_id = fresh["id"].as_str().unwrap_or_default().to_string();
    wait_for("the new drive's Drive object", Duration::from_secs(30), || Ok(real_object(&fresh_id)?.filter(|o| o["status"]["usage"] == "active").map(|_| ())))?;
    // The space the moved volumes left is clean again before the next journeys count it.
    wait_for("the freed space cleaned", Duration::from_secs(180), || Ok(ctl_drives()?.iter().all(|d| d["cleaning"].is_null()).then_some(())))?;
    Ok(())
}
