//! The 50-claim burst, a measurement (`E2E_JOURNEYS=burst`, never in the default run: a
//! benchmark, not a test): 50 claims and 50 pods using them applied at once on the real
//! node, first with the two-container pod of earlier releases (drivelet and the
//! csi-provisioner sidecar, `tests/e2e/upgrade`), then with drivelet alone (the suite's
//! overlay). For each: when every claim is bound, every VolumeAttachment attached, every
//! pod Running, and the medians per pod of apply -> bound, bound -> attached and
//! attached -> Running (NodeStage: mkfs and mount; NodePublish; the container's start).
//! The figures go to BENCHMARKS.md.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::{apply, claim, drivelet_pod, ensure, get_json, kubectl, pod, Check, Ctx, NS, SYSTEM_NS};

const N: usize = 50;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// One burst: seconds from the apply until each claim was seen bound, its attachment
/// attached, its pod Running.
fn burst(label: &str, ctx: &mut Ctx) -> Check {
    let yaml: String = (0..N).map(|i| claim(&format!("burst-{i}"), "drivelet-e2e-ext4", 32, "Filesystem", "ReadWriteOnce") + &pod(&format!("burst-{i}"), &format!("burst-{i}"), false, "", "true")).collect();
    let t0 = Instant::now();
    apply(&yaml)?;
    let (mut bound, mut attached, mut running) = (BTreeMap::<String, f64>::new(), BTreeMap::<String, f64>::new(), BTreeMap::<String, f64>::new());
    let mut pv_of: BTreeMap<String, String> = BTreeMap::new();
    while running.len() < N {
        ensure(t0.elapsed() < Duration::from_secs(600), || format!("{label}: {} of {N} pods Running after 600 s", running.len()))?;
        let now = t0.elapsed().as_secs_f64();
        let claims = get_json(&["get", "pvc", "-n", NS])?;
        for c in claims["items"].as_array().into_iter().flatten() {
            let name = c["metadata"]["name"].as_str().unwrap_or_default().to_string();
            if name.starts_with("burst-") && c["status"]["phase"] == "Bound" {
                bound.entry(name.clone()).or_insert(now);
                pv_of.insert(c["spec"]["volumeName"].as_str().unwrap_or_default().to_string(), name);
            }
        }
        let vas = get_json(&["get", "volumeattachments"])?;
        for v in vas["items"].as_array().into_iter().flatten() {
            let pv = v["spec"]["source"]["persistentVolumeName"].as_str().unwrap_or_default();
            if let Some(c) = pv_of.get(pv) {
                if v["status"]["attached"] == true {
                    attached.entry(c.clone()).or_insert(now);
                }
            }
        }
        let pods = get_json(&["get", "pods", "-n", NS])?;
        for p in pods["items"].as_array().into_iter().flatten() {
            let name = p["metadata"]["name"].as_str().unwrap_or_default().to_string();
            if name.starts_with("burst-") && p["status"]["phase"] == "Running" {
                running.entry(name).or_insert(now);
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let last = |m: &BTreeMap<String, f64>| m.values().copied().fold(0.0, f64::max);
    let per = |from: &BTreeMap<String, f64>, to: &BTreeMap<String, f64>| median(to.iter().filter_map(|(k, t)| from.get(k).map(|f| t - f)).collect());
    let zero: BTreeMap<String, f64> = bound.keys().map(|k| (k.clone(), 0.0)).collect();
    ctx.measured.insert(
        format!("burst of {N} claims and pods, {label}"),
        format!(
            "all bound {:.1}s, all attached {:.1}s, all Running {:.1}s; medians a pod: apply -> bound {:.1}s, bound -> attached {:.1}s, attached -> Running {:.1}s",
            last(&bound),
            last(&attached),
            last(&running),
            per(&zero, &bound),
            per(&bound, &attached),
            per(&attached, &running)
        ),
    );
    let names: Vec<String> = (0..N).map(|i| format!("burst-{i}")).collect();
    let mut args = vec!["delete", "pod", "-n", NS, "--wait=true", "--timeout=180s"];
    args.extend(names.iter().map(String::as_str));
    kubectl(&args)?;
    let mut args = vec!["delete", "pvc", "-n", NS, "--wait=true", "--timeout=180s"];
    args.extend(names.iter().map(String::as_str));
    kubectl(&args)?;
    super::wait_for(&format!("{label}: the burst's PVs gone"), Duration::from_secs(240), || {
        let pvs = get_json(&["get", "pv"])?;
        let left = pvs["items"].as_array().into_iter().flatten().filter(|p| p["spec"]["claimRef"]["name"].as_str().is_some_and(|n| n.starts_with("burst-"))).count();
        Ok((left == 0).then_some(()))
    })
}

fn layout(dir: &str, containers: &[&str]) -> Check {
    kubectl(&["apply", "-k", dir])?;
    kubectl(&["rollout", "status", "-n", SYSTEM_NS, "ds/drivelet", "--timeout=120s"])?;
    super::wait_for("the drivelet pod Ready as laid out", Duration::from_secs(90), || {
        let Ok(name) = drivelet_pod() else { return Ok(None) };
        let p = get_json(&["get", "pod", "-n", SYSTEM_NS, &name])?;
        let have: Vec<String> = p["spec"]["containers"].as_array().into_iter().flatten().filter_map(|c| c["name"].as_str().map(str::to_string)).collect();
        Ok((have == containers).then_some(()))
    })
}

pub(crate) fn journey_burst(ctx: &mut Ctx) -> Check {
    let before = ctx.root.join("tests/e2e/upgrade").display().to_string();
    layout(&before, &["drivelet", "csi-provisioner"])?;
    burst("before: drivelet and the csi-provisioner sidecar", ctx)?;
    layout(&ctx.overlay(), &["drivelet"])?;
    let _ = kubectl(&["delete", "clusterrole,clusterrolebinding", "drivelet-external-provisioner"]);
    let _ = kubectl(&["delete", "-n", SYSTEM_NS, "role,rolebinding", "drivelet-external-provisioner"]);
    burst("after: drivelet alone", ctx)
}
