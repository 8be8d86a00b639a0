//! The clone journey: a claim cloned by naming it as another claim's `dataSource`
//! (kind PersistentVolumeClaim, same namespace and StorageClass), through the real
//! external-provisioner, data included.
//!
//! - a pod writes data (8 MiB of random bytes and their checksum) into an ext4 claim;
//! - a claim cloning it, with a pod reading it, stays Pending while the writer runs:
//!   the provisioner's `ProvisioningFailed` Event says the source is mounted
//!   read-write (drivelet's consistency policy);
//! - the writer deleted, the clone is provisioned: the reader finds the same bytes,
//!   the PV is a volume of its own whose record names its source;
//! - the same for a block claim (bytes at the start of the device);
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

pub(super) fn journey_clone(ctx: &mut Ctx) -> Check {
    let write = "dd if=/dev/urandom of=/data/blob bs=1M count=8 2>/dev/null && md5sum /data/blob | cut -d' ' -f1 > /data/sum && sync";
    let mut objects = claim("clone-src", "drivelet-e2e-ext4", 128, "Filesystem", "ReadWriteOnce");
    objects += &pod("clone-writer", "clone-src", false, "", write);
    objects += &claim("clone-bsrc", "drivelet-e2e-ext4", 32, "Block", "ReadWriteOnce");
    objects += &pod("clone-bwriter", "clone-bsrc", true, "", "echo hello-block-clone | dd of=/dev/e2e-block bs=512 count=1 conv=sync,fsync");
    apply(&objects)?;
    wait_pod_running("clone-writer", Duration::from_secs(120))?;
    wait_pod_running("clone-bwriter", Duration::from_secs(120))?;
    let sum = wait_for("the writer's checksum", Duration::from_secs(30), || Ok(in_pod("clone-writer", "cat /data/sum").ok().filter(|s| s.len() == 32)))?;

    // Cloned while the writer runs: refused, the claim waits.
    let read = "md5sum /data/blob | cut -d' ' -f1 > /tmp/got";
    apply(&(clone_claim("clone-copy", "drivelet-e2e-ext4", 128, "Filesystem", "clone-src") + &pod("clone-reader", "clone-copy", false, "", read)))?;
    let refused = wait_for("a ProvisioningFailed Event on the clone of a source in use", Duration::from_secs(60), || {
        let ev = events_for("PersistentVolumeClaim", "clone-copy", "ProvisioningFailed")?;
        Ok(ev.iter().map(|e| e["message"].as_str().unwrap_or_default().to_string()).find(|m| m.contains("mounted read-write")))
    })?;
    ensure(pv_of("clone-copy").is_err(), || "the clone was provisioned while its source was written".into())?;
    println!("e2e:   refused while the source is in use: {refused}");

    // The writer gone, the clone is made and carries the data.
    let t = Instant::now();
    kubectl(&["delete", "pod", "-n", NS, "clone-writer", "--wait=true", "--timeout=60s"])?;
    wait_unused("clone-src")?;
    wait_pod_running("clone-reader", Duration::from_secs(240))?;
    ctx.measured.insert("writer deleted -> ext4 clone provisioned and its pod Running".into(), format!("{:.1}s", t.elapsed().as_secs_f64()));
    let got = in_pod("clone-reader", "md5sum /data/blob | cut -d' ' -f1; cat /data/sum")?;
    ensure(got.lines().all(|l| l == sum) && got.lines().count() == 2, || format!("the clone reads {got:?}, the source held {sum}"))?;
    check_clone_record("clone-copy", "clone-src")?;

    // A block claim, cloned once its writer is gone.
    kubectl(&["delete", "pod", "-n", NS, "clone-bwriter", "--wait=true", "--timeout=60s"])?;
    wait_unused("clone-bsrc")?;
    let read = "dd if=/dev/e2e-block bs=512 count=1 2>/dev/null | head -c 17";
    apply(&(clone_claim("clone-bcopy", "drivelet-e2e-ext4", 32, "Block", "clone-bsrc") + &pod("clone-breader", "clone-bcopy", true, "", read)))?;
    wait_pod_running("clone-breader", Duration::from_secs(240))?;
    let got = in_pod("clone-breader", read)?;
    ensure(got == "hello-block-clone", || format!("the block clone reads {got:?}"))?;
    check_clone_record("clone-bcopy", "clone-bsrc")?;

    // Everything of the journey deleted again.
    let claims = ["clone-src", "clone-copy", "clone-bsrc", "clone-bcopy"];
    let pvs: Vec<String> = claims.iter().filter_map(|c| pv_of(c).ok()).collect();
    let ids: Vec<String> = claims.iter().filter_map(|c| volume_id_of(c).ok()).collect();
    kubectl(&["delete", "pod", "-n", NS, "clone-reader", "clone-breader", "--wait=true", "--timeout=60s"])?;
    let mut del = vec!["delete", "pvc", "-n", NS, "--wait=true", "--timeout=90s"];
    del.extend(claims);
    kubectl(&del)?;
    wait_for("the clone journey's PVs gone", Duration::from_secs(120), || Ok(pvs.iter().all(|pv| kubectl(&["get", "pv", pv]).is_err()).then_some(())))?;
    let left: Vec<Value> = ctl_volumes()?.into_iter().filter(|v| ids.iter().any(|id| v["id"] == id.as_str())).collect();
    ensure(left.is_empty(), || format!("volumes of the clone journey left: {left:?}"))
}
