//! Journeys across nodes (issue 22), on the kit's fake nodes node-2 and node-3 beside the
//! real one. A fake node runs no pods: its CSI side is a drivelet agent run as a host
//! process by `scripts/e2e-node.sh`, so its claims are provisioned (in process), its
//! VolumeAttachments attached, and nothing is ever mounted.
//!
//! Rules:
//! - Everything lives in the namespace [`NS`] (the real node's journeys use another), and
//!   every pod names its node or can only go to a fake one: nothing here lands a volume
//!   on the real node, whose journeys run at the same time.
//! - Waits poll the API (no fixed sleeps), except the one hold a journey is about: node-2
//!   kept stopped for [`STOP_HOLD`], checked every 2 s meanwhile.
//! - The drives: node-1 three of 2 GiB (each claim at most about 2 GiB), node-2 two of
//!   4 GiB, node-3 one of 1 GiB (`scripts/e2e.sh`). Each agent sees every loop drive of
//!   the host and lists the others' as excluded Drive objects; a node's own drives are
//!   its `managed` ones.
//! - The Lease holder killed mid-way is a fake node's agent, never the real node's pod
//!   (that would break the real node's journeys running beside): `scripts/e2e.sh` starts
//!   node-3's agent first, so it holds the Lease.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{apply, ensure, events_in, get_json, wait_every, kubectl, kubectl_stdin, parse_quantity, Check, DRIVER, E2E_DIR, SYSTEM_NS, TOPOLOGY_KEY};

const NS: &str = "drivelet-e2e-nodes";
const N2: &str = "node-2";
const N3: &str = "node-3";
/// The binary the fake nodes' agents run (`scripts/e2e.sh` copies the release build).
const AGENT: &str = "/var/tmp/drivelet-e2e/bin/drivelet";
const LEASE: &str = "drivelet-cluster-duties";
const REMOVED: &str = "drivelet-removed-volumes";
const EXT4: &str = "drivelet-e2e-ext4";
const XFS: &str = "drivelet-e2e-xfs";
const RELEASE_CLASS: &str = "drivelet-e2e-release";
const ATTACHER_FINALIZER: &str = "external-attacher/csi-drivelet-io";
const DRIVE_NODE_LABEL: &str = "drivelet.io/node";
const GIB: u64 = 1 << 30;
/// How long node-2 stays stopped in the journey that keeps it: past NotReady (the kit's
/// node-monitor grace period, 50 s) by more than four Lease durations (15 s each), so an
/// elected agent had every chance to act on it; short of the NoExecute eviction (300 s),
/// whose evicted pods on a fake node would stay Terminating for ever (no kubelet confirms).
const STOP_HOLD: Duration = Duration::from_secs(120);
/// How long the duties for a deleted node may take: the pod garbage collector deletes
/// its pods after 40 s, the attach-detach controller then deletes their attachments, and
/// the Lease may have to expire (15 s) after the holder is killed.
const DUTIES_BOUND: Duration = Duration::from_secs(180);

/// What the thread hands back to `main`.
pub(crate) struct Outcome {
    pub(crate) failed: Option<String>,
    pub(crate) measured: BTreeMap<String, String>,
}

#[derive(Default)]
struct State {
    measured: BTreeMap<String, String>,
}

type Journey = fn(&mut State) -> Check;

/// Runs the journeys across nodes in order; the first failure stops them.
pub(crate) fn run() -> Outcome {
    let journeys: [(&str, Journey); 5] = [
        ("placement across nodes: capacity, only-fits, fits nowhere, pinned without room, attach", journey_placement),
        ("node-2 stopped past NotReady and back: nothing released", journey_stopped),
        ("node-2 deleted for good, the Lease holder killed mid-way; node-2 back", journey_deleted),
        ("each agent received no watch event for another node's object; the relay labelled them", journey_own_objects),
        ("clean-up across nodes", journey_cleanup),
    ];
    let mut state = State::default();
    let mut failed = None;
    for (i, (name, run)) in journeys.iter().enumerate() {
        let t = Instant::now();
        println!("e2e nodes: [{}/{}] {name}", i + 1, journeys.len());
        match run(&mut state) {
            Ok(()) => println!("e2e nodes: [{}/{}] ok in {:.1}s", i + 1, journeys.len(), t.elapsed().as_secs_f64()),
            Err(e) => {
                println!("e2e nodes: [{}/{}] FAILED after {:.1}s: {e}", i + 1, journeys.len(), t.elapsed().as_secs_f64());
                failed = Some(format!("across nodes: {name}: {e}"));
                break;
            }
        }
    }
    Outcome { failed, measured: state.measured }
}

// ---------------------------------------------------------------------------------
// helpers

fn wait<T>(what: &str, timeout: Duration, f: impl FnMut() -> Result<Option<T>, String>) -> Result<T, String> {
    wait_every(what, timeout, Duration::from_millis(500), f)
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn kit() -> PathBuf {
    std::env::var_os("KIT").map(PathBuf::from).unwrap_or_else(|| root().join("../shared/k8s"))
}

pub(super) fn run_cmd(prog: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(prog).args(args).output().map_err(|e| format!("{prog} cannot run: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{prog} {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        ))
    }
}

/// `scripts/e2e-node.sh CMD NODE`: a fake node's agent and provisioner.
fn fake_csi(cmd: &str, node: &str) -> Check {
    run_cmd(&root().join("scripts/e2e-node.sh").display().to_string(), &[cmd, node]).map(|_| ())
}

/// The kit's `node.sh CMD NODE`: a fake node's heartbeat and Node object.
fn kit_node(cmd: &str, node: &str) -> Check {
    run_cmd(&kit().join("node.sh").display().to_string(), &[cmd, node]).map(|_| ())
}

fn socket(node: &str) -> String {
    format!("{E2E_DIR}/{node}/csi.sock")
}

/// The fake node's agent through its CLI (`drivelet csi` on its CSI socket, `drivelet
/// ctl` on its admin socket), as JSON.
fn agent_json(node: &str, args: &[&str]) -> Result<Value, String> {
    let (config, sock) = (format!("{E2E_DIR}/{node}/drivelet.toml"), socket(node));
    let mut a: Vec<&str> = match args.first() {
        Some(&"csi") => vec!["csi", "--endpoint", &sock],
        Some(&"ctl") => vec!["ctl", "-c", &config],
        _ => vec![args.first().copied().unwrap_or_default()],
    };
    a.extend(args.iter().skip(1));
    a.extend(["-o", "json"]);
    let text = run_cmd(AGENT, &a).map_err(|e| format!("{node}'s agent: {e}"))?;
    serde_json::from_str(&text).map_err(|e| format!("{node}'s agent: drivelet {}: unreadable JSON: {e}: {text}", args.join(" ")))
}

fn agent_volume_ids(node: &str) -> Result<Vec<String>, String> {
    let v = agent_json(node, &["ctl", "volumes"])?;
    Ok(v.as_array().into_iter().flatten().filter_map(|v| v["id"].as_str().map(str::to_string)).collect())
}

/// GetCapacity of the fake node's agent for the suite's ext4 class parameters.
fn agent_capacity(node: &str) -> Result<(u64, u64), String> {
    agent_capacity_for(node, "ext4")
}

/// GetCapacity of the fake node's agent for the parameters of the suite's class of `fs`.
fn agent_capacity_for(node: &str, fs: &str) -> Result<(u64, u64), String> {
    let fs = format!("csi.storage.k8s.io/fstype={fs}");
    let v = agent_json(node, &["csi", "capacity", "--param", "media=virtual", "--param", "layout=partition", "--param", &fs])?;
    Ok((v["available_capacity"].as_u64().unwrap_or(0), v["maximum_volume_size"].as_u64().unwrap_or(0)))
}

/// Every CSIStorageCapacity of `class` for `node`'s topology: (capacity, maximumVolumeSize).
fn capacities(class: &str, node: &str) -> Result<Vec<(u64, u64)>, String> {
    let list = get_json(&["get", "csistoragecapacities", "-n", SYSTEM_NS])?;
    let q = |v: &Value| v.as_str().map(parse_quantity).transpose().map(|o| o.unwrap_or(0));
    let mut out = Vec::new();
    for c in list["items"].as_array().into_iter().flatten() {
        if c["storageClassName"] == class && c["nodeTopology"]["matchLabels"][TOPOLOGY_KEY] == node {
            out.push((q(&c["capacity"])?, q(&c["maximumVolumeSize"])?));
        }
    }
    Ok(out)
}

fn class(name: &str, fs: &str, extra: &str) -> String {
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
{extra}volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
---
"
    )
}

fn claim(name: &str, class: &str, size: &str, mode: &str) -> String {
    format!(
        "apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {name}
  namespace: {NS}
spec:
  storageClassName: {class}
  volumeMode: {mode}
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: {size}
---
"
    )
}

/// A pod using `claim` (never run on a fake node: only scheduled), on `node` if given.
fn pod(name: &str, claim: &str, block: bool, node: Option<&str>) -> String {
    let selector = node.map(|n| format!("  nodeSelector:\n    kubernetes.io/hostname: {n}\n")).unwrap_or_default();
    let use_ = if block {
        "      volumeDevices:\n        - name: v\n          devicePath: /dev/e2e-block\n"
    } else {
        "      volumeMounts:\n        - name: v\n          mountPath: /data\n"
    };
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {NS}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 1
{selector}  containers:
    - name: c
      image: k8s-kit.local/busybox:1.35
      imagePullPolicy: IfNotPresent
      command: [sleep, '3600']
{use_}  volumes:
    - name: v
      persistentVolumeClaim:
        claimName: {claim}
---
"
    )
}

pub(super) fn get_opt(args: &[&str]) -> Result<Option<Value>, String> {
    match get_json(args) {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.contains("NotFound") || e.contains("not found") => Ok(None),
        Err(e) => Err(e),
    }
}

fn pod_node(name: &str) -> Result<Option<String>, String> {
    Ok(get_opt(&["get", "pod", "-n", NS, name])?.and_then(|p| p["spec"]["nodeName"].as_str().map(str::to_string)))
}

fn claim_obj(name: &str) -> Result<Option<Value>, String> {
    get_opt(&["get", "pvc", "-n", NS, name])
}

fn pv_of(claim: &str) -> Result<String, String> {
    let c = claim_obj(claim)?.ok_or(format!("claim {claim} does not exist"))?;
    c["spec"]["volumeName"].as_str().filter(|s| !s.is_empty()).map(str::to_string).ok_or(format!("claim {claim} is not bound"))
}

/// The node a PV's node affinity names (drivelet's topology key).
fn pv_node(pv: &Value) -> Option<String> {
    let terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"].as_array()?;
    terms.iter().flat_map(|t| t["matchExpressions"].as_array().cloned().unwrap_or_default()).find_map(|e| {
        (e["key"] == TOPOLOGY_KEY && e["operator"] == "In").then(|| e["values"][0].as_str().map(str::to_string)).flatten()
    })
}

fn pv(name: &str) -> Result<Option<Value>, String> {
    get_opt(&["get", "pv", name])
}

fn handle_of(pv: &Value) -> String {
    pv["spec"]["csi"]["volumeHandle"].as_str().unwrap_or_default().to_string()
}

/// The driver's VolumeAttachments of `node`.
fn attachments_of(node: &str) -> Result<Vec<Value>, String> {
    let vas = get_json(&["get", "volumeattachments"])?;
    Ok(vas["items"].as_array().into_iter().flatten().filter(|v| v["spec"]["attacher"] == DRIVER && v["spec"]["nodeName"] == node).cloned().collect())
}

fn attachment_of(pv: &str) -> Result<Option<Value>, String> {
    let vas = get_json(&["get", "volumeattachments"])?;
    Ok(vas["items"].as_array().into_iter().flatten().find(|v| v["spec"]["source"]["persistentVolumeName"] == pv).cloned())
}

fn drive_objects_of(node: &str) -> Result<Vec<Value>, String> {
    let d = get_json(&["get", "drives", "-l", &format!("{DRIVE_NODE_LABEL}={node}")])?;
    Ok(d["items"].as_array().cloned().unwrap_or_default())
}

/// The Drive objects of `node`'s own drives (its agent also lists the other nodes' loop
/// drives it sees on this shared host, as excluded).
fn managed_drives_of(node: &str) -> Result<Vec<Value>, String> {
    Ok(drive_objects_of(node)?.into_iter().filter(|d| d["status"]["class"] == "managed").collect())
}

fn events(kind: &str, name: &str, reason: &str) -> Result<Vec<Value>, String> {
    events_in(NS, kind, name, reason)
}

fn name_of(v: &Value) -> String {
    v["metadata"]["name"].as_str().unwrap_or_default().to_string()
}

/// The Lease: (holder, acquireTime), holder empty when nobody holds it.
fn lease() -> Result<Option<(String, String)>, String> {
    Ok(get_opt(&["get", "lease", "-n", SYSTEM_NS, LEASE])?.map(|l| {
        (l["spec"]["holderIdentity"].as_str().unwrap_or_default().to_string(), l["spec"]["acquireTime"].as_str().unwrap_or_default().to_string())
    }))
}

/// The volume handles the cluster duties remembered for `node`.
fn removed_volumes(node: &str) -> Result<Vec<String>, String> {
    Ok(get_opt(&["get", "configmap", "-n", SYSTEM_NS, REMOVED])?
        .and_then(|c| c["data"][node].as_str().map(|s| s.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect()))
        .unwrap_or_default())
}

/// Waits until `claim` is bound, its pod scheduled on `node`, and its attachment attached.
fn wait_attached(claim: &str, pod: &str, node: &str, timeout: Duration) -> Result<String, String> {
    wait(&format!("pod {pod} scheduled on {node}"), timeout, || Ok(pod_node(pod)?.filter(|n| n == node)))?;
    let pv = wait(&format!("claim {claim} bound"), timeout, || Ok(pv_of(claim).ok()))?;
    wait(&format!("the VolumeAttachment of claim {claim} ({pv}) on {node} attached: true"), timeout, || {
        Ok(attachment_of(&pv)?.filter(|v| v["spec"]["nodeName"] == node && v["status"]["attached"] == true).map(|_| ()))
    })?;
    Ok(pv)
}

/// Force-deletes pods (a fake node never confirms a graceful deletion).
fn force_delete_pods(names: &[&str]) -> Check {
    let mut a = vec!["delete", "pod", "-n", NS, "--ignore-not-found", "--grace-period=0", "--force", "--wait=false"];
    a.extend(names);
    kubectl(&a).map(|_| ())
}

fn scheduler_storage_reason(pod: &str) -> Result<Option<String>, String> {
    let ev = events("Pod", pod, "FailedScheduling")?;
    Ok(ev.iter().filter_map(|e| e["message"].as_str()).find(|m| m.contains("did not have enough free storage")).map(str::to_string))
}

// ---------------------------------------------------------------------------------
// journeys

fn journey_placement(st: &mut State) -> Check {
    for node in [N2, N3] {
        let n = get_opt(&["get", "node", node])?.ok_or(format!("no Node {node}: run scripts/e2e.sh (EXTRA_NODES)"))?;
        ensure(n["metadata"]["labels"]["k8s-kit/fake-node"] == "true", || format!("{node} is not one of the kit's fake nodes"))?;
        agent_json(node, &["csi", "info"]).map_err(|e| format!("{e}: scripts/e2e.sh starts it (scripts/e2e-node.sh start {node})"))?;
    }
    kubectl(&["create", "namespace", NS]).or_else(|e| if e.contains("AlreadyExists") { Ok(String::new()) } else { Err(e) })?;
    // Made now, so its capacity is published by the time the deleted-node journey uses it.
    apply(&class(RELEASE_CLASS, "ext4", "  drivelet.io/on-node-deleted: release-claims\n"))?;

    // Each fake node's CSIStorageCapacity, per class, is what its agent's GetCapacity says.
    let t = Instant::now();
    for node in [N2, N3] {
        for (class, fs) in [(EXT4, "ext4"), (XFS, "xfs")] {
            let want = agent_capacity_for(node, fs)?;
            ensure(want.0 > 0 && want.1 > 0, || format!("{node}'s agent: GetCapacity for {fs} answers {want:?}"))?;
            wait(&format!("{node}'s CSIStorageCapacity of {class} equal to its GetCapacity {want:?}"), Duration::from_secs(60), || {
                let got = capacities(class, node)?;
                if !got.is_empty() && got.iter().all(|c| *c == want) {
                    Ok(Some(()))
                } else {
                    Err(format!("published {got:?}"))
                }
            })?;
        }
        st.measured.insert(format!("{node} GetCapacity (available, maximum volume)"), format!("{:?}", agent_capacity(node)?));
    }
    st.measured.insert("fake nodes' CSIStorageCapacity equal to GetCapacity, seen after".into(), format!("{:.1}s", t.elapsed().as_secs_f64()));
    let (_, max2) = agent_capacity(N2)?;
    let (_, max3) = agent_capacity(N3)?;
    ensure(max2 > 3 * GIB && max2 < 6 * GIB && max3 < 3 * GIB / 2, || {
        format!("the suite's drives are not as planned: node-2 takes at most {max2} bytes, node-3 {max3} (want 3-6 GiB, under 1.5 GiB)")
    })?;

    // A claim only node-2 can hold (3 GiB: node-1's drives are 2 GiB, node-3's 1 GiB),
    // its pod free to go anywhere: provisioned on node-2, the pod scheduled there.
    apply(&(claim("only-n2", EXT4, "3Gi", "Filesystem") + &pod("only-n2", "only-n2", false, None)))?;
    // ext4, xfs and block claims pinned to node-2.
    apply(
        &(claim("n2-ext4", EXT4, "128Mi", "Filesystem")
            + &pod("n2-ext4", "n2-ext4", false, Some(N2))
            + &claim("n2-xfs", XFS, "320Mi", "Filesystem")
            + &pod("n2-xfs", "n2-xfs", false, Some(N2))
            + &claim("n2-block", EXT4, "64Mi", "Block")
            + &pod("n2-block", "n2-block", true, Some(N2))),
    )?;
    // A claim no node can hold (6 GiB: node-2's drives are 4 GiB), and one whose pod is
    // pinned to node-3, which has no room for it (node-1 and node-2 would have).
    apply(&(claim("nowhere", EXT4, "6Gi", "Filesystem") + &pod("nowhere", "nowhere", false, None)))?;
    apply(&(claim("pinned-n3", EXT4, "1536Mi", "Filesystem") + &pod("pinned-n3", "pinned-n3", false, Some(N3))))?;

    let t = Instant::now();
    let pv = wait_attached("only-n2", "only-n2", N2, Duration::from_secs(120))?;
    st.measured.insert("claim only node-2 can hold: provisioned, scheduled, attached".into(), format!("{:.1}s", t.elapsed().as_secs_f64()));
    for (c, block) in [("n2-ext4", false), ("n2-xfs", false), ("n2-block", true)] {
        let pv = wait_attached(c, c, N2, Duration::from_secs(120))?;
        let v = pv_obj(&pv)?;
        ensure(pv_node(&v).as_deref() == Some(N2), || format!("claim {c}: PV {pv} names node {:?}, want {N2}", pv_node(&v)))?;
        ensure((v["spec"]["volumeMode"] == "Block") == block, || format!("claim {c}: PV {pv} volume mode {}", v["spec"]["volumeMode"]))?;
    }
    let v = pv_obj(&pv)?;
    ensure(pv_node(&v).as_deref() == Some(N2), || format!("PV {pv} of claim only-n2 names node {:?}, want {N2}", pv_node(&v)))?;
    let ids = agent_volume_ids(N2)?;
    ensure(ids.contains(&handle_of(&v)), || format!("node-2's agent does not list {} (it lists {ids:?})", handle_of(&v)))?;

    // Refused: Pending with the scheduler's storage reason, never given a node, no PV,
    // and no provisioning tried (no selected node on the claim, no provisioning Event).
    for (p, what) in [("nowhere", "a claim no node can hold"), ("pinned-n3", "a pod pinned to node-3, which has no room")] {
        let reason = wait(&format!("{what}: a FailedScheduling Event saying there is not enough free storage"), Duration::from_secs(60), || {
            scheduler_storage_reason(p)
        })?;
        let pod = get_json(&["get", "pod", "-n", NS, p])?;
        ensure(pod["status"]["phase"] == "Pending" && pod["spec"]["nodeName"].is_null(), || format!("{what}: pod {p} is {} on {}", pod["status"]["phase"], pod["spec"]["nodeName"]))?;
        let c = claim_obj(p)?.ok_or(format!("claim {p} is gone"))?;
        ensure(c["status"]["phase"] == "Pending" && c["spec"]["volumeName"].is_null(), || format!("{what}: claim {p}: {}", c["status"]))?;
        ensure(c["metadata"]["annotations"]["volume.kubernetes.io/selected-node"].is_null(), || {
            format!("{what}: the scheduler selected node {} for claim {p}", c["metadata"]["annotations"]["volume.kubernetes.io/selected-node"])
        })?;
        st.measured.insert(format!("scheduler's reason for {p}"), reason);
    }
    // Whatever ran meanwhile, still nothing made for them: no PV claims them, no
    // provisioning Event on them.
    let pvs = get_json(&["get", "pv"])?;
    for p in ["nowhere", "pinned-n3"] {
        let made: Vec<String> =
            pvs["items"].as_array().into_iter().flatten().filter(|v| v["spec"]["claimRef"]["namespace"] == NS && v["spec"]["claimRef"]["name"] == p).map(name_of).collect();
        ensure(made.is_empty(), || format!("claim {p} got PVs {made:?}"))?;
        for reason in ["Provisioning", "ProvisioningFailed", "ProvisioningSucceeded"] {
            let ev = events("PersistentVolumeClaim", p, reason)?;
            ensure(ev.is_empty(), || format!("claim {p} has {reason} Events: {:?}", ev.iter().map(|e| e["message"].clone()).collect::<Vec<_>>()))?;
        }
    }
    force_delete_pods(&["nowhere", "pinned-n3"])?;
    kubectl(&["delete", "pvc", "-n", NS, "nowhere", "pinned-n3", "--wait=true", "--timeout=60s"])?;
    Ok(())
}

fn pv_obj(name: &str) -> Result<Value, String> {
    pv(name)?.ok_or(format!("PV {name} does not exist"))
}

/// What must not change while node-2 is merely stopped: its claims (phase, volume), PVs
/// (phase), attachments (attached), its drives' Drive objects; any deletion mark is a
/// change too.
fn snapshot_n2() -> Result<BTreeMap<String, String>, String> {
    let mut s = BTreeMap::new();
    let mark = |v: &Value| if v["metadata"]["deletionTimestamp"].is_null() { "" } else { " DELETING" };
    let claims = get_json(&["get", "pvc", "-n", NS])?;
    let pvs = get_json(&["get", "pv"])?;
    for c in claims["items"].as_array().into_iter().flatten() {
        let Some(pv) = c["spec"]["volumeName"].as_str() else { continue };
        let Some(p) = pvs["items"].as_array().into_iter().flatten().find(|p| p["metadata"]["name"] == pv) else {
            s.insert(format!("claim {}", name_of(c)), format!("bound to missing PV {pv}"));
            continue;
        };
        if pv_node(p).as_deref() != Some(N2) {
            continue;
        }
        s.insert(format!("claim {}", name_of(c)), format!("{} {pv}{}", c["status"]["phase"], mark(c)));
        s.insert(format!("PV {pv}"), format!("{}{}", p["status"]["phase"], mark(p)));
    }
    for v in attachments_of(N2)? {
        s.insert(format!("VolumeAttachment {}", name_of(&v)), format!("attached {}{}", v["status"]["attached"], mark(&v)));
    }
    // Its own drives' objects: the objects of other loop devices of this shared host
    // (excluded) come and go with whatever else runs on it.
    for d in managed_drives_of(N2)? {
        s.insert(format!("Drive {}", name_of(&d)), mark(&d).to_string());
    }
    Ok(s)
}

fn journey_stopped(st: &mut State) -> Check {
    let before = snapshot_n2()?;
    let count = |kind: &str| before.keys().filter(|k| k.starts_with(kind)).count();
    ensure(count("claim") == 4 && count("VolumeAttachment") == 4 && managed_drives_of(N2)?.len() == 2, || format!("node-2 before the stop: {before:#?}"))?;
    let ids = agent_volume_ids(N2)?;

    let t = Instant::now();
    fake_csi("stop", N2)?;
    kit_node("stop", N2)?;
    let not_ready = wait_every("node-2 NotReady (Ready Unknown) after its heartbeat stopped", Duration::from_secs(120), Duration::from_secs(1), || {
        let n = get_json(&["get", "node", N2])?;
        let ready = n["status"]["conditions"].as_array().into_iter().flatten().find(|c| c["type"] == "Ready").map(|c| c["status"].clone());
        Ok((ready == Some(Value::from("Unknown"))).then(|| t.elapsed()))
    })?;
    st.measured.insert("node-2 heartbeat stopped -> NotReady".into(), format!("{:.0}s", not_ready.as_secs_f64()));
    // Held for STOP_HOLD in all, compared every 2 s: one deletion at any moment fails.
    while t.elapsed() < STOP_HOLD {
        let now = snapshot_n2()?;
        ensure(now == before, || format!("{:.0}s after node-2 stopped, its objects changed:\nbefore {before:#?}\nnow {now:#?}", t.elapsed().as_secs_f64()))?;
        std::thread::sleep(Duration::from_secs(2));
    }
    ensure(removed_volumes(N2)?.is_empty(), || "volumes of a merely stopped node-2 were marked removed".into())?;
    let held = t.elapsed();

    kit_node("start", N2)?;
    fake_csi("start", N2)?;
    st.measured.insert("node-2 kept stopped (heartbeat and agent), nothing released".into(), format!("{:.0}s", held.as_secs_f64()));
    // Back: every volume listed and normal, every attachment still attached, the Drive
    // objects present, no claim told its node was deleted.
    let now = wait("node-2's agent lists every volume again", Duration::from_secs(30), || {
        let now = agent_volume_ids(N2)?;
        Ok(ids.iter().all(|i| now.contains(i)).then_some(now))
    })?;
    ensure(now.len() == ids.len(), || format!("node-2's volumes {ids:?} before, {now:?} after"))?;
    for id in &ids {
        let v = agent_json(N2, &["csi", "get", id])?;
        ensure(v["abnormal"] == false, || format!("volume {id} on node-2 after its return: {v}"))?;
    }
    wait("node-2's Drive objects present", Duration::from_secs(30), || {
        let d = managed_drives_of(N2)?;
        Ok((d.len() == 2 && d.iter().all(|d| d["status"]["presence"] == "present")).then_some(()))
    })?;
    let after = snapshot_n2()?;
    ensure(after == before, || format!("node-2's objects changed by its return:\nbefore {before:#?}\nafter {after:#?}"))?;
    for c in ["only-n2", "n2-ext4", "n2-xfs", "n2-block"] {
        ensure(events("PersistentVolumeClaim", c, "NodeDeleted")?.is_empty(), || format!("claim {c} was told node-2 was deleted"))?;
    }
    Ok(())
}

fn statefulset() -> String {
    format!(
        "apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: web
  namespace: {NS}
spec:
  serviceName: web
  replicas: 1
  selector:
    matchLabels: {{app: web}}
  template:
    metadata:
      labels: {{app: web}}
    spec:
      hostNetwork: true
      terminationGracePeriodSeconds: 1
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
              - matchExpressions:
                  - {{key: k8s-kit/fake-node, operator: Exists}}
      containers:
        - name: c
          image: k8s-kit.local/busybox:1.35
          imagePullPolicy: IfNotPresent
          command: [sleep, '3600']
          volumeMounts:
            - {{name: data, mountPath: /data}}
  volumeClaimTemplates:
    - metadata:
        name: data
      spec:
        storageClassName: {RELEASE_CLASS}
        accessModes: [ReadWriteOnce]
        resources:
          requests:
            storage: 64Mi
"
    )
}

/// Kills the Lease holder with SIGKILL (a fake node's agent only: see the module rules);
/// returns who it was.
fn kill_holder() -> Result<String, String> {
    let (holder, _) = lease()?.ok_or(format!("no Lease {LEASE} in {SYSTEM_NS}: no agent is a cluster-duties candidate"))?;
    match holder.as_str() {
        N3 | N2 => {
            fake_csi("kill", &holder)?;
            Ok(holder)
        }
        "" => Err("the Lease has no holder".into()),
        other => Err(format!(
            "the Lease is held by {other}, not by a fake node's agent: scripts/e2e.sh starts node-3's first so that it holds it, and killing \
             the real node's pod would break the journeys running beside"
        )),
    }
}

fn journey_deleted(st: &mut State) -> Check {
    // A StatefulSet whose claim class releases claims of deleted nodes (made in the
    // placement journey), its replica on node-2 (node-3 cordoned meanwhile: the pod may
    // only go to fake nodes).
    kubectl(&["cordon", N3])?;
    let placed = apply(&statefulset()).and_then(|_| wait_attached("data-web-0", "web-0", N2, Duration::from_secs(120)));
    kubectl(&["uncordon", N3])?;
    let web_pv = placed?;
    let web_claim_uid = claim_obj("data-web-0")?.map(|c| c["metadata"]["uid"].clone()).unwrap_or_default();
    let only_pv = pv_of("only-n2")?;
    let only_handle = handle_of(&pv_obj(&only_pv)?);
    let kept = ["n2-ext4", "n2-xfs", "n2-block"];
    let kept_pvs: Vec<String> = kept.iter().map(|c| pv_of(c)).collect::<Result<_, _>>()?;
    let kept_handles: Vec<String> = kept_pvs.iter().map(|p| pv_obj(p).map(|v| handle_of(&v))).collect::<Result<_, _>>()?;
    ensure(attachments_of(N2)?.len() == 5 && managed_drives_of(N2)?.len() == 2, || "node-2 lacks its attachments or Drive objects before the deletion".into())?;
    let holder_before = lease()?.map(|l| l.0).unwrap_or_default();

    // node-2 killed (agent stopped, heartbeat stopped) and deleted for good.
    fake_csi("stop", N2)?;
    kit_node("delete", N2)?;
    let deleted = Instant::now();
    // The user deletes a claim of node-2 while it is gone: its PV is Released and only
    // the cluster duties can delete it.
    force_delete_pods(&["only-n2"])?;
    kubectl(&["delete", "pvc", "-n", NS, "only-n2", "--wait=false"])?;

    // The leader's first round for the gone node: its Drive objects go (the claims wait
    // for the pod garbage collector, which deletes a deleted node's pods after 40 s).
    let left = |what: &str| format!("{what}, {:.0}s after node-2 was deleted", deleted.elapsed().as_secs_f64());
    wait("no Drive object of node-2 left", DUTIES_BOUND, || {
        let d = drive_objects_of(N2)?;
        if d.is_empty() {
            Ok(Some(()))
        } else {
            Err(left(&format!("left: {:?}", d.iter().map(name_of).collect::<Vec<_>>())))
        }
    })?;
    st.measured.insert("node-2 deleted -> no Drive object of it".into(), format!("{:.1}s", deleted.elapsed().as_secs_f64()));

    // The leader killed mid-way, its duties begun, not done: the Lease moves to another
    // candidate, which finishes them.
    let holder = lease()?.map(|l| l.0).unwrap_or_default();
    let not_released = events("PersistentVolumeClaim", "data-web-0", "ClaimReleased")?.is_empty();
    ensure(not_released, || "the claim data-web-0 was released before the leader could be killed mid-way".into())?;
    let killed = kill_holder()?;
    let t = Instant::now();
    let (new_holder, _) = wait(&format!("the Lease {LEASE} taken over from {killed} (killed with SIGKILL)"), Duration::from_secs(40), || {
        Ok(lease()?.filter(|(h, _)| !h.is_empty() && *h != killed && h != N2))
    })?;
    st.measured.insert(
        "Lease holder killed mid-way -> taken over".into(),
        format!("{:.1}s ({killed} -> {new_holder}; holder before node-2 was deleted: {holder_before}, when killed: {holder})", t.elapsed().as_secs_f64()),
    );
    // The killed agent comes back (node-3 must serve the StatefulSet's new claim).
    fake_csi("start", &killed)?;

    // The rest of the duties, within DUTIES_BOUND of the deletion.
    wait("no VolumeAttachment of node-2 left", DUTIES_BOUND, || {
        let v = attachments_of(N2)?;
        if v.is_empty() {
            Ok(Some(()))
        } else {
            Err(left(&format!("left: {:?}", v.iter().map(name_of).collect::<Vec<_>>())))
        }
    })?;
    st.measured.insert("node-2 deleted -> no VolumeAttachment of it".into(), format!("{:.0}s", deleted.elapsed().as_secs_f64()));
    wait(&format!("the Released PV {only_pv} of node-2 deleted and remembered"), DUTIES_BOUND, || {
        if pv(&only_pv)?.is_some() {
            return Err(left("still there"));
        }
        let r = removed_volumes(N2)?;
        if r.contains(&only_handle) {
            Ok(Some(()))
        } else {
            Err(left(&format!("{REMOVED} lists {r:?} for {N2}")))
        }
    })?;
    st.measured.insert("node-2 deleted -> its Released PV deleted".into(), format!("{:.0}s", deleted.elapsed().as_secs_f64()));
    // The opted-in claim released (an Event says so), the StatefulSet's replica back on a
    // live node with a new claim, its old PV gone.
    let new_node = wait("the StatefulSet's replica web-0 back on a live node with a new claim, attached", DUTIES_BOUND, || {
        let Some(c) = claim_obj("data-web-0")? else { return Err(left("claim data-web-0 not made again yet")) };
        if c["metadata"]["uid"] == web_claim_uid {
            return Err(left("claim data-web-0 not released yet"));
        }
        let Some(node) = pod_node("web-0")?.filter(|n| n != N2) else { return Err(left("web-0 not scheduled on a live node yet")) };
        let Ok(p) = pv_of("data-web-0") else { return Err(left("new claim data-web-0 not bound yet")) };
        Ok(attachment_of(&p)?.filter(|v| v["spec"]["nodeName"] == node.as_str() && v["status"]["attached"] == true).map(|_| node))
    })?;
    st.measured.insert("node-2 deleted -> StatefulSet replica attached on a live node".into(), format!("{:.0}s (on {new_node})", deleted.elapsed().as_secs_f64()));
    let released = events("PersistentVolumeClaim", "data-web-0", "ClaimReleased")?;
    ensure(!released.is_empty(), || "claim data-web-0 was released without a ClaimReleased Event".into())?;
    wait(&format!("the released claim's PV {web_pv} deleted"), DUTIES_BOUND, || Ok(pv(&web_pv)?.is_none().then_some(())))?;
    // Default claims stay, bound, with one NodeDeleted Warning each; their PVs lose the
    // attacher's finalizer.
    for (c, p) in kept.iter().zip(&kept_pvs) {
        let ev = wait(&format!("a NodeDeleted Event on the kept claim {c}"), DUTIES_BOUND, || {
            let ev = events("PersistentVolumeClaim", c, "NodeDeleted")?;
            Ok((!ev.is_empty()).then_some(ev))
        })?;
        ensure(ev.iter().all(|e| e["type"] == "Warning"), || format!("claim {c}: NodeDeleted Events {ev:?}"))?;
        let claim = claim_obj(c)?.ok_or(format!("the kept claim {c} was deleted"))?;
        ensure(claim["status"]["phase"] == "Bound" && claim["spec"]["volumeName"] == p.as_str() && claim["metadata"]["deletionTimestamp"].is_null(), || {
            format!("the kept claim {c}: {}", claim["status"])
        })?;
        wait(&format!("PV {p} of the kept claim {c}: no attacher finalizer"), DUTIES_BOUND, || {
            let v = pv_obj(p)?;
            let f = v["metadata"]["finalizers"].as_array().cloned().unwrap_or_default();
            Ok((!f.iter().any(|f| f == ATTACHER_FINALIZER)).then_some(()))
        })?;
    }
    st.measured.insert("node-2 deleted -> every duty done".into(), format!("{:.0}s", deleted.elapsed().as_secs_f64()));
    // A kept claim is warned once, whichever agent leads: the warning is remembered on
    // the claim (annotation drivelet.io/node-deleted-warned), which every later leader
    // reads. Only a leader killed between recording the Event and writing the annotation
    // (milliseconds) leaves a second one.
    let mut counts = Vec::new();
    for c in kept {
        wait(&format!("the kept claim {c} annotated as warned about node-2"), DUTIES_BOUND, || {
            let claim = claim_obj(c)?.ok_or(format!("the kept claim {c} was deleted"))?;
            Ok((claim["metadata"]["annotations"]["drivelet.io/node-deleted-warned"] == "node-2").then_some(()))
        })?;
        let ev = events("PersistentVolumeClaim", c, "NodeDeleted")?;
        let n: u64 = ev.iter().map(|e| e["count"].as_u64().unwrap_or(1)).sum();
        ensure(n <= 2, || format!("claim {c} got {n} NodeDeleted Events: one per leader, not one per claim: {ev:?}"))?;
        counts.push(format!("{c} {} Event(s), count {n}", ev.len()));
    }
    st.measured.insert("NodeDeleted Events on the kept claims (one Lease handover)".into(), counts.join(", "));
    if let Some(msg) = events("PersistentVolumeClaim", "n2-ext4", "NodeDeleted")?.first().and_then(|e| e["message"].as_str()) {
        st.measured.insert("NodeDeleted Event".into(), msg.to_string());
    }

    // node-2 comes back under its name, on the same drives: the removed volume is
    // deleted (and its mark cleared), the kept ones serve again.
    kit_node("start", N2)?;
    fake_csi("start", N2)?;
    let back = Instant::now();
    wait(&format!("node-2's agent deletes the removed volume {only_handle} and clears its mark"), Duration::from_secs(60), || {
        let ids = agent_volume_ids(N2)?;
        Ok((!ids.contains(&only_handle) && removed_volumes(N2)?.is_empty()).then_some(()))
    })?;
    let ids = agent_volume_ids(N2)?;
    ensure(kept_handles.iter().all(|h| ids.contains(h)), || format!("node-2 back lists {ids:?}; the kept volumes are {kept_handles:?}"))?;
    let logged = std::fs::read_to_string(format!("{E2E_DIR}/{N2}/drivelet-{N2}.log")).unwrap_or_default();
    ensure(logged.lines().any(|l| l.contains(&only_handle) && l.contains("delet")), || format!("node-2's log has no line about deleting {only_handle}"))?;
    for (c, block) in [("n2-ext4", false), ("n2-xfs", false), ("n2-block", true)] {
        apply(&pod(&format!("{c}-back"), c, block, Some(N2)))?;
    }
    for c in kept {
        wait_attached(c, &format!("{c}-back"), N2, Duration::from_secs(90))?;
    }
    st.measured.insert("node-2 back -> removed volume deleted, kept ones attached".into(), format!("{:.1}s", back.elapsed().as_secs_f64()));
    wait("node-2's Drive objects back", Duration::from_secs(30), || Ok((managed_drives_of(N2)?.len() == 2).then_some(())))?;
    Ok(())
}

/// The sum of the series of `name` in an agent's /metrics at `address`.
fn metric_sum(address: &str, name: &str) -> Result<f64, String> {
    let text = run_cmd("curl", &["-sf", "--max-time", "5", &format!("http://{address}/metrics")])?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// Every agent (the DaemonSet's on node-1, the host agents of node-2 and node-3) watched
/// only its own objects: after the journeys across nodes made claims, PVs and
/// attachments on all three, no agent's per-node watches delivered an object of another
/// node (`drivelet_kube_foreign_watch_events_total` 0), each received events for its own,
/// and every PV of the journeys carries the label of the node its affinity names.
fn journey_own_objects(st: &mut State) -> Check {
    for (node, address) in [("node-1", "127.0.0.1:9808"), (N2, "127.0.0.1:9812"), (N3, "127.0.0.1:9813")] {
        let foreign = metric_sum(address, "drivelet_kube_foreign_watch_events_total")?;
        let all = metric_sum(address, "drivelet_kube_watch_events_total")?;
        ensure(foreign == 0.0, || format!("{node}'s agent received {foreign} watch events for other nodes' objects"))?;
        ensure(all > 0.0, || format!("{node}'s agent counted no watch event at all"))?;
        st.measured.insert(format!("watch events received by {node}'s agent (none foreign)"), format!("{all}"));
    }
    let relayed: f64 = ["127.0.0.1:9808", "127.0.0.1:9812", "127.0.0.1:9813"]
        .iter()
        .map(|a| metric_sum(a, "drivelet_kube_relayed_labels_total").unwrap_or(0.0))
        .sum();
    ensure(relayed > 0.0, || "no agent's relay labelled anything".to_string())?;
    // A PV made a moment ago is labelled within about a second.
    wait("every PV of the driver labelled with the node it is pinned to", Duration::from_secs(20), || {
        let pvs = get_json(&["get", "pv"])?;
        for pv in pvs["items"].as_array().into_iter().flatten().filter(|v| v["spec"]["csi"]["driver"] == DRIVER) {
            let Some(node) = pv_node(pv) else { continue };
            let label = pv["metadata"]["labels"][DRIVE_NODE_LABEL].as_str().unwrap_or("");
            if label != node {
                return Err(format!("PV {} is pinned to {node} but labelled {label:?}", name_of(pv)));
            }
        }
        Ok(Some(()))
    })
}

fn journey_cleanup(_st: &mut State) -> Check {
    let pvs = get_json(&["get", "pv"])?;
    let ours: Vec<String> = pvs["items"].as_array().into_iter().flatten().filter(|v| v["spec"]["claimRef"]["namespace"] == NS).map(name_of).collect();
    // A fake node never confirms a graceful deletion: pods go by force, then the rest.
    kubectl(&["delete", "statefulset", "-n", NS, "--all", "--wait=false"])?;
    kubectl(&["delete", "pod", "-n", NS, "--all", "--grace-period=0", "--force", "--wait=true", "--timeout=60s"])?;
    kubectl(&["delete", "namespace", NS, "--wait=true", "--timeout=120s"])?;
    wait("every PV across nodes deleted", Duration::from_secs(120), || {
        let left: Vec<&String> = ours.iter().filter(|p| kubectl(&["get", "pv", p]).is_ok()).collect();
        if left.is_empty() {
            Ok(Some(()))
        } else {
            Err(format!("left: {left:?}"))
        }
    })?;
    wait("no VolumeAttachment of a fake node left", Duration::from_secs(60), || {
        let left: Vec<String> = [N2, N3].iter().map(|n| attachments_of(n)).collect::<Result<Vec<_>, _>>()?.concat().iter().map(name_of).collect();
        if left.is_empty() {
            Ok(Some(()))
        } else {
            Err(format!("left: {left:?}"))
        }
    })?;
    for node in [N2, N3] {
        let ids = agent_volume_ids(node)?;
        ensure(ids.is_empty(), || format!("{node}'s agent still has volumes {ids:?}"))?;
    }
    kubectl_stdin(&["delete", "--ignore-not-found", "-f", "-"], Some(&class(RELEASE_CLASS, "ext4", "")))?;
    Ok(())
}

/// What explains a failure across nodes: the Lease, the fake nodes' objects, the tail of
/// their agents' and provisioners' logs.
pub(crate) fn diagnostics() {
    let show = |title: &str, args: &[&str]| {
        println!("\n===== {title}: kubectl {}", args.join(" "));
        match kubectl(args) {
            Ok(s) => println!("{s}"),
            Err(e) => println!("({e})"),
        }
    };
    show("nodes", &["get", "nodes", "-o", "wide"]);
    show("cluster-duties Lease", &["get", "lease", "-n", SYSTEM_NS, LEASE, "-o", "yaml"]);
    show("removed volumes", &["get", "configmap", "-n", SYSTEM_NS, REMOVED, "-o", "yaml"]);
    show("pods across nodes", &["get", "pods", "-n", NS, "-o", "wide"]);
    for node in [N2, N3] {
        for name in [format!("drivelet-{node}")] {
            let path = format!("{E2E_DIR}/{node}/{name}.log");
            println!("\n===== {path} (last 60 lines)");
            match std::fs::read_to_string(&path) {
                Ok(text) => {
                    let lines: Vec<&str> = text.lines().collect();
                    for l in &lines[lines.len().saturating_sub(60)..] {
                        println!("{l}");
                    }
                }
                Err(e) => println!("({e})"),
            }
        }
    }
}
