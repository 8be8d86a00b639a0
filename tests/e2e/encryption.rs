//! The encryption journey: a class with `drivelet.io/encryption: fscrypt` whose Secret
//! (a random key-encryption key) kubelet hands to NodeStageVolume.
//!
//! - A pod writes a marker (file contents and file name) to a claim of the class and
//!   reads it back; meanwhile the raw drive image under the volume holds the marker 0
//!   times, and its partition's first KiB holds the wrapped key.
//! - The claim is deleted: its PV goes, and the raw drive holds neither the marker nor
//!   any key header (crypto-erase, then the wipe and the cleaner's zeros).
//! - A block claim of the class waits with a `ProvisioningFailed` saying a block volume
//!   cannot be encrypted.
//!
//! Everything it makes is deleted at its end (claims, pods, class, Secret).

use std::time::Duration;

use super::*;

const CLASS: &str = "drivelet-e2e-encrypted";
const SECRET: &str = "drivelet-e2e-kek";
const MARKER: &str = "DRIVELET-E2E-TENANT-MARKER-5K";
const MARKER_NAME: &str = "DRIVELET-E2E-SECRET-NAME-3W";

fn class_and_secret() -> Result<String, String> {
    let mut kek = [0u8; 32];
    let mut f = std::fs::File::open("/dev/urandom").map_err(|e| e.to_string())?;
    std::io::Read::read_exact(&mut f, &mut kek).map_err(|e| e.to_string())?;
    let hex: String = kek.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!(
        "apiVersion: v1
kind: Secret
metadata:
  name: {SECRET}
  namespace: {NS}
stringData:
  key: \"{hex}\"
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: {CLASS}
provisioner: {DRIVER}
parameters:
  media: virtual
  csi.storage.k8s.io/fstype: ext4
  drivelet.io/encryption: fscrypt
  csi.storage.k8s.io/node-stage-secret-name: {SECRET}
  csi.storage.k8s.io/node-stage-secret-namespace: {NS}
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
"
    ))
}

/// Occurrences of `needle` in `file` (grep's fixed-string search over raw bytes).
fn count_in(file: &str, needle: &str) -> Result<usize, String> {
    let out = std::process::Command::new("grep").env("LC_ALL", "C").args(["-a", "-o", "-F", needle, file]).output().map_err(|e| e.to_string())?;
    if out.status.code().is_none_or(|c| c > 1) {
        return Err(format!("grep {file}: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(out.stdout.split(|b| *b == b'\n').filter(|l| !l.is_empty()).count())
}

/// The image file of the drive `drive_id`, from `ctl drives`.
fn image_of(drive_id: &str) -> Result<String, String> {
    let d = ctl_drives()?.into_iter().find(|d| d["id"] == drive_id).ok_or_else(|| format!("drive {drive_id} not listed"))?;
    d["backing_file"].as_str().map(str::to_string).filter(|s| !s.is_empty()).ok_or_else(|| format!("drive {drive_id} has no backing file: {d}"))
}

pub(crate) fn journey_encryption(ctx: &mut Ctx) -> Check {
    kubectl(&["create", "namespace", NS]).or_else(|e| if e.contains("AlreadyExists") { Ok(String::new()) } else { Err(e) })?;
    apply(&class_and_secret()?)?;
    let script = format!("i=0; while [ $i -lt 2000 ]; do printf '{MARKER}'; i=$((i+1)); done > /data/{MARKER_NAME} && sync && cat /data/{MARKER_NAME} | head -c 29");
    apply(&(claim("enc", CLASS, 64, "Filesystem", "ReadWriteOnce") + &pod("enc", "enc", false, "", &script)))?;
    wait_pod_running("enc", Duration::from_secs(120))?;
    let read = wait_for("the pod's marker read back", Duration::from_secs(60), || {
        Ok(in_pod("enc", &format!("head -c 29 /data/{MARKER_NAME}")).ok().filter(|s| s == MARKER))
    })?;
    ensure(read == MARKER, || format!("the pod read {read:?}"))?;
    let rec = record_of("enc")?;
    let (drive_id, start) = (rec["drive_id"].as_str().unwrap_or_default().to_string(), rec["start"].as_u64().unwrap_or_default());
    let image = image_of(&drive_id)?;
    let _ = std::process::Command::new("sync").status();
    let header = {
        use std::os::unix::fs::FileExt;
        let mut b = [0u8; 8];
        std::fs::File::open(&image).map_err(|e| e.to_string())?.read_exact_at(&mut b, start).map_err(|e| e.to_string())?;
        b
    };
    ensure(&header == b"DRVLKEY1", || format!("the partition at byte {start} of {image} starts with {header:?}, not the key header"))?;
    let (in_use, names) = (count_in(&image, MARKER)?, count_in(&image, MARKER_NAME)?);
    ctx.measured.insert("encrypted claim in use: marker / file name in the raw drive".into(), format!("{in_use} / {names} times"));
    ensure(in_use == 0 && names == 0, || format!("the raw drive holds the marker {in_use} times and its name {names} times while in use"))?;

    // Deleted: no marker, no key header anywhere on the drive.
    let pv = pv_of("enc")?;
    kubectl(&["delete", "pod", "-n", NS, "enc", "--wait=true", "--timeout=60s"])?;
    kubectl(&["delete", "pvc", "-n", NS, "enc", "--wait=true", "--timeout=60s"])?;
    let t = Instant::now();
    wait_for(&format!("PV {pv} gone"), Duration::from_secs(90), || Ok(kubectl(&["get", "pv", &pv]).is_err().then_some(())))?;
    ctx.measured.insert("encrypted claim deleted -> PV gone".into(), format!("{:.1}s", t.elapsed().as_secs_f64()));
    let _ = std::process::Command::new("sync").status();
    let (after, headers) = (count_in(&image, MARKER)? + count_in(&image, MARKER_NAME)?, count_in(&image, "DRVLKEY1")?);
    ensure(after == 0 && headers == 0, || format!("after delete the raw drive holds the marker {after} times and {headers} key headers"))?;

    // A block claim of the class: refused in words.
    apply(&claim("enc-block", CLASS, 64, "Block", "ReadWriteOnce"))?;
    apply(&pod("enc-block", "enc-block", true, "", "sleep 3600"))?;
    let ev = wait_every("a ProvisioningFailed Event on claim enc-block", Duration::from_secs(120), Duration::from_secs(1), || {
        Ok(events_for("PersistentVolumeClaim", "enc-block", "ProvisioningFailed")?.into_iter().next())
    })?;
    let message = ev["message"].as_str().unwrap_or_default().to_string();
    ensure(message.contains("a block volume cannot be encrypted"), || format!("the block claim's Event: {message}"))?;
    ctx.measured.insert("block claim of an encrypting class, Event".into(), message);

    kubectl(&["delete", "pod", "-n", NS, "enc-block", "--wait=true", "--timeout=60s"])?;
    kubectl(&["delete", "pvc", "-n", NS, "enc-block", "--wait=true", "--timeout=60s"])?;
    kubectl(&["delete", "storageclass", CLASS])?;
    kubectl(&["delete", "secret", "-n", NS, SECRET])?;
    Ok(())
}
