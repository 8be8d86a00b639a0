//! A disk moved from a dead node to the real node (issue 30): its volumes serve their
//! claims there after one `kubectl drivelet drive adopt`, with their data.
//!
//! The dead node is `node-gone`, which never had a Node object: a drivelet agent run on
//! the host under that name (with this cluster's id) makes two block volumes on a loop
//! drive of its own and writes 1 MiB of random bytes to each; their PVs (pinned to
//! `node-gone`, as the provisioner would have made them) and claims are created and
//! bound. The agent is stopped, and the drive is moved: its image file attached again
//! under the real node's drive filter. Then:
//! - the real node shows the drive `owned-elsewhere`, whose it is and its claims, and
//!   writes nothing to it (the image file's checksum holds while it is listed); nor to a
//!   disk beside it made to look like drivelet's (drivelet's disk GUID prefix, a
//!   partition of its type named `drivelet:../../../../etc/passwd`, no note);
//! - `kubectl drivelet drive adopt NODE/DRIVE --wait` ends with the drive managed;
//! - each claim's PV is pinned to the real node (same name, same claim uid), each claim
//!   has a `VolumeAdopted` Event, and a pod of each claim runs on the real node and reads
//!   the same checksum;
//! - everything is deleted again and the drive detached, so the journeys after find the
//!   real node as before.

use std::process::{Command, Stdio};

use super::drive_actions::plugin_ok;
use super::*;

const GONE: &str = "node-gone";
const CLAIMS: [&str; 2] = ["moved-a", "moved-b"];

fn moved_file() -> PathBuf {
    Path::new(E2E_DIR).join("drives/moved.img")
}

fn sh(cmd: &str, args: &[&str]) -> Result<String, String> {
    super::nodes::run_cmd(cmd, args).map(|s| s.trim().to_string())
}

/// The host agent of `node-gone`, as JSON of `drivelet csi|ctl ...`.
fn gone(args: &[&str]) -> Result<Value, String> {
    let bin = Path::new(E2E_DIR).join("bin/drivelet");
    let out = sh(&bin.display().to_string(), args)?;
    serde_json::from_str(&out).map_err(|e| format!("drivelet {}: {e}: {out}", args.join(" ")))
}

fn pv_yaml(pv: &str, claim: &str, handle: &str) -> String {
    pv_yaml_on(pv, claim, handle, GONE, "Delete")
}

fn pv_yaml_on(pv: &str, claim: &str, handle: &str, node: &str, policy: &str) -> String {
    format!(
        "apiVersion: v1
kind: PersistentVolume
metadata:
  name: {pv}
  annotations:
    pv.kubernetes.io/provisioned-by: {DRIVER}
spec:
  capacity:
    storage: 32Mi
  volumeMode: Block
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: {policy}
  storageClassName: drivelet-e2e-ext4
  claimRef:
    namespace: {NS}
    name: {claim}
  csi:
    driver: {DRIVER}
    volumeHandle: {handle}
  nodeAffinity:
    required:
      nodeSelectorTerms:
        - matchExpressions:
            - key: {TOPOLOGY_KEY}
              operator: In
              values: [{node}]
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {claim}
  namespace: {NS}
spec:
  storageClassName: drivelet-e2e-ext4
  volumeMode: Block
  accessModes: [ReadWriteOnce]
  volumeName: {pv}
  resources:
    requests:
      storage: 32Mi
---
"
    )
}

/// The node a PV is pinned to.
fn pinned_to(pv: &str) -> Result<String, String> {
    let v = get_json(&["get", "pv", pv])?;
    Ok(v["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"][0].as_str().unwrap_or_default().to_string())
}

/// Waits until the real node's Drive object of `drive_id` shows it owned elsewhere (the
/// Drive sync follows the inventory by a moment): what `kubectl drivelet` names.
fn wait_drive_object(drive_id: &str) -> Check {
    wait_for(&format!("the Drive object of {drive_id} owned elsewhere"), Duration::from_secs(60), || {
        let objs = get_json(&["get", "drives"])?;
        let found = objs["items"].as_array().into_iter().flatten().any(|o| {
            o["spec"]["driveId"] == drive_id && o["spec"]["node"] == real_node() && o["status"]["class"] == "owned-elsewhere"
        });
        Ok(found.then_some(()))
    })
}

fn md5_of(dev: &str, offset_mib: u64) -> Result<String, String> {
    let out = Command::new("sh")
        .args(["-c", &format!("dd if={dev} bs=1M skip={offset_mib} count=1 iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1")])
        .output()
        .map_err(|e| e.to_string())?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A drivelet agent run on the host under another node's name, on a loop drive of its
/// own under `E2E_DIR/NODE/drives`: the node a disk comes from.
struct HostAgent {
    child: std::process::Child,
    dir: PathBuf,
    img: PathBuf,
    dev: String,
    admin: String,
    sock: String,
}

impl HostAgent {
    /// Makes the drive (`size`, e.g. `256M`), writes the config (`extra` appended) and
    /// starts the agent as `node` of cluster `cluster`; waits until its drive is managed.
    fn start(node: &str, cluster: &str, size: &str, extra: &str) -> Result<HostAgent, String> {
        let dir = Path::new(E2E_DIR).join(node);
        std::fs::create_dir_all(dir.join("drives")).map_err(|e| e.to_string())?;
        let img = dir.join("drives/disk.img");
        sh("truncate", &["-s", size, &img.display().to_string()])?;
        let dev = sh("losetup", &["--find", "--show", &img.display().to_string()])?;
        sh("udevadm", &["settle"])?;
        let config = dir.join("drivelet.toml");
        std::fs::write(
            &config,
            format!(
                "[driver]\nnode_name = \"{node}\"\ncluster_id = \"{cluster}\"\n[paths]\ncsi_socket = \"{d}/csi.sock\"\nadmin_socket = \"{d}/admin.sock\"\nstate_dir = \"{d}/state\"\n\
                 [kubelet]\nregistration = false\n[http]\naddress = \"\"\n[drives]\nallow_loop = true\n[drives.filters]\ninclude_paths = [\"{d}/drives/*.img\"]\n\
                 [volumes]\nclean_blank_drives = false\n{extra}[log]\nformat = \"compact\"\n",
                d = dir.display()
            ),
        )
        .map_err(|e| e.to_string())?;
        let bin = Path::new(E2E_DIR).join("bin/drivelet");
        let log = std::fs::File::create(dir.join("agent.log")).map_err(|e| e.to_string())?;
        let child = Command::new(&bin).args(["run", "--config", &config.display().to_string()]).stdout(Stdio::null()).stderr(log).spawn().map_err(|e| e.to_string())?;
        let admin = dir.join("admin.sock").display().to_string();
        let sock = dir.join("csi.sock").display().to_string();
        let mut a = HostAgent { child, dir, img, dev, admin, sock };
        if let Err(e) = a.wait_managed(node) {
            a.stop();
            return Err(a.explain(e));
        }
        Ok(a)
    }

    fn wait_managed(&self, node: &str) -> Check {
        let t0 = Instant::now();
        let mut triggered = false;
        wait_for(&format!("{node}'s agent managing its drive"), Duration::from_secs(90), || {
            // A loop device number used before may keep udev's record of what it held
            // until udev probes it again: the drive's reason then says to trigger it.
            if !triggered && t0.elapsed() > Duration::from_secs(15) {
                triggered = true;
                let _ = sh("udevadm", &["trigger", "--action=change", &self.dev]);
            }
            let d = gone(&["ctl", "--socket", &self.admin, "drives", "-o", "json"]).ok();
            Ok(d.filter(|d| d.as_array().into_iter().flatten().any(|x| x["path"] == self.dev.as_str() && x["class"] == "managed" && x.get("cleaning").is_none())).map(|_| ()))
        })
    }

    /// A 32 MiB block volume named `pv` for claim `NS/claim` (the provisioner's
    /// metadata), with 1 MiB of random bytes at its start: its id and start.
    fn block_volume(&self, pv: &str, claim: &str) -> Result<(String, u64), String> {
        // The volume manager may still be reconciling a moment after the drive shows
        // managed: its "still starting; retry shortly" is retried, as the provisioner does.
        let v = wait_for(&format!("CreateVolume {pv} on a started agent"), Duration::from_secs(30), || {
            match gone(&[
                "csi", "--endpoint", &self.sock, "create", pv, "--size", "32Mi", "--block", "-o", "json",
                "--param", "media=virtual", "--param", "layout=partition",
                "--param", &format!("csi.storage.k8s.io/pv/name={pv}"),
                "--param", &format!("csi.storage.k8s.io/pvc/name={claim}"),
                "--param", &format!("csi.storage.k8s.io/pvc/namespace={NS}"),
            ]) {
                Ok(v) => Ok(Some(v)),
                Err(e) if e.contains("still starting") => Ok(None),
                Err(e) => Err(e),
            }
        })?;
        let id = v["volume_id"].as_str().ok_or(format!("created {v}"))?.to_string();
        let rec = gone(&["ctl", "--socket", &self.admin, "volumes", "-o", "json"])?;
        let start = rec.as_array().into_iter().flatten().find(|r| r["id"] == id.as_str()).and_then(|r| r["start"].as_u64()).ok_or(format!("no record of {id}: {rec}"))?;
        sh("sh", &["-c", &format!("head -c 1048576 /dev/urandom | dd of={} bs=1M seek={} oflag=direct conv=notrunc 2>/dev/null", self.dev, start / MIB)])?;
        Ok((id, start))
    }

    /// SIGTERM, then waits for the agent to exit.
    fn stop(&mut self) {
        let _ = nix_term(&mut self.child);
    }

    /// `e` with what the agent said and what udev knows of its drive.
    fn explain(&self, e: String) -> String {
        with_agent_log(e, &self.dir, &self.dev)
    }
}

pub(crate) fn journey_moved_disk(ctx: &mut Ctx) -> Check {
    kubectl(&["create", "namespace", NS]).or_else(|e| if e.contains("AlreadyExists") { Ok(String::new()) } else { Err(e) })?;
    // node-gone's agent: this cluster's id, its own drive only.
    let cluster = get_json(&["get", "namespace", "kube-system"])?["metadata"]["uid"].as_str().unwrap_or_default().to_string();
    let mut agent = HostAgent::start(GONE, &cluster, "512M", "")?;
    let (dev, img, dir) = (agent.dev.clone(), agent.img.clone(), agent.dir.clone());
    let made = (|| -> Result<Vec<(String, String, String, u64)>, String> {
        let mut made = Vec::new();
        for c in CLAIMS {
            let pv = format!("pv-{c}");
            let (id, start) = agent.block_volume(&pv, c)?;
            made.push((c.to_string(), pv, id, start));
        }
        Ok(made)
    })();
    agent.stop();
    let made = made.map_err(|e| agent.explain(e))?;
    let sums: Vec<String> = made.iter().map(|(_, _, _, start)| md5_of(&dev, start / MIB)).collect::<Result<_, _>>()?;
    let mut objects = String::new();
    for (c, pv, id, _) in &made {
        objects += &pv_yaml(pv, c, id);
    }
    apply(&objects)?;
    for (c, _, _, _) in &made {
        wait_for(&format!("claim {c} Bound"), Duration::from_secs(60), || {
            Ok((get_json(&["get", "pvc", "-n", NS, c])?["status"]["phase"] == "Bound").then_some(()))
        })?;
    }
    let uids: Vec<String> = made.iter().map(|(c, _, _, _)| get_json(&["get", "pvc", "-n", NS, c]).map(|v| v["metadata"]["uid"].as_str().unwrap_or_default().to_string())).collect::<Result<_, _>>()?;

    // The disk moved to the real node: under its drive filter.
    sh("losetup", &["-d", &dev])?;
    std::fs::rename(&img, moved_file()).map_err(|e| e.to_string())?;
    let dev = sh("losetup", &["--find", "--show", &moved_file().display().to_string()])?;
    sh("udevadm", &["settle"])?;
    let drive = wait_for("the moved drive owned elsewhere on the real node", Duration::from_secs(60), || {
        Ok(ctl_drives()?.into_iter().find(|d| d["path"] == dev.as_str() && d["class"] == "owned-elsewhere"))
    })?;
    let reason = drive["reason"].as_str().unwrap_or_default().to_string();
    for words in [format!("belongs to node {GONE} of this cluster"), format!("claim {NS}/moved-a (32.0 MiB)"), "until an admin adopts it".into()] {
        ensure(reason.contains(&words), || format!("the moved drive's reason lacks {words:?}: {reason}"))?;
    }
    let drive_id = drive["id"].as_str().unwrap_or_default().to_string();
    // Beside it, a disk made to look like drivelet's: its disk GUID prefix, a partition
    // of its type named like a path, no note.
    let crafted = Path::new(E2E_DIR).join("drives/crafted.img");
    sh("truncate", &["-s", "64M", &crafted.display().to_string()])?;
    let script = format!(
        "label: gpt\nlabel-id: 6472766C-1111-4222-8333-444455556666\nstart=2048, size=32768, type=DF8E4BD2-B4F6-46AF-B301-8BCBFF739F75, name=\"drivelet:../../../../etc/passwd\"\n"
    );
    let mut sf = Command::new("sfdisk").args(["--no-reread", "--no-tell-kernel", &crafted.display().to_string()]).stdin(Stdio::piped()).stdout(Stdio::null()).spawn().map_err(|e| e.to_string())?;
    std::io::Write::write_all(sf.stdin.as_mut().ok_or("sfdisk stdin")?, script.as_bytes()).map_err(|e| e.to_string())?;
    ensure(sf.wait().map_err(|e| e.to_string())?.success(), || "sfdisk failed to craft the disk".into())?;
    let crafted_dev = sh("losetup", &["--find", "--show", &crafted.display().to_string()])?;
    sh("udevadm", &["settle"])?;
    let c = wait_for("the crafted drive owned elsewhere on the real node", Duration::from_secs(60), || {
        Ok(ctl_drives()?.into_iter().find(|d| d["path"] == crafted_dev.as_str() && d["class"] == "owned-elsewhere"))
    })?;
    ensure(c["reason"].as_str().unwrap_or_default().contains("no note of whose they are"), || format!("the crafted drive: {c}"))?;
    let before = sh("md5sum", &[&moved_file().display().to_string()])?;
    let crafted_before = sh("md5sum", &[&crafted.display().to_string()])?;
    std::thread::sleep(Duration::from_secs(3));
    ensure(sh("md5sum", &[&moved_file().display().to_string()])? == before, || "the real node wrote to a disk that is not its own".into())?;
    ensure(sh("md5sum", &[&crafted.display().to_string()])? == crafted_before, || "the real node wrote to the crafted disk".into())?;
    ensure(!ctl_volumes()?.iter().any(|v| v["drive_id"] == c["id"]), || "a volume was taken from the crafted disk".into())?;
    sh("losetup", &["-d", &crafted_dev])?;
    let _ = std::fs::remove_file(&crafted);

    wait_drive_object(&drive_id)?;
    let t = Instant::now();
    let said = plugin_ok(&["drive", "adopt", &format!("{}/{drive_id}", real_node()), "--wait", "1m"])?;
    ensure(said.to_lowercase().contains("adopt"), || format!("kubectl drivelet drive adopt said: {said}"))?;
    for ((c, pv, _, _), uid) in made.iter().zip(&uids) {
        wait_for(&format!("PV {pv} pinned to {}", real_node()), Duration::from_secs(90), || Ok((pinned_to(pv).ok().as_deref() == Some(real_node())).then_some(())))?;
        wait_for(&format!("claim {c} Bound again"), Duration::from_secs(60), || {
            let v = get_json(&["get", "pvc", "-n", NS, c])?;
            Ok((v["status"]["phase"] == "Bound" && v["metadata"]["uid"] == uid.as_str() && v["spec"]["volumeName"] == pv.as_str()).then_some(()))
        })?;
        ensure(!events_in(NS, "PersistentVolumeClaim", c, "VolumeAdopted")?.is_empty(), || format!("claim {c} has no VolumeAdopted Event"))?;
    }
    ctx.measured.insert("moved disk adopted -> PVs pinned here".into(), format!("{:.1}s", t.elapsed().as_secs_f64()));
    let mut objects = String::new();
    for (c, _, _, _) in &made {
        objects += &pod(&format!("{c}-pod"), c, true, "", "true");
    }
    apply(&objects)?;
    for ((c, _, _, _), sum) in made.iter().zip(&sums) {
        wait_pod_running(&format!("{c}-pod"), Duration::from_secs(120))?;
        let got = in_pod(&format!("{c}-pod"), "dd if=/dev/e2e-block bs=1M count=1 2>/dev/null | md5sum | cut -d' ' -f1")?;
        ensure(got == *sum, || format!("claim {c} reads {got} on the real node, {sum} was written on {GONE}"))?;
    }

    // Gone again: pods, claims (Delete: the volumes too), the drive.
    let pods: Vec<String> = made.iter().map(|(c, _, _, _)| format!("{c}-pod")).collect();
    let mut args = vec!["delete", "pod", "-n", NS, "--wait=true", "--timeout=60s"];
    args.extend(pods.iter().map(String::as_str));
    kubectl(&args)?;
    for (c, pv, _, _) in &made {
        kubectl(&["delete", "pvc", "-n", NS, c, "--wait=true", "--timeout=60s"])?;
        wait_for(&format!("PV {pv} gone"), Duration::from_secs(90), || Ok(kubectl(&["get", "pv", pv]).is_err().then_some(())))?;
    }
    sh("losetup", &["-d", &dev])?;
    wait_for("the moved drive gone from the real node", Duration::from_secs(60), || {
        Ok((!ctl_drives()?.iter().any(|d| d["id"] == drive_id.as_str())).then_some(()))
    })?;
    let _ = std::fs::remove_file(moved_file());
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// `e` with what the host agent said and what udev knows of its drive.
fn with_agent_log(e: String, dir: &Path, dev: &str) -> String {
    let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(25).collect::<Vec<_>>().into_iter().rev().collect();
    let udev = Command::new("udevadm").args(["info", "--query=property", dev]).output().map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    format!("{e}\nthe host agent's log:\n{}\nudev of {dev}:\n{udev}", tail.join("\n"))
}

/// SIGTERM, then waits for the agent to exit.
fn nix_term(child: &mut std::process::Child) -> Check {
    let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
    for _ in 0..200 {
        if child.try_wait().map_err(|e| e.to_string())?.is_some() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    Ok(())
}

/// The old cluster's id in the rebuilt-cluster journey.
const OLD_CLUSTER: &str = "0ld00000-0000-4000-8000-0000000000c1";
const OLD_NODE: &str = "node-old";

/// Whether the note region of `file` (its first MiB) holds `needle`.
fn note_says(file: &Path, needle: &str) -> bool {
    std::fs::read(file).map(|b| b[64 << 10..512 << 10].windows(needle.len()).any(|w| w == needle.as_bytes())).unwrap_or(false)
}

/// A cluster rebuilt (its etcd lost): a disk of the old cluster shows as another
/// cluster's and, adopted with `--restore-claims`, gets its claim back from its note, so
/// a pod of a claim of the same name finds its data.
///
/// The old cluster is `node-old`, a drivelet agent run on the host with another cluster
/// id and the kit's API (so its re-homing records the claim's uid and StorageClass in
/// the disk's note, as it would in its own cluster); its PV and claim are then deleted,
/// as a rebuilt cluster has none of them.
pub(crate) fn journey_rebuilt_cluster(_ctx: &mut Ctx) -> Check {
    kubectl(&["create", "namespace", NS]).or_else(|e| if e.contains("AlreadyExists") { Ok(String::new()) } else { Err(e) })?;
    let kubeconfig = std::env::var("KUBECONFIG").unwrap_or_else(|_| "/var/tmp/k8s-kit/admin.kubeconfig".into());
    let kube = format!(
        "[kubernetes]\nenabled = true\nkubeconfig = \"{kubeconfig}\"\nattach = false\nresize = false\nsnapshots = false\n\
         events = false\ndrive_objects = false\nlabel_node = false\ncluster_duties = false\n"
    );
    let mut agent = HostAgent::start(OLD_NODE, OLD_CLUSTER, "256M", &kube)?;
    let (dev, img, dir) = (agent.dev.clone(), agent.img.clone(), agent.dir.clone());
    let (claim, pv) = ("restored-a", "pv-restored-a");
    let made = (|| -> Result<(String, u64), String> {
        let (id, start) = agent.block_volume(pv, claim)?;
        apply(&pv_yaml_on(pv, claim, &id, OLD_NODE, "Retain"))?;
        wait_for(&format!("claim {claim} Bound"), Duration::from_secs(60), || Ok((get_json(&["get", "pvc", "-n", NS, claim])?["status"]["phase"] == "Bound").then_some(())))?;
        let uid = get_json(&["get", "pvc", "-n", NS, claim])?["metadata"]["uid"].as_str().unwrap_or_default().to_string();
        // The old cluster's drivelet learns the claim's uid and class; its note says so.
        wait_for("the old disk's note naming the claim's uid and class", Duration::from_secs(60), || {
            Ok((note_says(&img, &uid) && note_says(&img, "drivelet-e2e-ext4")).then_some(()))
        })?;
        Ok((id, start))
    })();
    agent.stop();
    let (id, start) = made.map_err(|e| agent.explain(e))?;
    let sum = md5_of(&dev, start / MIB)?;
    // The cluster rebuilt: none of its objects are left.
    kubectl(&["delete", "pvc", "-n", NS, claim, "--wait=true", "--timeout=60s"])?;
    kubectl(&["delete", "pv", pv, "--wait=true", "--timeout=60s"])?;

    // Its disk seen by this cluster: another cluster's, untouched, then adopted with its claims.
    sh("losetup", &["-d", &dev])?;
    let moved = Path::new(E2E_DIR).join("drives/old.img");
    std::fs::rename(&img, &moved).map_err(|e| e.to_string())?;
    let dev = sh("losetup", &["--find", "--show", &moved.display().to_string()])?;
    sh("udevadm", &["settle"])?;
    let drive = wait_for("the old cluster's drive owned elsewhere on the real node", Duration::from_secs(60), || {
        Ok(ctl_drives()?.into_iter().find(|d| d["path"] == dev.as_str() && d["class"] == "owned-elsewhere"))
    })?;
    let reason = drive["reason"].as_str().unwrap_or_default().to_string();
    ensure(reason.contains(&format!("belongs to node {OLD_NODE} of another cluster ({OLD_CLUSTER})")) && reason.contains(&format!("claim {NS}/{claim}")), || {
        format!("the old cluster's drive: {reason}")
    })?;
    let drive_id = drive["id"].as_str().unwrap_or_default().to_string();
    let target = format!("{}/{drive_id}", real_node());
    wait_drive_object(&drive_id)?;
    plugin_ok(&["drive", "adopt", &target, "--restore-claims", "--wait", "1m"])?;
    wait_for(&format!("claim {claim} restored and Bound to {pv}"), Duration::from_secs(90), || {
        let v = get_json(&["get", "pvc", "-n", NS, claim]).ok();
        Ok(v.filter(|v| v["status"]["phase"] == "Bound" && v["spec"]["volumeName"] == pv && v["spec"]["storageClassName"] == "drivelet-e2e-ext4").map(|_| ()))
    })?;
    ensure(pinned_to(pv)? == real_node(), || format!("the restored PV {pv} is pinned to {}", pinned_to(pv).unwrap_or_default()))?;
    ensure(!events_in(NS, "PersistentVolumeClaim", claim, "ClaimRestored")?.is_empty(), || format!("claim {claim} has no ClaimRestored Event"))?;
    // A pod of a claim of that name finds its data (a StatefulSet applied again would).
    apply(&pod("restored-pod", claim, true, "", "true"))?;
    wait_pod_running("restored-pod", Duration::from_secs(120))?;
    let got = in_pod("restored-pod", "dd if=/dev/e2e-block bs=1M count=1 2>/dev/null | md5sum | cut -d' ' -f1")?;
    ensure(got == sum, || format!("the restored claim reads {got}; {sum} was written in the old cluster"))?;

    // Done: the action set back (no more restoring), then everything deleted: the
    // restored PV keeps its volume (Retain), deleted through CSI.
    plugin_ok(&["drive", "uncordon", &target])?;
    kubectl(&["delete", "pod", "-n", NS, "restored-pod", "--wait=true", "--timeout=60s"])?;
    kubectl(&["delete", "pvc", "-n", NS, claim, "--wait=true", "--timeout=60s"])?;
    wait_for(&format!("PV {pv} Released"), Duration::from_secs(60), || Ok((get_json(&["get", "pv", pv])?["status"]["phase"] == "Released").then_some(())))?;
    kubectl(&["delete", "pv", pv, "--wait=true", "--timeout=60s"])?;
    wait_for(&format!("the VolumeAttachments of {pv} gone"), Duration::from_secs(90), || {
        let vas = get_json(&["get", "volumeattachments"])?;
        Ok((!vas["items"].as_array().into_iter().flatten().any(|v| v["spec"]["source"]["persistentVolumeName"] == pv)).then_some(()))
    })?;
    drivelet(&["csi", "--endpoint", CSI_SOCKET, "delete", &id])?;
    sh("losetup", &["-d", &dev])?;
    wait_for("the old cluster's drive gone from the real node", Duration::from_secs(60), || {
        Ok((!ctl_drives()?.iter().any(|d| d["id"] == drive_id.as_str())).then_some(()))
    })?;
    let _ = std::fs::remove_file(&moved);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
