//! Data belongs to its disk, end to end on the real node: the node's state dir wiped (an
//! OS reinstalled on the same node), every volume is served again from its disk's note,
//! to the same claims, with the same data and nothing formatted again.

use super::*;

/// The volume ids of claims `own-fs` and `own-block`.
fn ids() -> Result<(String, String), String> {
    Ok((volume_id_of("own-fs")?, volume_id_of("own-block")?))
}

pub(crate) fn journey_state_wiped(ctx: &mut Ctx) -> Check {
    kubectl(&["create", "namespace", NS]).or_else(|e| if e.contains("AlreadyExists") { Ok(String::new()) } else { Err(e) })?;
    let (cap_before, _) = get_capacity()?;
    let mut objects = String::new();
    objects += &claim("own-fs", "drivelet-e2e-ext4", 64, "Filesystem", "ReadWriteOnce");
    objects += &claim("own-block", "drivelet-e2e-ext4", 32, "Block", "ReadWriteOnce");
    objects += &pod("own-w", "own-fs", false, "", "echo hello-own > /data/hello && sync");
    objects += &pod("own-b", "own-block", true, "", "echo hello-own-b | dd of=/dev/e2e-block bs=512 count=1 conv=sync,fsync");
    apply(&objects)?;
    for p in ["own-w", "own-b"] {
        wait_pod_running(p, Duration::from_secs(120))?;
    }
    ensure(in_pod("own-w", "cat /data/hello")? == "hello-own", || "ext4 data not written".into())?;
    let (fs_id, block_id) = ids()?;
    let (pv_fs, pv_block) = (pv_of("own-fs")?, pv_of("own-block")?);
    // The record knows its claim from the provisioner's metadata, and so does the note.
    let r = record_of("own-fs")?;
    ensure(r["binding"]["claim_name"] == "own-fs" && r["binding"]["claim_namespace"] == NS && r["binding"]["pv"] == pv_fs.as_str(), || {
        format!("the record of own-fs does not name its claim and PV: {r}")
    })?;

    // No pod uses them: unstaged, detached.
    kubectl(&["delete", "pod", "-n", NS, "own-w", "own-b", "--wait=true", "--timeout=60s"])?;
    wait_for("the VolumeAttachments of own-fs and own-block gone", Duration::from_secs(90), || {
        let vas = get_json(&["get", "volumeattachments"])?;
        let left = vas["items"].as_array().into_iter().flatten().any(|v| {
            let pv = v["spec"]["source"]["persistentVolumeName"].as_str().unwrap_or_default();
            pv == pv_fs || pv == pv_block
        });
        Ok((!left).then_some(()))
    })?;

    // The state dir wiped, as a reinstalled OS leaves it, and drivelet started again.
    let before = drivelet_pod()?;
    let state = Path::new("/var/lib/drivelet");
    for e in std::fs::read_dir(state).map_err(|e| format!("read {}: {e}", state.display()))? {
        let p = e.map_err(|e| e.to_string())?.path();
        let res = if p.is_dir() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
        res.map_err(|e| format!("remove {}: {e}", p.display()))?;
    }
    let t = Instant::now();
    kubectl(&["delete", "pod", "-n", SYSTEM_NS, &before, "--wait=true", "--timeout=60s"])?;
    let after = wait_for("a new drivelet pod Ready", Duration::from_secs(90), || Ok(drivelet_pod().ok().filter(|p| *p != before)))?;
    ctx.measured.insert("state dir wiped -> volumes served again".into(), format!("{:.1}s", t.elapsed().as_secs_f64()));
    let vols = ctl_volumes()?;
    for (id, name, claim) in [(&fs_id, &pv_fs, "own-fs"), (&block_id, &pv_block, "own-block")] {
        let v = vols.iter().find(|v| v["id"] == id.as_str()).ok_or(format!("volume {id} of claim {claim} not served after the state dir was wiped: {vols:?}"))?;
        ensure(v["name"] == name.as_str() && v["binding"]["claim_name"] == claim, || format!("volume {id} rebuilt without its name or claim: {v}"))?;
    }
    let v = vols.iter().find(|v| v["id"] == fs_id.as_str()).cloned().unwrap_or_default();
    ensure(v["fs_type"] == "ext4" && v["formatted"] == true, || format!("the ext4 volume rebuilt as {v}"))?;
    let v = vols.iter().find(|v| v["id"] == block_id.as_str()).cloned().unwrap_or_default();
    ensure(v["block"] == true, || format!("the block volume rebuilt as {v}"))?;

    // Served as before: pods read the data, nothing formatted again.
    let mut objects = pod("own-r", "own-fs", false, "", "cat /data/hello");
    objects += &pod("own-b", "own-block", true, "", "true");
    apply(&objects)?;
    for p in ["own-r", "own-b"] {
        wait_pod_running(p, Duration::from_secs(120))?;
    }
    ensure(in_pod("own-r", "cat /data/hello")? == "hello-own", || "the ext4 data is not there after the state dir was wiped".into())?;
    let b = in_pod("own-b", "dd if=/dev/e2e-block bs=512 count=1 2>/dev/null | head -c 11")?;
    ensure(b == "hello-own-b", || format!("the block data after the state dir was wiped: {b:?}"))?;
    ensure(formats_logged(&after)? == 0, || format!("the drivelet pod {after} formatted something after the state dir was wiped"))?;

    // Gone again, space back.
    kubectl(&["delete", "pod", "-n", NS, "own-r", "own-b", "--wait=true", "--timeout=60s"])?;
    kubectl(&["delete", "pvc", "-n", NS, "own-fs", "own-block", "--wait=true", "--timeout=60s"])?;
    for pv in [&pv_fs, &pv_block] {
        wait_for(&format!("PV {pv} gone"), Duration::from_secs(90), || Ok(kubectl(&["get", "pv", pv]).is_err().then_some(())))?;
    }
    wait_for("the freed space cleaned and offered again", Duration::from_secs(90), || Ok((get_capacity()?.0 == cap_before).then_some(())))
}
