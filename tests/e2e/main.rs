//! The end-to-end suite: drivelet as a DaemonSet pod on a real Kubernetes (the kit in
//! `../shared/k8s`: kube-apiserver, controller-manager, scheduler, kubelet with
//! containerd, the real external-provisioner) with one real node and two fake ones,
//! walking the journeys a user walks.
//!
//! Run it with `scripts/e2e.sh`, which builds the image, brings the kit up with
//! `EXTRA_NODES="node-2 node-3"`, attaches the suite's loop drives, installs the smartctl
//! stand-in and starts the fake nodes' CSI side as host processes (`scripts/e2e-node.sh`),
//! runs this binary, and takes everything down again. Run alone (`cargo test --test e2e`),
//! it expects all of that done and fails, saying what is missing, when it is not.
//!
//! The real node's journeys, in order, each building on the one before (their pods are
//! pinned to the real node: nothing runs pods on a fake one):
//! 1. deploy: `kubectl apply -k tests/e2e/overlay`; the DaemonSet Ready (on the real node
//!    only); CSINode lists the driver with its topology key; the node carries the label;
//!    `kubectl get drives` shows each drive; each CSIStorageCapacity equals GetCapacity for
//!    its class (and a claim of an fstype vfat class gets a ProvisioningFailed Event
//!    naming "vfat" and "ext4 or xfs", and no volume); then claims grown by editing them, on the empty drives (`resize.rs`);
//! 1b. evacuation (`evacuate.rs`): three volumes moved off a drive with `kubectl drivelet
//!    drive evacuate`, one once its pod is deleted, the agent killed with SIGKILL mid-move;
//!    claims, PVs and data unchanged; the drive released, pulled and replaced by a blank
//!    one, so the journeys after find three empty drives again;
//! 2. a drive vanishing while it holds a volume: the Drive object shows it missing and
//!    lists the volume, the volume is abnormal; the claim deleted: the object goes; the
//!    drive back: the volume's partition is listed again and can be deleted by hand;
//! 3. claims used by pods: ext4, xfs with fsGroup, block, ReadWriteOncePod, data written
//!    and read back; a second pod on the same ReadWriteOnce claim;
//! 4. the drivelet pod deleted with volumes in use, then a rolling update: pods keep
//!    their data, nothing is formatted again;
//! 5. pods deleted: VolumeAttachments detached and gone, finalizers removed, no mount
//!    left; a claim deleted: PV gone, partition gone, capacity back;
//! 6. a drive failing under a running pod: Events on the claim and the pod within 2 s,
//!    the Drive object shows it, ControllerGetVolume and ListVolumes say abnormal, new
//!    claims land on other drives; `drivelet ctl drive release` through `kubectl exec`
//!    keeps new claims off a drive;
//! 7. everything deleted: no volume, PV, VolumeAttachment or mount left.
//!
//! Between 5 and 6, claims are cloned from claims (`clone.rs`), snapshotted and restored
//! (`snapshots.rs`), and claims (`claims.rs`; while the real node's drives still have
//! room): a class with `volumeBindingMode: Immediate` and
//! `allowedTopologies` naming the real node provisions there before any pod, and its pod
//! runs there; claims that wait get one Warning Event each saying why, in words (a vfat
//! class `NotSupportedByDrivelet`; an Immediate class allowing only a node that does not
//! exist, and a claim larger than its allowed node can make, `NoNodeForClaim`); then a
//! volume filled up, seen by Prometheus (`monitoring.rs`). Between 6 and 7, drive actions
//! through the Drive spec and the `kubectl drivelet` tables (`drive_actions.rs`) and the
//! disk journeys (`adopt.rs`).
//!
//! Across nodes (`nodes.rs`), on their own thread once the deploy journey is done,
//! beside the real node's journeys (their own namespace; joined before the clean-up):
//! a. placement: each fake node's CSIStorageCapacity equals its agent's GetCapacity; a
//!    claim only node-2 can hold lands there with its pod; one no node can hold leaves its
//!    pod Pending for lack of storage with no PV; a pod pinned to a node without room is
//!    refused and nothing is made elsewhere; ext4, xfs and block claims on node-2 attach;
//! b. node-2 stopped (heartbeat and agent) past NotReady, then back: nothing released;
//! c. node-2 deleted for good (agent stopped), with the Lease holder killed by kill -9
//!    mid-way (d): the Lease moves to another candidate; no VolumeAttachment, Drive object
//!    or released PV of node-2 is left; a release-claims StatefulSet claim is released and
//!    its replica comes back on a live node; default claims stay with a NodeDeleted Event;
//!    node-2 back on the same drives: removed volumes deleted, kept ones serve.
//!
//! Watched (`monitoring.rs`): a real Prometheus scrapes every agent and kubelet with
//! drivelet's alerts loaded from right after the deploy journey; a volume is filled before
//! the drive-failing journey; before the clean-up it judges the run: every dashboard panel returned series, the alerts the journeys
//! provoked (a drive vanishing, a drive failing, a volume filled) were raised and no other.
//!
//! On failure it prints what explains it: the cluster's objects and Events, drivelet's
//! logs, and kubelet's log lines about the driver.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

mod adopt;
mod burst;
mod claims;
mod clone;
mod drive_actions;
mod encryption;
mod evacuate;
mod monitoring;
mod nodes;
mod ownership;
mod snapshots;
mod upgrade;

const NS: &str = "drivelet-e2e";
const SYSTEM_NS: &str = "drivelet-system";
const DRIVER: &str = "csi.drivelet.io";
const TOPOLOGY_KEY: &str = "topology.drivelet.io/node";
const CONFIG: &str = "/etc/drivelet/drivelet.toml";
const CSI_SOCKET: &str = "/var/lib/kubelet/plugins/csi.drivelet.io/csi.sock";
/// Host directory of the suite (made by scripts/e2e.sh, mounted into the pod).
const E2E_DIR: &str = "/var/tmp/drivelet-e2e";
const BUSYBOX: &str = "k8s-kit.local/busybox:1.35";
const MIB: u64 = 1 << 20;

type Check = Result<(), String>;

/// The real node (the one without the kit's `k8s-kit/fake-node` label), where every pod
/// of the real node's journeys is pinned.
static REAL_NODE: OnceLock<String> = OnceLock::new();

fn real_node() -> &'static str {
    REAL_NODE.get().map(String::as_str).unwrap_or("node-1")
}

mod resize;

fn main() {
    let started = Instant::now();
    let mut ctx = match Ctx::new() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("e2e: cannot run: {e}");
            std::process::exit(2);
        }
    };
    let journeys: [(&str, fn(&mut Ctx) -> Check); 22] = [
        ("deploy: DaemonSet, registration, label, drives, capacity", journey_deploy),
        ("upgrade from the two-container DaemonSet: the sidecar's claim, PV and volume kept, served, not provisioned again, then deleted as before", upgrade::journey_upgrade),
        ("monitoring: Prometheus scrapes every agent and kubelet, the alerts loaded; each node's drives in the metrics; nothing alerts while all is well", monitoring::journey_watch),
        ("the state dir wiped: every volume served again from its disk, same claims, same data", ownership::journey_state_wiped),
        ("evacuate: three volumes moved off a drive, one after its pod, kill -9 mid-move; the drive replaced", evacuate::journey_evacuate),
        ("claims grown by editing them: xfs in use, ext4 unused, too large then lowered", resize::journey_resize),
        ("a drive vanishing while it holds a volume, and coming back", journey_vanish),
        ("claims used by pods: ext4, xfs with fsGroup, block, ReadWriteOncePod, a second pod", journey_claims),
        ("drivelet pod deleted, then a rolling update, with volumes in use", journey_restart),
        ("pods and a claim deleted: detach, finalizers, mounts, partition, capacity", journey_delete),
        ("claims cloned while pods write to them: ext4 and xfs frozen, consistent prefixes, clean; block refused once in words, then copied", clone::journey_clone),
        ("snapshots: refused in use, frozen, restored (ext4, xfs, block) after source deletion and a restart; space freed", snapshots::journey_snapshots),
        ("claims: Immediate with allowedTopologies provisioned on the real node, its pod Running there; waiting claims warned why", claims::journey_claims_waiting),
        ("encryption: an encrypted class's claim leaves only ciphertext on its drive and its delete leaves no key; a block claim refused", encryption::journey_encryption),
        ("monitoring: a drive's NVMe report and a volume filled up, seen by Prometheus: its reason and its alert", monitoring::journey_fill),
        ("a drive failing under a running pod; a drive released", journey_failure),
        ("kubectl drivelet: tables as ctl's, cordon, uncordon, release through the Drive spec", drive_actions::journey_drive_actions),
        ("a disk moved from a dead node: owned elsewhere, untouched, adopted; its claims' PVs pinned here, their data read by pods here", adopt::journey_moved_disk),
        ("a disk of a rebuilt cluster: another cluster's, adopted with --restore-claims; its claim back with its data", adopt::journey_rebuilt_cluster),
        ("the 50-claim burst, measured before (with the sidecar) and after (drivelet alone); only with E2E_JOURNEYS=burst", burst::journey_burst),
        ("monitoring: every dashboard panel had series over the run; the alerts the journeys provoked were raised, and no other", monitoring::journey_judge),
        ("clean-up: nothing left behind", journey_cleanup),
    ];
    let mut failed = None;
    let mut across: Option<std::thread::JoinHandle<nodes::Outcome>> = None;
    let last = journeys.len() - 1;
    // E2E_JOURNEYS=nodes: deploy, the journeys across nodes and the clean-up only;
    // E2E_JOURNEYS=snapshots: deploy, the snapshot journey and the clean-up only (quicker
    // reruns while working on them; said in the output, never the default).
    let only = std::env::var("E2E_JOURNEYS").ok();
    let only_nodes = only.as_deref() == Some("nodes");
    let only_snapshots = only.as_deref() == Some("snapshots");
    // E2E_JOURNEYS=evacuate: deploy, the evacuation journey and the clean-up.
    let only_evacuate = only.as_deref() == Some("evacuate");
    // E2E_JOURNEYS=ownership: deploy, the state dir wiped, the moved disk and the clean-up.
    let only_ownership = only.as_deref() == Some("ownership");
    // E2E_JOURNEYS=burst: deploy, the 50-claim burst (a measurement, in no other run), clean-up.
    let only_burst = only.as_deref() == Some("burst");
    // E2E_JOURNEYS=upgrade: deploy, the upgrade from the two-container DaemonSet, the clean-up.
    let only_upgrade = only.as_deref() == Some("upgrade");
    // E2E_JOURNEYS=claims: deploy, the claims journey and the clean-up.
    let only_claims = only.as_deref() == Some("claims");
    // E2E_JOURNEYS=encryption: deploy, the encryption journey and the clean-up.
    let only_encryption = only.as_deref() == Some("encryption");
    // E2E_JOURNEYS=clone: deploy, the clone journey and the clean-up.
    let only_clone = only.as_deref() == Some("clone");
    // E2E_JOURNEYS=monitoring: deploy, Prometheus, the journeys that provoke its alerts
    // (a drive vanishing, claims used by pods, a drive failing), its judgement, clean-up.
    let only_monitoring = only.as_deref() == Some("monitoring");
    for (i, (name, run)) in journeys.iter().enumerate() {
        if i == last {
            // The clean-up asserts an empty cluster: the journeys across nodes finish first.
            if let Some(h) = across.take() {
                failed = join_across(h, &mut ctx);
                if failed.is_some() {
                    break;
                }
            }
        }
        let t = Instant::now();
        println!("e2e: [{}/{}] {name}", i + 1, journeys.len());
        let evacuation = name.starts_with("evacuate:");
        let ownership = name.starts_with("the state dir wiped") || name.starts_with("a disk moved") || name.starts_with("a disk of a rebuilt cluster");
        let claims = name.starts_with("claims:");
        let monitoring = name.starts_with("monitoring:");
        let burst = name.starts_with("the 50-claim burst");
        let picked = if only_burst {
            i == 0 || i == last || burst
        } else if burst {
            false
        } else if only_upgrade {
            i == 0 || i == last || name.starts_with("upgrade from")
        } else if only_claims {
            i == 0 || i == last || claims
        } else if only_encryption {
            i == 0 || i == last || name.starts_with("encryption:")
        } else if only_clone {
            i == 0 || i == last || name.starts_with("claims cloned")
        } else if only_monitoring {
            i == 0 || i == last || monitoring || name.starts_with("a drive vanishing") || name.starts_with("claims used by pods") || name.starts_with("a drive failing")
        } else if only_evacuate {
            i == 0 || i == last || evacuation
        } else if only_ownership {
            i == 0 || i == last || ownership
        } else {
            !(only_nodes || only_snapshots) || i == 0 || i == last || (only_snapshots && name.starts_with("snapshots:"))
        };
        if !picked {
            println!("e2e: [{}/{}] NOT RUN (E2E_JOURNEYS={})", i + 1, journeys.len(), only.as_deref().unwrap_or_default());
            continue;
        }
        match run(&mut ctx) {
            Ok(()) => println!("e2e: [{}/{}] ok in {:.1}s", i + 1, journeys.len(), t.elapsed().as_secs_f64()),
            Err(e) => {
                println!("e2e: [{}/{}] FAILED after {:.1}s: {e}", i + 1, journeys.len(), t.elapsed().as_secs_f64());
                failed = Some(format!("{name}: {e}"));
                break;
            }
        }
        // Once deployed (CSIDriver, classes) and watched (Prometheus sees all well before
        // the fake nodes are stopped on purpose), the journeys across nodes start beside
        // the rest.
        let watched = if only_nodes { i == 0 } else { name.starts_with("monitoring: Prometheus scrapes") };
        if watched && !only_snapshots && !only_evacuate && !only_ownership && !only_monitoring && !only_claims && !only_encryption && !only_upgrade && !only_burst {
            across = Some(std::thread::spawn(nodes::run));
        }
    }
    if let Some(h) = across.take() {
        if let Some(f) = join_across(h, &mut ctx) {
            failed.get_or_insert(f);
        }
    }
    monitoring::stop();
    if let Some(f) = failed {
        diagnostics(&ctx);
        for (k, v) in &ctx.measured {
            println!("e2e: measured {k}: {v}");
        }
        println!("\ne2e: FAILED in {:.0}s: {f}", started.elapsed().as_secs_f64());
        std::process::exit(1);
    }
    println!("\ne2e: all journeys passed in {:.0}s", started.elapsed().as_secs_f64());
    for (k, v) in &ctx.measured {
        println!("e2e: measured {k}: {v}");
    }
}

/// Waits for the journeys across nodes; their failure, if any.
fn join_across(h: std::thread::JoinHandle<nodes::Outcome>, ctx: &mut Ctx) -> Option<String> {
    println!("e2e: waiting for the journeys across nodes");
    match h.join() {
        Ok(out) => {
            ctx.measured.extend(out.measured);
            out.failed
        }
        Err(_) => Some("the journeys across nodes panicked".into()),
    }
}

/// What the journeys share.
struct Ctx {
    root: PathBuf,
    kit_dir: PathBuf,
    node: String,
    /// Figures printed at the end.
    measured: BTreeMap<String, String>,
}

impl Ctx {
    fn new() -> Result<Ctx, String> {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        if std::env::var_os("KUBECONFIG").is_none() {
            return Err("KUBECONFIG is not set: run scripts/e2e.sh (or `. /var/tmp/k8s-kit/kit.env` with the kit up)".into());
        }
        kubectl(&["version", "--request-timeout=5s"])
            .map_err(|e| format!("no cluster answers (is ../shared/k8s up? scripts/e2e.sh brings it up): {e}"))?;
        for f in ["bin/smartctl", "drives"] {
            if !Path::new(E2E_DIR).join(f).exists() {
                return Err(format!("{E2E_DIR}/{f} is missing: scripts/e2e.sh prepares the drives and the smartctl stand-in"));
            }
        }
        let kit_dir = PathBuf::from(std::env::var("KIT_DIR").unwrap_or_else(|_| "/var/tmp/k8s-kit".into()));
        let nodes = get_json(&["get", "nodes", "-l", "!k8s-kit/fake-node"])?;
        let node = nodes["items"][0]["metadata"]["name"].as_str().ok_or("the cluster has no real node")?.to_string();
        REAL_NODE.get_or_init(|| node.clone());
        Ok(Ctx { root, kit_dir, node, measured: BTreeMap::new() })
    }

    fn overlay(&self) -> String {
        self.root.join("tests/e2e/overlay").display().to_string()
    }
}

// ---------------------------------------------------------------------------------
// kubectl and waiting

fn kubectl(args: &[&str]) -> Result<String, String> {
    kubectl_stdin(args, None)
}

fn kubectl_stdin(args: &[&str], stdin: Option<&str>) -> Result<String, String> {
    let mut cmd = Command::new("kubectl");
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    if stdin.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let mut child = cmd.spawn().map_err(|e| format!("kubectl cannot run ({e}): is it on PATH? scripts/e2e.sh sets it"))?;
    if let Some(text) = stdin {
        use std::io::Write;
        child.stdin.take().expect("stdin").write_all(text.as_bytes()).map_err(|e| e.to_string())?;
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!("kubectl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

fn get_json(args: &[&str]) -> Result<Value, String> {
    let mut a = args.to_vec();
    a.extend(["-o", "json"]);
    let text = kubectl(&a)?;
    serde_json::from_str(&text).map_err(|e| format!("kubectl {}: unreadable JSON: {e}", args.join(" ")))
}

fn apply(yaml: &str) -> Check {
    kubectl_stdin(&["apply", "-f", "-"], Some(yaml)).map(|_| ())
}

/// Polls `f` every 200 ms until it returns `Some`, or fails after `timeout` with `what`
/// and the last reason `f` gave.
fn wait_for<T>(what: &str, timeout: Duration, f: impl FnMut() -> Result<Option<T>, String>) -> Result<T, String> {
    wait_every(what, timeout, Duration::from_millis(200), f)
}

/// [`wait_for`] with its own poll period.
fn wait_every<T>(what: &str, timeout: Duration, every: Duration, mut f: impl FnMut() -> Result<Option<T>, String>) -> Result<T, String> {
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    loop {
        match f() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last = e,
        }
        if Instant::now() > deadline {
            let why = if last.is_empty() { String::new() } else { format!(" (last: {last})") };
            return Err(format!("{what}: not within {timeout:?}{why}"));
        }
        std::thread::sleep(every);
    }
}

fn ensure(ok: bool, what: impl FnOnce() -> String) -> Check {
    if ok {
        Ok(())
    } else {
        Err(what())
    }
}

/// `kubectl exec` in the drivelet container.
fn drivelet(args: &[&str]) -> Result<String, String> {
    let mut a = vec!["exec", "-n", SYSTEM_NS, "ds/drivelet", "-c", "drivelet", "--", "drivelet"];
    a.extend(args);
    kubectl(&a)
}

fn drivelet_json(args: &[&str]) -> Result<Value, String> {
    let mut a = args.to_vec();
    a.extend(["-o", "json"]);
    let text = drivelet(&a)?;
    serde_json::from_str(&text).map_err(|e| format!("drivelet {}: unreadable JSON: {e}: {text}", args.join(" ")))
}

fn ctl_drives() -> Result<Vec<Value>, String> {
    Ok(drivelet_json(&["ctl", "-c", CONFIG, "drives"])?.as_array().cloned().unwrap_or_default())
}

fn ctl_volumes() -> Result<Vec<Value>, String> {
    Ok(drivelet_json(&["ctl", "-c", CONFIG, "volumes"])?.as_array().cloned().unwrap_or_default())
}

/// `kubectl exec` in a test pod.
fn in_pod(pod: &str, script: &str) -> Result<String, String> {
    kubectl(&["exec", "-n", NS, pod, "--", "sh", "-c", script]).map(|s| s.trim().to_string())
}

fn host_mounts() -> String {
    std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default()
}

// ---------------------------------------------------------------------------------
// objects

/// The suite's StorageClasses: partitions on the suite's loop drives (media
/// `virtual`), ext4 and xfs.
fn storage_classes() -> String {
    let class = |name: &str, fs: &str| {
        format!(
            "apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: {name}
provisioner: {DRIVER}
parameters:
  media: virtual
  layout: partition
  csi.storage.k8s.io/fstype: {fs}
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
allowVolumeExpansion: true
---
"
        )
    };
    // vfat: a filesystem drivelet does not make, for the refusal check of the deploy
    // journey.
    class("drivelet-e2e-ext4", "ext4") + &class("drivelet-e2e-xfs", "xfs") + &class("drivelet-e2e-vfat", "vfat")
}

fn claim(name: &str, class: &str, size_mib: u64, mode: &str, access: &str) -> String {
    format!(
        "apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {name}
  namespace: {NS}
spec:
  storageClassName: {class}
  volumeMode: {mode}
  accessModes: [{access}]
  resources:
    requests:
      storage: {size_mib}Mi
---
"
    )
}

/// A hostNetwork busybox pod (the kit runs no other) using `claim` at /data, or as the
/// block device /dev/e2e-block; it runs `script`, then waits to be deleted.
fn pod(name: &str, claim: &str, block: bool, security: &str, script: &str) -> String {
    let (mounts, devices) = if block {
        (String::new(), "      volumeDevices:\n        - name: v\n          devicePath: /dev/e2e-block\n".to_string())
    } else {
        ("      volumeMounts:\n        - name: v\n          mountPath: /data\n".to_string(), String::new())
    };
    // A JSON string is a YAML flow scalar: no quoting to get wrong.
    let command = serde_json::to_string(&format!("{script}; trap 'exit 0' TERM; while true; do sleep 1; done")).expect("string");
    let node = real_node();
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {NS}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 2
  restartPolicy: Never
  nodeSelector:
    kubernetes.io/hostname: {node}
{security}  containers:
    - name: c
      image: {BUSYBOX}
      imagePullPolicy: IfNotPresent
      command: [sh, -c, {command}]
{mounts}{devices}  volumes:
    - name: v
      persistentVolumeClaim:
        claimName: {claim}
---
"
    )
}

fn wait_pod_running(name: &str, timeout: Duration) -> Check {
    wait_for(&format!("pod {name} Running"), timeout, || {
        let p = get_json(&["get", "pod", "-n", NS, name])?;
        match p["status"]["phase"].as_str() {
            Some("Running") => Ok(Some(())),
            Some("Failed") | Some("Succeeded") => Err(format!("pod {name} ended: {}", p["status"])),
            _ => Err(format!("phase {}", p["status"]["phase"])),
        }
    })
}

/// The PV bound to claim `name`.
fn pv_of(name: &str) -> Result<String, String> {
    let c = get_json(&["get", "pvc", "-n", NS, name])?;
    c["spec"]["volumeName"].as_str().filter(|s| !s.is_empty()).map(str::to_string).ok_or(format!("claim {name} is not bound"))
}

/// The CSI volume id of claim `name`.
fn volume_id_of(name: &str) -> Result<String, String> {
    let pv = get_json(&["get", "pv", &pv_of(name)?])?;
    pv["spec"]["csi"]["volumeHandle"].as_str().map(str::to_string).ok_or("PV has no volume handle".into())
}

/// drivelet's record of claim `name`'s volume.
fn record_of(name: &str) -> Result<Value, String> {
    let id = volume_id_of(name)?;
    ctl_volumes()?.into_iter().find(|v| v["id"] == id.as_str()).ok_or(format!("drivelet has no volume {id}"))
}

/// CSIStorageCapacity of a StorageClass on this node, as its agent published it:
/// (capacity, maximumVolumeSize). Only drivelet's own objects of this node count (an
/// earlier sidecar's are deleted by the agent at start).
fn capacity_object(class: &str) -> Result<Option<(u64, u64)>, String> {
    let node = real_node();
    let list = get_json(&["get", "csistoragecapacities", "-n", SYSTEM_NS, "-l", &format!("csi.storage.k8s.io/managed-by=drivelet,drivelet.io/node={node}")])?;
    let q = |v: &Value| v.as_str().map(parse_quantity).transpose();
    for c in list["items"].as_array().into_iter().flatten() {
        if c["storageClassName"] == class {
            return Ok(Some((q(&c["capacity"])?.unwrap_or(0), q(&c["maximumVolumeSize"])?.unwrap_or(0))));
        }
    }
    Ok(None)
}

/// A Kubernetes quantity as the provisioner writes capacities: a whole number with an
/// optional binary or decimal suffix.
fn parse_quantity(s: &str) -> Result<u64, String> {
    let units: [(&str, u64); 8] =
        [("Ki", 1 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30), ("Ti", 1 << 40), ("k", 1000), ("M", 1_000_000), ("G", 1_000_000_000), ("T", 1_000_000_000_000)];
    for (suffix, mult) in units {
        if let Some(n) = s.strip_suffix(suffix) {
            return n.parse::<u64>().map(|n| n * mult).map_err(|e| format!("quantity {s}: {e}"));
        }
    }
    s.parse::<u64>().map_err(|e| format!("quantity {s}: {e}"))
}

/// GetCapacity for the suite's ext4 class parameters, through `drivelet csi` in the pod.
fn get_capacity() -> Result<(u64, u64), String> {
    get_capacity_for("ext4")
}

/// GetCapacity for the parameters of the suite's class of filesystem `fs`.
fn get_capacity_for(fs: &str) -> Result<(u64, u64), String> {
    let fs = format!("csi.storage.k8s.io/fstype={fs}");
    let v = drivelet_json(&["csi", "--endpoint", CSI_SOCKET, "capacity", "--param", "media=virtual", "--param", "layout=partition", "--param", &fs])?;
    Ok((v["available_capacity"].as_u64().unwrap_or(0), v["maximum_volume_size"].as_u64().unwrap_or(0)))
}

/// Makes `smartctl` (the stand-in) print `fixture` for the loop device `dev`.
fn choose_smart(dev: &str, fixture: &str) -> Check {
    let name = Path::new(dev).file_name().and_then(|n| n.to_str()).ok_or("bad device")?;
    let path = Path::new(E2E_DIR).join("fixtures").join(fixture);
    let json: Value = serde_json::from_slice(&std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?)
        .map_err(|e| e.to_string())?;
    let code = json["smartctl"]["exit_status"].as_i64().ok_or("fixture has no exit status")?;
    let dir = Path::new(E2E_DIR).join("smart");
    let tmp = dir.join(format!(".{name}.new"));
    std::fs::write(&tmp, format!("{} {code}\n", path.display())).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, dir.join(name)).map_err(|e| e.to_string())
}

fn events_for(kind: &str, name: &str, reason: &str) -> Result<Vec<Value>, String> {
    events_in(NS, kind, name, reason)
}

/// The Events of `reason` about the object `kind`/`name` in namespace `ns`.
fn events_in(ns: &str, kind: &str, name: &str, reason: &str) -> Result<Vec<Value>, String> {
    let sel = format!("involvedObject.kind={kind},involvedObject.name={name},reason={reason}");
    let ev = get_json(&["get", "events", "-n", ns, "--field-selector", &sel])?;
    Ok(ev["items"].as_array().cloned().unwrap_or_default())
}

// ---------------------------------------------------------------------------------
// journeys

fn journey_deploy(ctx: &mut Ctx) -> Check {
    kubectl(&["apply", "-k", &ctx.overlay()])?;
    kubectl(&["rollout", "status", "-n", SYSTEM_NS, "ds/drivelet", "--timeout=120s"])?;
    let ds = get_json(&["get", "ds", "-n", SYSTEM_NS, "drivelet"])?;
    ensure(ds["status"]["numberReady"] == 1, || format!("DaemonSet not Ready: {}", ds["status"]))?;
    check_confinement(ctx)?;

    // Registration: kubelet lists the driver with its topology key in CSINode.
    let node = ctx.node.clone();
    wait_for("CSINode lists csi.drivelet.io with its topology key", Duration::from_secs(60), || {
        let n = get_json(&["get", "csinode", &node])?;
        let drivers = n["spec"]["drivers"].as_array().cloned().unwrap_or_default();
        Ok(drivers
            .iter()
            .find(|d| d["name"] == DRIVER && d["nodeID"] == node.as_str())
            .filter(|d| d["topologyKeys"].as_array().is_some_and(|k| k.iter().any(|k| k == TOPOLOGY_KEY)))
            .map(|_| ()))
    })?;
    let n = get_json(&["get", "node", &ctx.node])?;
    ensure(n["metadata"]["labels"][TOPOLOGY_KEY] == ctx.node.as_str(), || {
        format!("node lacks the label {TOPOLOGY_KEY}={}: {}", ctx.node, n["metadata"]["labels"])
    })?;

    // Every suite drive is managed and has its Drive object; nothing else of the suite
    // (kubelet's loop devices included) pretends to be a drive.
    let want: Vec<String> = (0..3).map(|i| format!("{E2E_DIR}/drives/drive-{i}.img")).collect();
    let drives = wait_for("the three suite drives managed", Duration::from_secs(30), || {
        let d = ctl_drives()?;
        let ours: Vec<Value> = d.iter().filter(|d| want.iter().any(|w| d["backing_file"] == w.as_str())).cloned().collect();
        Ok((ours.len() == 3 && ours.iter().all(|d| d["class"] == "managed")).then_some(ours))
    })?;
    wait_for("a managed Drive object for each suite drive", Duration::from_secs(30), || {
        let objs = get_json(&["get", "drives"])?;
        let items = objs["items"].as_array().cloned().unwrap_or_default();
        let missing: Vec<&str> = drives
            .iter()
            .filter_map(|d| d["id"].as_str())
            .filter(|id| !items.iter().any(|o| o["spec"]["driveId"] == *id && o["status"]["class"] == "managed"))
            .collect();
        if missing.is_empty() {
            Ok(Some(()))
        } else {
            Err(format!("none for {missing:?}"))
        }
    })?;
    println!("{}", kubectl(&["get", "drives"])?);

    // CSIStorageCapacity: published for every class, equal to what GetCapacity answers.
    apply(&storage_classes())?;
    for (class, fs) in [("drivelet-e2e-ext4", "ext4"), ("drivelet-e2e-xfs", "xfs")] {
        let (cap, max) = get_capacity_for(fs)?;
        ensure(cap > 0 && max > 0 && max <= cap, || format!("GetCapacity for {fs} answers {cap} available, {max} maximum"))?;
        wait_for(&format!("CSIStorageCapacity of {class} equal to GetCapacity ({cap}, max {max})"), Duration::from_secs(60), || {
            Ok(capacity_object(class)?.filter(|&c| c == (cap, max)).map(|_| ()))
        })?;
    }
    for class in ["drivelet-hdd", "drivelet-ssd", "drivelet-nvme"] {
        wait_for(&format!("CSIStorageCapacity of {class} zero (no such drive on the node)"), Duration::from_secs(30), || {
            Ok(capacity_object(class)?.filter(|&c| c == (0, 0)).map(|_| ()))
        })?;
    }
    // A class asking for a filesystem drivelet does not make: a claim sent to the node
    // (the selected-node annotation the scheduler sets) is refused with words naming the
    // value asked for and what is accepted; nothing is made.
    let refused = claim("refused-vfat", "drivelet-e2e-vfat", 64, "Filesystem", "ReadWriteOnce").replace(
        &format!("  namespace: {NS}\n"),
        &format!("  namespace: {NS}\n  annotations:\n    volume.kubernetes.io/selected-node: {}\n", real_node()),
    );
    kubectl(&["create", "namespace", NS]).or_else(|e| if e.contains("AlreadyExists") { Ok(String::new()) } else { Err(e) })?;
    apply(&refused)?;
    let message = wait_for("a ProvisioningFailed Event on claim refused-vfat", Duration::from_secs(60), || {
        let ev = events_for("PersistentVolumeClaim", "refused-vfat", "ProvisioningFailed")?;
        Ok(ev.first().and_then(|e| e["message"].as_str()).map(String::from))
    })?;
    for words in ["\"vfat\"", "ext4 or xfs", "InvalidArgument"] {
        ensure(message.contains(words), || format!("the refusal does not name {words}: {message}"))?;
    }
    ctx.measured.insert("refusal of an fstype vfat claim".into(), message.clone());
    let bound = get_json(&["get", "pvc", "-n", NS, "refused-vfat"])?;
    ensure(bound["spec"]["volumeName"].as_str().unwrap_or_default().is_empty(), || format!("refused-vfat got a volume: {bound}"))?;
    kubectl(&["delete", "pvc", "-n", NS, "refused-vfat", "--wait=true"])?;

    // Idle: the agent has scanned, registered and published; kubelet's stats lag ~10 s.
    std::thread::sleep(Duration::from_secs(15));
    record_memory(ctx, "idle after deploy");
    ctx.measured.insert("capacity before claims (bytes)".into(), get_capacity()?.0.to_string());
    Ok(())
}

/// The process on this host whose command line starts with `prefix` and holds `marker`
/// (NUL-separated, as /proc/PID/cmdline has it), as its /proc directory. Where one such
/// process is the child of another (the pod's drivelet is PID 1 of its container and
/// runs the agent as its child, `drivelet::guardian`), the child: the agent.
fn process_with(prefix: &[u8], marker: &[u8]) -> Option<std::path::PathBuf> {
    let matches: Vec<std::path::PathBuf> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| std::fs::read(p.join("cmdline")).is_ok_and(|c| c.starts_with(prefix) && c.windows(marker.len()).any(|w| w == marker)))
        .collect();
    let parent = |p: &Path| {
        let status = std::fs::read_to_string(p.join("status")).unwrap_or_default();
        status.lines().find_map(|l| l.strip_prefix("PPid:")).map(|v| Path::new("/proc").join(v.trim()))
    };
    matches.iter().find(|p| parent(p).is_some_and(|pp| matches.contains(&pp))).or(matches.first()).cloned()
}

/// The fields of /proc/PID/status named in `keys`, as `key value` words.
fn status_fields(proc_dir: &Path, keys: &[&str]) -> Result<String, String> {
    let status = std::fs::read_to_string(proc_dir.join("status")).map_err(|e| format!("{}: {e}", proc_dir.display()))?;
    Ok(keys
        .iter()
        .map(|k| {
            let v = status.lines().find_map(|l| l.strip_prefix(&format!("{k}:"))).map(str::trim).unwrap_or("?");
            format!("{k} {v}")
        })
        .collect::<Vec<_>>()
        .join(", "))
}

/// The pod runs confined as deploy/ says: drivelet under its own seccomp filter (its
/// privileged container gets none from the runtime) and a read-only root filesystem,
/// alone in its pod.
fn check_confinement(ctx: &mut Ctx) -> Check {
    let agent = wait_for("the pod's drivelet process", Duration::from_secs(30), || {
        Ok(process_with(b"/usr/local/bin/drivelet\0run", b"/etc/drivelet/drivelet.toml"))
    })?;
    let fields = status_fields(&agent, &["Seccomp", "Seccomp_filters", "NoNewPrivs"])?;
    ensure(fields.starts_with("Seccomp 2,") && fields.ends_with("NoNewPrivs 1"), || format!("drivelet is not under its seccomp filter: {fields}"))?;
    ctx.measured.insert("drivelet process (privileged container)".into(), fields);
    // One container: no sidecar process beside drivelet.
    let pod = get_json(&["get", "pods", "-n", SYSTEM_NS, "-l", "app.kubernetes.io/name=drivelet", "--field-selector", &format!("spec.nodeName={}", real_node())])?;
    let containers: Vec<String> = pod["items"][0]["spec"]["containers"].as_array().into_iter().flatten().map(|c| c["name"].as_str().unwrap_or("").to_string()).collect();
    ensure(containers == ["drivelet"], || format!("the pod runs containers {containers:?}, not drivelet alone"))?;
    let wrote = kubectl(&["exec", "-n", SYSTEM_NS, "ds/drivelet", "-c", "drivelet", "--", "sh", "-c", "touch /drivelet-e2e 2>&1; echo $?"])?;
    ensure(wrote.contains("Read-only file system"), || format!("drivelet's root filesystem is writable: {wrote}"))?;
    Ok(())
}

fn drive_object(drive_id: &str) -> Result<Option<Value>, String> {
    let objs = get_json(&["get", "drives"])?;
    Ok(objs["items"].as_array().into_iter().flatten().find(|o| o["spec"]["driveId"] == drive_id).cloned())
}

fn journey_vanish(ctx: &mut Ctx) -> Check {
    kubectl(&["create", "namespace", NS]).or_else(|e| if e.contains("AlreadyExists") { Ok(String::new()) } else { Err(e) })?;
    apply(&(claim("vanish", "drivelet-e2e-ext4", 64, "Filesystem", "ReadWriteOnce") + &pod("vanish", "vanish", false, "", "echo v > /data/v")))?;
    wait_pod_running("vanish", Duration::from_secs(120))?;
    let pv = pv_of("vanish")?;
    let id = volume_id_of("vanish")?;
    let drive_id = record_of("vanish")?["drive_id"].as_str().unwrap_or_default().to_string();
    let d = ctl_drives()?.into_iter().find(|d| d["id"] == drive_id.as_str()).ok_or("drive not listed")?;
    let (dev, file) = (d["path"].as_str().unwrap_or_default().to_string(), d["backing_file"].as_str().unwrap_or_default().to_string());
    // Unused, so nothing holds the loop device and it really goes.
    kubectl(&["delete", "pod", "-n", NS, "vanish", "--wait=true", "--timeout=60s"])?;
    wait_for(&format!("the VolumeAttachment of {pv} gone"), Duration::from_secs(90), || {
        let vas = get_json(&["get", "volumeattachments"])?;
        Ok((!vas["items"].as_array().into_iter().flatten().any(|v| v["spec"]["source"]["persistentVolumeName"] == pv.as_str())).then_some(()))
    })?;
    let out = Command::new("losetup").args(["-d", &dev]).output().map_err(|e| e.to_string())?;
    ensure(out.status.success(), || format!("losetup -d {dev}: {}", String::from_utf8_lossy(&out.stderr)))?;

    let obj = wait_for("the Drive object of the vanished drive: missing, listing the volume", Duration::from_secs(10), || {
        Ok(drive_object(&drive_id)?.filter(|o| o["status"]["presence"] == "missing"))
    })?;
    ensure(obj["status"]["volumes"].as_array().is_some_and(|v| v.iter().any(|v| v == id.as_str())), || format!("missing drive's object: {obj}"))?;
    let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let table = kubectl(&["get", "drives"])?;
    println!("{table}");
    ensure(table.lines().any(|l| l.starts_with(&name) && l.contains("missing")), || format!("`kubectl get drives` does not show {name} missing:\n{table}"))?;
    let got = drivelet_json(&["csi", "--endpoint", CSI_SOCKET, "get", &id])?;
    ensure(got["abnormal"] == true && got["condition"].as_str().is_some_and(|m| m.contains("missing")), || format!("ControllerGetVolume: {got}"))?;
    // Its alert raised (pending) before the claim goes and ends it: the judgement at the
    // end of the run looks for it.
    monitoring::wait_seen_over_run("DriveletDriveMissing raised for the vanished drive", "ALERTS{alertname=\"DriveletDriveMissing\"}")?;

    // The claim deleted with the drive gone: the PV goes, and with the last live volume
    // the missing drive's object goes too.
    kubectl(&["delete", "pvc", "-n", NS, "vanish", "--wait=true", "--timeout=60s"])?;
    wait_for(&format!("PV {pv} gone"), Duration::from_secs(60), || Ok(kubectl(&["get", "pv", &pv]).is_err().then_some(())))?;
    let t = Instant::now();
    wait_for("the missing drive's object deleted once no volume lives on it", Duration::from_secs(30), || {
        Ok(drive_object(&drive_id)?.is_none().then_some(()))
    })?;
    ctx.measured.insert("last volume of a missing drive deleted -> Drive object gone".into(), format!("{:.1}s", t.elapsed().as_secs_f64()));

    // The drive comes back: its GPT still holds the partition, so drivelet lists the
    // volume again (it cannot know it was deleted meanwhile); the admin deletes it.
    let out = Command::new("losetup").args(["--find", "--show", &file]).output().map_err(|e| e.to_string())?;
    ensure(out.status.success(), || format!("losetup {file}: {}", String::from_utf8_lossy(&out.stderr)))?;
    wait_for("the returned drive managed again, its volume listed again", Duration::from_secs(30), || {
        let back = ctl_drives()?.into_iter().any(|d| d["id"] == drive_id.as_str() && d["class"] == "managed");
        Ok((back && ctl_volumes()?.iter().any(|v| v["id"] == id.as_str())).then_some(()))
    })?;
    drivelet(&["csi", "--endpoint", CSI_SOCKET, "delete", &id])?;
    ensure(!ctl_volumes()?.iter().any(|v| v["id"] == id.as_str()), || format!("volume {id} still listed after DeleteVolume"))?;
    wait_for("the returned drive's Drive object present again", Duration::from_secs(30), || {
        Ok(drive_object(&drive_id)?.filter(|o| o["status"]["presence"] == "present").map(|_| ()))
    })
}

const WRITE_EXT4: &str = "echo hello-ext4 > /data/hello && sync && cat /data/hello";

fn journey_claims(ctx: &mut Ctx) -> Check {
    kubectl(&["create", "namespace", NS]).or_else(|e| if e.contains("AlreadyExists") { Ok(String::new()) } else { Err(e) })?;
    let fs_group = "  securityContext:\n    runAsUser: 1000\n    runAsGroup: 1000\n    fsGroup: 2000\n";
    let mut objects = String::new();
    objects += &claim("ext4", "drivelet-e2e-ext4", 128, "Filesystem", "ReadWriteOnce");
    objects += &claim("xfs", "drivelet-e2e-xfs", 512, "Filesystem", "ReadWriteOnce");
    objects += &claim("block", "drivelet-e2e-ext4", 64, "Block", "ReadWriteOnce");
    objects += &claim("rwop", "drivelet-e2e-ext4", 64, "Filesystem", "ReadWriteOncePod");
    objects += &pod("writer", "ext4", false, "", WRITE_EXT4);
    objects += &pod("xfs", "xfs", false, fs_group, "echo hello-xfs > /data/hello && sync");
    objects += &pod("block", "block", true, "", "echo hello-block | dd of=/dev/e2e-block bs=512 count=1 conv=sync,fsync");
    objects += &pod("rwop", "rwop", false, "", "echo hello-rwop > /data/hello && sync");
    let t = Instant::now();
    apply(&objects)?;
    for p in ["writer", "xfs", "block", "rwop"] {
        wait_pod_running(p, Duration::from_secs(120))?;
    }
    ctx.measured.insert("four claims provisioned, attached, staged, published, pods Running".into(), format!("{:.1}s", t.elapsed().as_secs_f64()));

    ensure(in_pod("writer", "cat /data/hello")? == "hello-ext4", || "ext4 data not read back".into())?;
    ensure(in_pod("writer", "grep ' /data ' /proc/mounts | cut -d' ' -f3")? == "ext4", || "/data is not ext4".into())?;
    ensure(in_pod("xfs", "cat /data/hello")? == "hello-xfs", || "xfs data not read back".into())?;
    ensure(in_pod("xfs", "grep ' /data ' /proc/mounts | cut -d' ' -f3")? == "xfs", || "/data is not xfs".into())?;
    let owner = in_pod("xfs", "stat -c '%g' /data; stat -c '%g' /data/hello; id -G")?;
    ensure(owner.lines().take(2).all(|g| g == "2000"), || format!("fsGroup 2000 not applied to the xfs volume: {owner}"))?;
    let block = in_pod("block", "dd if=/dev/e2e-block bs=512 count=1 2>/dev/null | head -c 11")?;
    ensure(block == "hello-block", || format!("block data not read back: {block:?}"))?;
    let size = in_pod("block", "blockdev --getsize64 /dev/e2e-block 2>/dev/null || wc -c < /dev/e2e-block")?;
    ensure(size.trim().parse::<u64>().ok() == Some(64 * MIB), || format!("block device size {size}, want 64 MiB"))?;
    ensure(in_pod("rwop", "cat /data/hello")? == "hello-rwop", || "ReadWriteOncePod data not read back".into())?;

    // A second pod on the same ReadWriteOnce claim, on the same node.
    apply(&pod("reader", "ext4", false, "", "cat /data/hello"))?;
    wait_pod_running("reader", Duration::from_secs(60))?;
    ensure(in_pod("reader", "cat /data/hello")? == "hello-ext4", || "the second pod does not see the data".into())?;

    // NodeGetVolumeStats at the paths kubelet asks about: a filesystem volume's target,
    // and a block volume's device node in kubelet's global map directory.
    let uid = |p: &str| get_json(&["get", "pod", "-n", NS, p]).map(|v| v["metadata"]["uid"].as_str().unwrap_or_default().to_string());
    let target = format!("/var/lib/kubelet/pods/{}/volumes/kubernetes.io~csi/{}/mount", uid("xfs")?, pv_of("xfs")?);
    let st = drivelet_json(&["csi", "--endpoint", CSI_SOCKET, "stats", &volume_id_of("xfs")?, "--path", &target])?;
    ensure(st["bytes"]["total"].as_u64().is_some_and(|t| t > 400 * MIB) && st["inodes"]["total"].as_u64().is_some_and(|t| t > 0), || {
        format!("stats of the xfs volume at {target}: {st}")
    })?;
    let map = format!("/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/{}/dev/{}", pv_of("block")?, uid("block")?);
    let st = drivelet_json(&["csi", "--endpoint", CSI_SOCKET, "stats", &volume_id_of("block")?, "--path", &map])?;
    ensure(st["bytes"]["total"].as_u64() == Some(64 * MIB) && st["abnormal"] == false, || format!("stats of the block volume at {map}: {st}"))?;

    // Each volume is where drivelet says, attached to this node once.
    for c in ["ext4", "xfs", "block", "rwop"] {
        let r = record_of(c)?;
        ensure(r["state"] != "creating", || format!("claim {c}: volume record {r}"))?;
        let pv = pv_of(c)?;
        let vas = get_json(&["get", "volumeattachments"])?;
        let va: Vec<&Value> = vas["items"].as_array().into_iter().flatten().filter(|v| v["spec"]["source"]["persistentVolumeName"] == pv.as_str()).collect();
        ensure(va.len() == 1 && va[0]["status"]["attached"] == true, || format!("claim {c}: VolumeAttachments {va:?}"))?;
    }
    Ok(())
}

/// The content every pod must still read.
fn check_data() -> Check {
    for (p, want) in [("writer", "hello-ext4"), ("reader", "hello-ext4"), ("xfs", "hello-xfs"), ("rwop", "hello-rwop")] {
        let got = in_pod(p, "cat /data/hello")?;
        ensure(got == want, || format!("pod {p} reads {got:?}, want {want:?}"))?;
    }
    let b = in_pod("block", "dd if=/dev/e2e-block bs=512 count=1 2>/dev/null | head -c 11")?;
    ensure(b == "hello-block", || format!("block pod reads {b:?}"))
}

fn drivelet_pod() -> Result<String, String> {
    let pods = get_json(&["get", "pods", "-n", SYSTEM_NS, "-l", "app.kubernetes.io/name=drivelet"])?;
    let items = pods["items"].as_array().cloned().unwrap_or_default();
    let ready: Vec<&Value> = items
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .filter(|p| p["status"]["containerStatuses"].as_array().is_some_and(|c| c.iter().all(|c| c["ready"] == true)))
        .collect();
    match ready.as_slice() {
        [p] => Ok(p["metadata"]["name"].as_str().unwrap_or_default().to_string()),
        _ => Err(format!("{} drivelet pods ready", ready.len())),
    }
}

/// Every formatting drivelet logged since its pod started.
fn formats_logged(pod: &str) -> Result<usize, String> {
    let logs = kubectl(&["logs", "-n", SYSTEM_NS, pod, "-c", "drivelet"])?;
    Ok(logs.lines().filter(|l| l.contains("filesystem made")).count())
}

fn journey_restart(ctx: &mut Ctx) -> Check {
    let before = drivelet_pod()?;
    let t = Instant::now();
    kubectl(&["delete", "pod", "-n", SYSTEM_NS, &before, "--wait=true", "--timeout=60s"])?;
    let after = wait_for("a new drivelet pod Ready", Duration::from_secs(90), || {
        Ok(drivelet_pod().ok().filter(|p| *p != before))
    })?;
    ctx.measured.insert("drivelet pod deleted -> new pod Ready".into(), format!("{:.1}s", t.elapsed().as_secs_f64()));
    check_data()?;
    in_pod("writer", "echo after-restart > /data/after && sync")?;
    ensure(formats_logged(&after)? == 0, || format!("the new drivelet pod {after} formatted something"))?;
    // It still serves: the volumes are listed, published to this node, and normal.
    let list = drivelet_json(&["csi", "--endpoint", CSI_SOCKET, "list"])?;
    let vols = list["volumes"].as_array().cloned().unwrap_or_default();
    ensure(vols.len() == 4 && vols.iter().all(|v| v["abnormal"] == false && v["published_node_ids"][0] == ctx.node.as_str()), || {
        format!("ListVolumes after the restart: {list}")
    })?;

    // A rolling update of the DaemonSet (a changed pod template).
    let t = Instant::now();
    kubectl(&["rollout", "restart", "-n", SYSTEM_NS, "ds/drivelet"])?;
    kubectl(&["rollout", "status", "-n", SYSTEM_NS, "ds/drivelet", "--timeout=120s"])?;
    let updated = wait_for("the updated drivelet pod Ready", Duration::from_secs(60), || Ok(drivelet_pod().ok().filter(|p| *p != after)))?;
    ctx.measured.insert("rolling update of the DaemonSet".into(), format!("{:.1}s", t.elapsed().as_secs_f64()));
    check_data()?;
    ensure(in_pod("reader", "cat /data/after")? == "after-restart", || "data written between restarts is lost".into())?;
    ensure(formats_logged(&updated)? == 0, || format!("the updated drivelet pod {updated} formatted something"))
}

fn journey_delete(ctx: &mut Ctx) -> Check {
    let pv = pv_of("ext4")?;
    let rec = record_of("ext4")?;
    let drive_id = rec["drive_id"].as_str().unwrap_or_default().to_string();
    let free_before = drive_free(&drive_id)?;
    kubectl(&["delete", "pod", "-n", NS, "writer", "reader", "--wait=true", "--timeout=60s"])?;

    // No pod uses the claim: the VolumeAttachment is detached, its finalizer removed and
    // it is gone; no mount of the volume is left on the node. (The attacher's finalizer on
    // the PV stays until the PV itself is deleted, as with the external-attacher: "PV
    // gone" below proves it is released then.)
    wait_for(&format!("the VolumeAttachment of {pv} gone"), Duration::from_secs(90), || {
        let vas = get_json(&["get", "volumeattachments"])?;
        let left = vas["items"].as_array().into_iter().flatten().any(|v| v["spec"]["source"]["persistentVolumeName"] == pv.as_str());
        Ok((!left).then_some(()))
    })?;
    ensure(!host_mounts().contains(&pv), || format!("a mount of {pv} is left:\n{}", host_mounts()))?;
    let r = record_of("ext4")?;
    ensure(r["staging"].is_null() && r["targets"].as_object().is_none_or(|t| t.is_empty()), || format!("record not unstaged: {r}"))?;

    // The claim deleted: PV gone, partition gone, capacity back.
    let id = volume_id_of("ext4")?;
    let (cap_before, _) = get_capacity()?;
    kubectl(&["delete", "pvc", "-n", NS, "ext4", "--wait=true", "--timeout=60s"])?;
    wait_for(&format!("PV {pv} gone"), Duration::from_secs(60), || Ok(kubectl(&["get", "pv", &pv]).is_err().then_some(())))?;
    ensure(!ctl_volumes()?.iter().any(|v| v["id"] == id.as_str()), || format!("drivelet still has volume {id}"))?;
    // `ctl drives` shows the inventory's view, which hears of the removed partition from
    // udev a moment after DeleteVolume answered (GetCapacity, below, counts it at once).
    let want = free_before + rec["size"].as_u64().unwrap_or(0);
    let mut free_after = free_before;
    wait_for(&format!("drive {drive_id} free {want} bytes (from {free_before}) after deleting a volume of {}", rec["size"]), Duration::from_secs(10), || {
        free_after = drive_free(&drive_id)?;
        Ok((free_after == want).then_some(()))
    })
    .map_err(|e| format!("{e}; last read {free_after}"))?;
    let (cap, _) = get_capacity()?;
    ensure(cap == cap_before + rec["size"].as_u64().unwrap_or(0), || format!("GetCapacity {cap_before} -> {cap} after deleting {}", rec["size"]))?;
    let t = Instant::now();
    wait_for("CSIStorageCapacity follows the freed space", Duration::from_secs(60), || {
        Ok(capacity_object("drivelet-e2e-ext4")?.filter(|c| c.0 == cap).map(|_| ()))
    })?;
    ctx.measured.insert("claim deleted -> CSIStorageCapacity updated".into(), format!("{:.1}s", t.elapsed().as_secs_f64()));
    Ok(())
}

/// drivelet's container memory as kubelet reports it (summary API: the working set the
/// kubelet evicts by, and RSS), beside the process's VmRSS, recorded under `when`.
fn record_memory(ctx: &mut Ctx, when: &str) {
    // Straight from kubelet (the API server's node proxy refuses the kit's loopback node
    // address), with the kit's admin client certificate.
    let pki = ctx.kit_dir.join("pki");
    let arg = |f: &str| pki.join(f).display().to_string();
    let summary: Value = Command::new("curl")
        .args(["-sf", "--max-time", "10", "--cacert", &arg("ca.crt"), "--cert", &arg("admin.crt"), "--key", &arg("admin.key")])
        .arg("https://127.0.0.1:10250/stats/summary")
        .output()
        .ok()
        .and_then(|o| serde_json::from_slice(&o.stdout).ok())
        .unwrap_or_default();
    let container = summary["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["podRef"]["namespace"] == SYSTEM_NS)
        .flat_map(|p| p["containers"].as_array().cloned().unwrap_or_default())
        .find(|c| c["name"] == "drivelet");
    let mib = |v: &Value| v.as_f64().map(|b| format!("{:.1} MiB", b / MIB as f64)).unwrap_or_else(|| "?".into());
    // The agent (the child of the container's PID 1, both `drivelet run`).
    let pid = process_with(b"/usr/local/bin/drivelet\0run", b"/etc/drivelet/drivelet.toml");
    let process = pid.as_deref().map_or_else(|| "no drivelet process found".to_string(), process_memory);
    let cgroup = pid.as_deref().map_or_else(String::new, cgroup_memory);
    let text = match container {
        Some(c) => format!("working set {} (kubelet summary); cgroup: {cgroup}; process: {process}", mib(&c["memory"]["workingSetBytes"])),
        None => format!("kubelet summary has no drivelet container; cgroup: {cgroup}; process: {process}"),
    };
    ctx.measured.insert(format!("drivelet memory {when}"), text);
}

/// A process's resident memory from /proc/PID/status: VmRSS with its anonymous and
/// file-backed parts, and its threads.
fn process_memory(proc_dir: &Path) -> String {
    let status = std::fs::read_to_string(proc_dir.join("status")).unwrap_or_default();
    let kib = |key: &str| {
        status.lines().find(|l| l.starts_with(key)).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse::<f64>().ok())
    };
    let m = |key: &str| kib(key).map_or("?".into(), |k| format!("{:.1} MiB", k / 1024.0));
    format!(
        "VmRSS {} (anonymous {}, files {}), {} threads",
        m("VmRSS:"),
        m("RssAnon:"),
        m("RssFile:"),
        kib("Threads:").map_or("?".into(), |t| t.to_string())
    )
}

/// What the container's memory cgroup holds, from its memory.stat (cgroup v1 or v2):
/// anonymous memory, page cache split into active and inactive (kubelet's working set
/// is everything but the inactive page cache), and kernel memory.
fn cgroup_memory(proc_dir: &Path) -> String {
    let cgroups = std::fs::read_to_string(proc_dir.join("cgroup")).unwrap_or_default();
    let v1 = cgroups.lines().find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_string()));
    let (dir, v2) = match v1 {
        Some(p) => (format!("/sys/fs/cgroup/memory{p}"), false),
        None => match cgroups.lines().find_map(|l| l.strip_prefix("0::")) {
            Some(p) => (format!("/sys/fs/cgroup{p}"), true),
            None => return "no memory cgroup found".into(),
        },
    };
    let stat = std::fs::read_to_string(format!("{dir}/memory.stat")).unwrap_or_default();
    let field = |key: &str| {
        stat.lines().find_map(|l| l.split_once(' ').filter(|(k, _)| *k == key).and_then(|(_, v)| v.trim().parse::<u64>().ok()))
    };
    let read = |file: &str| std::fs::read_to_string(format!("{dir}/{file}")).ok().and_then(|s| s.trim().parse::<u64>().ok());
    let m = |b: Option<u64>| b.map_or("?".into(), |b| format!("{:.1} MiB", b as f64 / MIB as f64));
    let (usage, anon, active, inactive, kernel) = if v2 {
        (read("memory.current"), field("anon"), field("active_file"), field("inactive_file"), field("kernel"))
    } else {
        (read("memory.usage_in_bytes"), field("total_rss"), field("total_active_file"), field("total_inactive_file"), read("memory.kmem.usage_in_bytes"))
    };
    format!(
        "usage {}: anonymous {}, page cache {} active and {} inactive, kernel {}",
        m(usage),
        m(anon),
        m(active),
        m(inactive),
        m(kernel)
    )
}

fn drive_free(id: &str) -> Result<u64, String> {
    ctl_drives()?
        .iter()
        .find(|d| d["id"] == id)
        .and_then(|d| d["free_bytes"].as_u64())
        .ok_or(format!("drivelet does not list drive {id}"))
}

fn journey_failure(ctx: &mut Ctx) -> Check {
    // The xfs pod's drive turns BAD (smartctl: overall-health self-assessment failed).
    let rec = record_of("xfs")?;
    let bad = rec["drive_id"].as_str().unwrap_or_default().to_string();
    let drives = ctl_drives()?;
    let dev = drives.iter().find(|d| d["id"] == bad.as_str()).and_then(|d| d["path"].as_str()).ok_or("no device")?.to_string();
    let pvc_events = events_for("PersistentVolumeClaim", "xfs", "VolumeConditionAbnormal")?.len();
    let pod_events = events_for("Pod", "xfs", "VolumeConditionAbnormal")?.len();
    let failed = Instant::now();
    choose_smart(&dev, "sata-hdd-smart-failed.json")?;
    let (mut on_claim, mut on_pod) = (None, None);
    wait_for("VolumeConditionAbnormal Events on the claim and the pod", Duration::from_secs(10), || {
        if on_claim.is_none() && events_for("PersistentVolumeClaim", "xfs", "VolumeConditionAbnormal")?.len() > pvc_events {
            on_claim = Some(failed.elapsed());
        }
        if on_pod.is_none() && events_for("Pod", "xfs", "VolumeConditionAbnormal")?.len() > pod_events {
            on_pod = Some(failed.elapsed());
        }
        Ok((on_claim.is_some() && on_pod.is_some()).then_some(()))
    })?;
    let (c, p) = (on_claim.unwrap_or_default(), on_pod.unwrap_or_default());
    ctx.measured.insert("drive BAD -> Event on the claim / on the pod (seen by kubectl polling)".into(), format!("{c:.2?} / {p:.2?}"));
    ensure(c <= Duration::from_secs(2) && p <= Duration::from_secs(2), || format!("Events took {c:?} (claim) and {p:?} (pod); limit 2 s"))?;

    // The Drive object says so at a glance.
    let obj = wait_for("the Drive object shows the drive bad", Duration::from_secs(10), || {
        let objs = get_json(&["get", "drives"])?;
        Ok(objs["items"].as_array().into_iter().flatten().find(|o| o["spec"]["driveId"] == bad.as_str() && o["status"]["health"] == "bad").cloned())
    })?;
    let table = kubectl(&["get", "drives"])?;
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    ensure(table.lines().any(|l| l.starts_with(name) && l.contains("bad")), || format!("`kubectl get drives` does not show {name} bad:\n{table}"))?;

    // ControllerGetVolume and ListVolumes: abnormal, naming the drive.
    let id = volume_id_of("xfs")?;
    let got = drivelet_json(&["csi", "--endpoint", CSI_SOCKET, "get", &id])?;
    ensure(got["abnormal"] == true, || format!("ControllerGetVolume of {id}: {got}"))?;
    let list = drivelet_json(&["csi", "--endpoint", CSI_SOCKET, "list"])?;
    let entry = list["volumes"].as_array().into_iter().flatten().find(|v| v["volume_id"] == id.as_str()).cloned().unwrap_or_default();
    ensure(entry["abnormal"] == true, || format!("ListVolumes entry of {id}: {entry}"))?;

    // New claims land on other drives.
    apply(&(claim("after-bad", "drivelet-e2e-ext4", 64, "Filesystem", "ReadWriteOnce") + &pod("after-bad", "after-bad", false, "", "echo ok > /data/ok")))?;
    wait_pod_running("after-bad", Duration::from_secs(120))?;
    let placed = record_of("after-bad")?["drive_id"].as_str().unwrap_or_default().to_string();
    ensure(placed != bad, || format!("a new claim landed on the BAD drive {bad}"))?;

    // `drivelet ctl drive release` through kubectl exec: the next claim goes elsewhere.
    drivelet(&["ctl", "-c", CONFIG, "drive", "release", &placed])?;
    let d = ctl_drives()?.into_iter().find(|d| d["id"] == placed.as_str()).unwrap_or_default();
    ensure(d["usage"] == "releasing", || format!("released drive {placed}: {d}"))?;
    apply(&(claim("after-release", "drivelet-e2e-ext4", 64, "Filesystem", "ReadWriteOnce") + &pod("after-release", "after-release", false, "", "echo ok > /data/ok")))?;
    wait_pod_running("after-release", Duration::from_secs(120))?;
    let third = record_of("after-release")?["drive_id"].as_str().unwrap_or_default().to_string();
    ensure(third != bad && third != placed, || format!("a new claim landed on {third} (BAD: {bad}, releasing: {placed})"))?;
    // The failing drive's pod still runs and its data reads back.
    ensure(in_pod("xfs", "cat /data/hello")? == "hello-xfs", || "the xfs pod lost its data".into())
}

fn journey_cleanup(ctx: &mut Ctx) -> Check {
    let pvs: Vec<String> = ["xfs", "block", "rwop", "after-bad", "after-release"].iter().filter_map(|c| pv_of(c).ok()).collect();
    kubectl(&["delete", "namespace", NS, "--ignore-not-found", "--wait=true", "--timeout=120s"])?;
    wait_for("every PV of the suite gone", Duration::from_secs(90), || {
        Ok(pvs.iter().all(|pv| kubectl(&["get", "pv", pv]).is_err()).then_some(()))
    })?;
    let vas = get_json(&["get", "volumeattachments"])?;
    ensure(vas["items"].as_array().is_none_or(|v| v.is_empty()), || format!("VolumeAttachments left: {vas}"))?;
    let vols = ctl_volumes()?;
    ensure(vols.is_empty(), || format!("drivelet volumes left: {vols:?}"))?;
    let mounts = host_mounts();
    ensure(!pvs.iter().any(|pv| mounts.contains(pv.as_str())), || format!("mounts left:\n{mounts}"))?;
    kubectl_stdin(&["delete", "--ignore-not-found", "-f", "-"], Some(&storage_classes()))?;
    std::thread::sleep(Duration::from_secs(15));
    record_memory(ctx, "after the suite");
    Ok(())
}

// ---------------------------------------------------------------------------------
// diagnostics

fn diagnostics(ctx: &Ctx) {
    let show = |title: &str, args: &[&str]| {
        println!("\n===== {title}: kubectl {}", args.join(" "));
        match kubectl(args) {
            Ok(s) => println!("{s}"),
            Err(e) => println!("({e})"),
        }
    };
    show("pods", &["get", "pods", "-A", "-o", "wide"]);
    show("claims, volumes, attachments", &["get", "pvc,pv,volumeattachments", "-A"]);
    show("drives", &["get", "drives"]);
    show("storage capacity", &["get", "csistoragecapacities", "-A"]);
    show("events", &["get", "events", "-A", "--sort-by=.lastTimestamp"]);
    show("drivelet log", &["logs", "-n", SYSTEM_NS, "ds/drivelet", "-c", "drivelet", "--tail=150"]);
    show("drivelet log (previous container)", &["logs", "-n", SYSTEM_NS, "ds/drivelet", "-c", "drivelet", "--previous", "--tail=50"]);
    nodes::diagnostics();
    let kubelet_log = ctx.kit_dir.join("log/kubelet.log");
    println!("\n===== kubelet log lines about the driver and the suite's pods: {}", kubelet_log.display());
    match std::fs::read_to_string(&kubelet_log) {
        Ok(text) => {
            let lines: Vec<&str> = text
                .lines()
                .filter(|l| l.contains("drivelet") || l.contains("csi") || l.contains(NS))
                .filter(|l| l.starts_with('E') || l.starts_with('W') || l.contains("rror") || l.contains("ailed"))
                .collect();
            for l in &lines[lines.len().saturating_sub(60)..] {
                println!("{l}");
            }
        }
        Err(e) => println!("({e})"),
    }
}
