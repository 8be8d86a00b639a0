//! The clone journey: claims cloned by naming them as another claim's `dataSource`
//! (kind PersistentVolumeClaim, same namespace and StorageClass), through the real
//! external-provisioner, while pods write to them.
//!
//! - a pod appends numbered, timed lines to a file of an ext4 claim without pause,
//!   another to an xfs claim; each claim is cloned while its writer runs (the default
//!   class: `drivelet.io/clone-in-use: freeze`): the clones bind and their pods run; each
//!   clone holds a prefix of what its writer wrote, whole lines; its PV says
//!   `drivelet.io/clone-consistency: frozen`, its claim has a `ClonedInUse` Event; the
//!   writer's longest pause (from its own timestamps) and the freeze drivelet recorded
//!   are measured; unmounted, each clone's filesystem checks clean (`e2fsck -fn`,
//!   `xfs_repair -n`, run on the node);
//! - a block claim a pod writes to, cloned: refused (nothing to freeze); the clone claim
//!   waits with one Warning `CloneSourceInUse` saying why and what to do, however often
//!   the provisioner retries; the writer deleted, the clone is made and reads the bytes;
//! - every claim of the journey deleted again: PVs and volumes gone.

use super::*;

/// A claim of `class` cloning claim `source`: [`claim`] with a `dataSource`.
fn clone_claim(name: &str, class: &str, size_mib: u64, mode: &str, source: &str) -> String {
    let plain = claim(name, class, size_mib, mode, "ReadWriteOnce");
    let spec = plain.strip_suffix("---\n").expect("a claim ends its YAML document with ---");
    format!("{spec}  dataSource:\n    kind: PersistentVolumeClaim\n    name: {source}\n---\n")
}

/// Waits until no pod uses claim `name` any more: its volume neither staged nor published.
pub(super) fn wait_unused(name: &str) -> Check {
    wait_for(&format!("the volume of claim {name} unstaged"), Duration::from_secs(90), || {
        let r = record_of(name)?;
        let idle = r["staging"].is_null() && r["targets"].as_object().is_none_or(|t| t.is_empty());
        Ok(idle.then_some(()))
    })
}

/// Checks that claim `copy`'s volume is a clone of claim `source`'s.
fn check_clone_record(copy: &str, source: &str) -> Check {
    let (id, src) = (volume_id_of(copy)?, volume_id_of(source)?);
    ensure(id != src, || format!("claim {copy} got its source's volume {src}"))?;
    let r = record_of(copy)?;
    ensure(r["clone_of"] == src.as_str() && r["state"] != "creating", || format!("claim {copy}: record {r}, want a clone of {src}"))
}

/// A writer's script: numbered lines, each with the node's uptime (10 ms steps), about
/// a hundred a second, appended to /data/seq.
const WRITER: &str = "(i=0; while true; do read up rest < /proc/uptime; echo \"$i $up\" >> /data/seq; i=$((i+1)); usleep 10000; done) & true";

/// The device node of the kernel partition holding claim `name`'s volume.
fn partition_of(name: &str) -> Result<String, String> {
    let r = record_of(name)?;
    let (drive, start) = (r["drive_id"].as_str().unwrap_or_default().to_string(), r["start"].as_u64().unwrap_or_default());
    let d = ctl_drives()?.into_iter().find(|d| d["id"] == drive.as_str()).ok_or(format!("drive {drive} of claim {name} not listed"))?;
    let dev = d["path"].as_str().unwrap_or_default().trim_start_matches("/dev/").to_string();
    let dir = std::fs::read_dir(format!("/sys/class/block/{dev}")).map_err(|e| format!("/sys/class/block/{dev}: {e}"))?;
    for e in dir.flatten() {
        let part = e.file_name().to_string_lossy().to_string();
        let at = std::fs::read_to_string(e.path().join("start")).unwrap_or_default();
        if part.starts_with(&dev) && at.trim().parse::<u64>().ok() == Some(start / 512) {
            return Ok(format!("/dev/{part}"));
        }
    }
    Err(format!("no kernel partition of {dev} starts at byte {start} (claim {name})"))
}

/// Checks the clone `copy` of the claim `source` written by pod `writer`, read by pod
/// `reader`: a prefix of the writer's lines, whole; frozen, told; and measures the pause.
fn check_frozen_clone(ctx: &mut Ctx, fs: &str, copy: &str, source: &str, writer: &str, reader: &str) -> Check {
    check_clone_record(copy, source)?;
    let got = in_pod(reader, "wc -c < /data/seq; md5sum < /data/seq | cut -d' ' -f1; tail -c 1 /data/seq | od -An -c; head -n 1 /data/seq | cut -d' ' -f1")?;
    let lines: Vec<&str> = got.lines().map(str::trim).collect();
    let (len, sum) = (lines.first().copied().unwrap_or_default(), lines.get(1).copied().unwrap_or_default());
    ensure(lines.len() == 4 && lines[2] == "\\n" && lines[3] == "0", || format!("{fs} clone {copy}: /data/seq ends or begins wrong: {got:?}"))?;
    let n: u64 = len.parse().map_err(|_| format!("{fs} clone {copy}: size {len:?}"))?;
    let theirs = in_pod(writer, &format!("head -c {n} /data/seq | md5sum | cut -d' ' -f1; wc -c < /data/seq; awk 'NR>1{{g=$2-p; if(g>m)m=g}} {{p=$2}} END{{printf \"%.2f\", m}}' /data/seq"))?;
    let theirs: Vec<&str> = theirs.lines().map(str::trim).collect();
    ensure(theirs.first() == Some(&sum), || format!("{fs} clone {copy}: its {n} bytes are not the first {n} its writer wrote ({theirs:?} vs {sum})"))?;
    let total: u64 = theirs.get(1).and_then(|t| t.parse().ok()).unwrap_or_default();
    ensure(n > 0 && n < total, || format!("{fs} clone {copy}: holds {n} bytes of the writer's {total}"))?;
    let pv = pv_of(copy)?;
    let attrs = get_json(&["get", "pv", &pv])?["spec"]["csi"]["volumeAttributes"].clone();
    ensure(attrs["drivelet.io/clone-consistency"] == "frozen", || format!("{fs} clone {copy}: PV attributes {attrs}"))?;
    let told = wait_for(&format!("the ClonedInUse Event on claim {copy}"), Duration::from_secs(30), || {
        Ok(events_for("PersistentVolumeClaim", copy, "ClonedInUse")?.first().map(|e| e["message"].as_str().unwrap_or_default().to_string()))
    })?;
    let frozen = record_of(copy)?["copied_in_use"]["frozen"]["millis"].as_u64().unwrap_or_default();
    let pause = theirs.get(2).copied().unwrap_or("?");
    println!("e2e:   {fs} clone: {n} of {total} bytes, whole lines; frozen {frozen} ms; the writer's longest pause {pause} s; told: {told}");
    ctx.measured.insert(format!("clone of an {fs} claim in use: freeze drivelet recorded"), format!("{frozen} ms"));
    ctx.measured.insert(format!("clone of an {fs} claim in use: the writer's longest pause (10 ms clock)"), format!("{pause} s"));
    Ok(())
}

/// `fsck -n` of claim `name`'s filesystem on the node, unmounted.
fn check_clean(fs: &str, name: &str) -> Check {
    wait_unused(name)?;
    let dev = partition_of(name)?;
    let out = match fs {
        "ext4" => std::process::Command::new("e2fsck").args(["-fn", &dev]).output(),
        _ => std::process::Command::new("xfs_repair").args(["-n", &dev]).output(),
    }
    .map_err(|e| format!("running fsck of {dev}: {e}"))?;
    ensure(out.status.success(), || {
        format!("the {fs} clone {name} ({dev}) does not check clean: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    })
}

pub(super) fn journey_clone(ctx: &mut Ctx) -> Check {
    let mut objects = claim("clone-src", "drivelet-e2e-ext4", 128, "Filesystem", "ReadWriteOnce");
    objects += &pod("clone-writer", "clone-src", false, "", WRITER);
    objects += &claim("clone-xsrc", "drivelet-e2e-xfs", 320, "Filesystem", "ReadWriteOnce");
    objects += &pod("clone-xwriter", "clone-xsrc", false, "", WRITER);
    objects += &claim("clone-bsrc", "drivelet-e2e-ext4", 32, "Block", "ReadWriteOnce");
    objects += &pod("clone-bwriter", "clone-bsrc", true, "", "echo hello-block-clone | dd of=/dev/e2e-block bs=512 count=1 conv=sync,fsync");
    apply(&objects)?;
    for p in ["clone-writer", "clone-xwriter", "clone-bwriter"] {
        wait_pod_running(p, Duration::from_secs(120))?;
    }
    for w in ["clone-writer", "clone-xwriter"] {
        wait_for(&format!("pod {w} writing"), Duration::from_secs(30), || {
            Ok(in_pod(w, "wc -l < /data/seq").ok().and_then(|n| n.trim().parse::<u64>().ok()).filter(|n| *n >= 50).map(|_| ()))
        })?;
    }

    // Cloned while the writers run: frozen, consistent, told.
    let t = Instant::now();
    let mut clones = clone_claim("clone-copy", "drivelet-e2e-ext4", 128, "Filesystem", "clone-src") + &pod("clone-reader", "clone-copy", false, "", "true");
    clones += &(clone_claim("clone-xcopy", "drivelet-e2e-xfs", 320, "Filesystem", "clone-xsrc") + &pod("clone-xreader", "clone-xcopy", false, "", "true"));
    clones += &(clone_claim("clone-bcopy", "drivelet-e2e-ext4", 32, "Block", "clone-bsrc") + &pod("clone-breader", "clone-bcopy", true, "", "true"));
    apply(&clones)?;
    wait_pod_running("clone-reader", Duration::from_secs(240))?;
    wait_pod_running("clone-xreader", Duration::from_secs(240))?;
    ctx.measured.insert("clones of two claims in use asked -> both pods Running".into(), format!("{:.1}s", t.elapsed().as_secs_f64()));
    check_frozen_clone(ctx, "ext4", "clone-copy", "clone-src", "clone-writer", "clone-reader")?;
    check_frozen_clone(ctx, "xfs", "clone-xcopy", "clone-xsrc", "clone-xwriter", "clone-xreader")?;

    // The block claim in use: refused, told once however often the provisioner retries.
    let told = wait_for("the CloneSourceInUse Warning on the block clone", Duration::from_secs(60), || {
        Ok(events_for("PersistentVolumeClaim", "clone-bcopy", "CloneSourceInUse")?.first().map(|e| e["message"].as_str().unwrap_or_default().to_string()))
    })?;
    ensure(told.contains("cannot clone block volume") && told.contains("crash-inconsistent"), || format!("the block clone's Warning: {told}"))?;
    let failed = wait_for("the ProvisioningFailed Warning on the block clone", Duration::from_secs(60), || {
        Ok(events_for("PersistentVolumeClaim", "clone-bcopy", "ProvisioningFailed")?.first().map(|e| e["message"].as_str().unwrap_or_default().to_string()))
    })?;
    ensure(failed.contains("FailedPrecondition") && failed.contains("tries again"), || format!("the block clone's ProvisioningFailed: {failed}"))?;
    // The provisioner retries with backoff (1, 2, 4 s ...) and says nothing more.
    std::thread::sleep(Duration::from_secs(8));
    let count = |reason: &str| -> Result<u64, String> {
        Ok(events_for("PersistentVolumeClaim", "clone-bcopy", reason)?.iter().map(|e| e["count"].as_u64().unwrap_or(1).max(e["series"]["count"].as_u64().unwrap_or(1))).sum())
    };
    let (warned, failures) = (count("CloneSourceInUse")?, count("ProvisioningFailed")?);
    ensure(warned == 1 && failures == 1, || format!("the block clone's claim was warned {warned} times and failed {failures} times in Events"))?;
    ensure(pv_of("clone-bcopy").is_err(), || "the block clone was provisioned while its source was written".into())?;
    let retries = 1;
    let _ = retries;
    println!("e2e:   block clone refused while written (one CloneSourceInUse, one ProvisioningFailed): {told}");

    // Both filesystem clones check clean, unmounted.
    kubectl(&["delete", "pod", "-n", NS, "clone-reader", "clone-xreader", "--wait=true", "--timeout=60s"])?;
    check_clean("ext4", "clone-copy")?;
    check_clean("xfs", "clone-xcopy")?;

    // The block writer gone, its clone is made and carries the data.
    let t = Instant::now();
    kubectl(&["delete", "pod", "-n", NS, "clone-bwriter", "--wait=true", "--timeout=60s"])?;
    wait_unused("clone-bsrc")?;
    wait_pod_running("clone-breader", Duration::from_secs(240))?;
    ctx.measured.insert("block writer deleted -> its clone provisioned and its pod Running".into(), format!("{:.1}s", t.elapsed().as_secs_f64()));
    let read = "dd if=/dev/e2e-block bs=512 count=1 2>/dev/null | head -c 17";
    let got = in_pod("clone-breader", read)?;
    ensure(got == "hello-block-clone", || format!("the block clone reads {got:?}"))?;
    check_clone_record("clone-bcopy", "clone-bsrc")?;

    // Everything of the journey deleted again.
    let claims = ["clone-src", "clone-copy", "clone-xsrc", "clone-xcopy", "clone-bsrc", "clone-bcopy"];
    let pvs: Vec<String> = claims.iter().filter_map(|c| pv_of(c).ok()).collect();
    let ids: Vec<String> = claims.iter().filter_map(|c| volume_id_of(c).ok()).collect();
    kubectl(&["delete", "pod", "-n", NS, "clone-writer", "clone-xwriter", "clone-breader", "--wait=true", "--timeout=60s"])?;
    let mut del = vec!["delete", "pvc", "-n", NS, "--wait=true", "--timeout=90s"];
    del.extend(claims);
    kubectl(&del)?;
    wait_for("the clone journey's PVs gone", Duration::from_secs(120), || Ok(pvs.iter().all(|pv| kubectl(&["get", "pv", pv]).is_err()).then_some(())))?;
    let left: Vec<Value> = ctl_volumes()?.into_iter().filter(|v| ids.iter().any(|id| v["id"] == id.as_str())).collect();
    ensure(left.is_empty(), || format!("volumes of the clone journey left: {left:?}"))
}
