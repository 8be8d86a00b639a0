//! Drive actions through the Kubernetes API and the cluster-wide view (issue 26): the
//! binary installed as `kubectl-drivelet` and run as `kubectl drivelet`, with the suite's
//! kubeconfig, no exec.
//!
//! After the failure journey, the real node has a BAD releasing drive, a drive released
//! by `ctl` (releasing, holding the `after-bad` volume) and one active drive holding the
//! `after-release` claim with its running pod. This journey:
//! - holds the plugin's drives and volumes tables against `ctl drives` and `ctl volumes`
//!   on the node (same rows, the node column and the local paths aside), and its JSON
//!   against the Drive objects: every node's drives are listed, used bytes shown for a
//!   staged volume;
//! - names a drive that is not there: exit 3;
//! - cordons the active drive with `--wait`: done, the Drive's usage cordoned, its
//!   `ActionComplete` condition True, a `Cordoned` Event on it, `ctl drives` says so,
//!   and `spec.action` is owned by the plugin's field manager, never by drivelet's;
//!   uncordons it: active again;
//! - releases it with a short `--wait`: exit 4 while the claim's volume is on it, the
//!   condition naming that volume; the pod and claim deleted: released, condition True,
//!   a `Released` Event.

use std::process::Command;

use super::*;

/// Runs `kubectl drivelet ARGS` with the plugin on the PATH: (exit code, stdout, stderr).
pub(super) fn plugin(args: &[&str]) -> Result<(i32, String, String), String> {
    let dir = Path::new(E2E_DIR).join("plugin");
    let link = dir.join("kubectl-drivelet");
    if !link.exists() {
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        std::os::unix::fs::symlink(Path::new(E2E_DIR).join("bin/drivelet"), &link).map_err(|e| format!("{}: {e}", link.display()))?;
    }
    let path = format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new("kubectl").arg("drivelet").args(args).env("PATH", path).output().map_err(|e| e.to_string())?;
    Ok((out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned()))
}

pub(super) fn plugin_ok(args: &[&str]) -> Result<String, String> {
    match plugin(args)? {
        (0, out, _) => Ok(out),
        (code, out, err) => Err(format!("kubectl drivelet {}: exit {code}: {out}{err}", args.join(" "))),
    }
}

/// The rows of an aligned table with the columns from `from` up to (not including)
/// `to` cut out (`to` None: to the end of the line), whitespace-normalized; the header
/// row first.
fn cut_rows(table: &str, from: &str, to: Option<&str>) -> Vec<String> {
    let mut lines = table.lines();
    let header = lines.next().unwrap_or_default();
    let start = header.find(from).unwrap_or(0);
    let end = to.and_then(|t| header.find(t));
    std::iter::once(header)
        .chain(lines)
        .map(|l| {
            let a = &l[..start.min(l.len())];
            let b = end.map(|e| &l[e.min(l.len())..]).unwrap_or_default();
            format!("{a} {b}").split_whitespace().collect::<Vec<_>>().join(" ")
        })
        .collect()
}

/// The plugin's table of the real node against `ctl`'s: `Ok(None)` while they differ
/// (the Drive objects follow the node within a sync), the difference in the error.
fn tables_match(ctl_args: &[&str], plugin_args: &[&str], ctl_cut: (&str, Option<&str>)) -> Result<Option<()>, String> {
    tables_match_on(real_node(), ctl_args, plugin_args, ctl_cut)
}

/// [`tables_match`] on `node`: the real node's `ctl` runs in its pod, a fake node's on the
/// host with that node's config (its agent is a host process, `scripts/e2e-node.sh`).
fn tables_match_on(node: &str, ctl_args: &[&str], plugin_args: &[&str], ctl_cut: (&str, Option<&str>)) -> Result<Option<()>, String> {
    let ctl = if node == real_node() {
        let mut a = vec!["ctl", "-c", CONFIG];
        a.extend(ctl_args);
        drivelet(&a)?
    } else {
        let config = format!("{E2E_DIR}/{node}/drivelet.toml");
        let mut a = vec!["ctl", "-c", config.as_str()];
        a.extend(ctl_args);
        super::nodes::run_cmd(&format!("{E2E_DIR}/bin/drivelet"), &a).map_err(|e| format!("{node}'s agent: {e}"))?
    };
    let mut p = plugin_args.to_vec();
    p.extend(["--node", node]);
    let mine = plugin_ok(&p)?;
    // Row order is each listing's own (the plugin's by node and id): compared sorted.
    let sorted = |mut rows: Vec<String>| {
        rows[1..].sort();
        rows
    };
    let want = sorted(cut_rows(&ctl, ctl_cut.0, ctl_cut.1));
    let got = sorted(cut_rows(&mine, "NODE", Some("ID")));
    if want == got {
        Ok(Some(()))
    } else {
        Err(format!("ctl {}:\n{}\nkubectl drivelet {}:\n{}", ctl_args.join(" "), want.join("\n"), plugin_args.join(" "), got.join("\n")))
    }
}

/// The real node's Drive object of `drive_id`.
fn object_of(drive_id: &str) -> Result<Value, String> {
    let objs = get_json(&["get", "drives"])?;
    objs["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|o| o["spec"]["driveId"] == drive_id && o["spec"]["node"] == real_node())
        .cloned()
        .ok_or(format!("no Drive object of {drive_id} on {}", real_node()))
}

fn condition(obj: &Value) -> Value {
    obj["status"]["conditions"].as_array().into_iter().flatten().find(|c| c["type"] == "ActionComplete").cloned().unwrap_or_default()
}

fn drive_events(name: &str, reason: &str) -> Result<Vec<Value>, String> {
    events_in("default", "Drive", name, reason)
}

pub(super) fn journey_drive_actions(ctx: &mut Ctx) -> Check {
    let node = real_node().to_string();
    // The tables: the same rows as ctl on the node (PATH, STAGED AT and PUBLISHED AT are
    // the node's own; the node column is the plugin's).
    wait_for("kubectl drivelet drives = ctl drives", Duration::from_secs(45), || tables_match(&["drives"], &["drives"], ("PATH", Some("SIZE"))))?;
    wait_for("kubectl drivelet volumes = ctl volumes", Duration::from_secs(45), || {
        tables_match(&["volumes"], &["volumes"], ("STAGED AT", Some("REASON")))
    })?;
    // And on the fake node node-3 (an agent of its own, as a host process), when the kit
    // runs it. node-2 is left out: the journeys across nodes delete it and bring it back
    // meanwhile, so neither side of the comparison holds still there.
    if super::nodes::get_opt(&["get", "node", "node-3"])?.is_some() {
        wait_for("kubectl drivelet drives = ctl drives on node-3", Duration::from_secs(90), || {
            tables_match_on("node-3", &["drives"], &["drives"], ("PATH", Some("SIZE")))
        })?;
        wait_for("kubectl drivelet volumes = ctl volumes on node-3", Duration::from_secs(90), || {
            tables_match_on("node-3", &["volumes"], &["volumes"], ("STAGED AT", Some("REASON")))
        })?;
    }
    // Across the cluster: every node with Drive objects is listed (the journeys across
    // nodes may delete a node's objects meanwhile: compared until they agree).
    let nodes_of = |v: &Value, key: &str| -> std::collections::BTreeSet<String> {
        v.as_array().into_iter().flatten().filter_map(|d| d.pointer(key).and_then(Value::as_str).map(str::to_string)).collect()
    };
    wait_for("kubectl drivelet drives lists every node's drives", Duration::from_secs(30), || {
        let all: Value = serde_json::from_str(&plugin_ok(&["drives", "-o", "json"])?).map_err(|e| e.to_string())?;
        let (listed, have) = (nodes_of(&all, "/node"), nodes_of(&get_json(&["get", "drives"])?["items"], "/spec/node"));
        if listed == have && listed.len() > 1 {
            Ok(Some(()))
        } else {
            Err(format!("plugin lists nodes {listed:?}, the Drive objects {have:?}"))
        }
    })?;
    let yaml = plugin_ok(&["volumes", "-o", "yaml"])?;
    ensure(yaml.contains("usedBytes:"), || format!("no used bytes in:\n{yaml}"))?;

    // Used bytes of the running pod's volume.
    let id = volume_id_of("after-release")?;
    let used = wait_for("used bytes of the after-release volume", Duration::from_secs(45), || {
        let v: Value = serde_json::from_str(&plugin_ok(&["volumes", "--node", &node, "-o", "json"])?).map_err(|e| e.to_string())?;
        Ok(v.as_array().into_iter().flatten().find(|v| v["id"] == id.as_str()).and_then(|v| v["usedBytes"].as_u64()))
    })?;
    ensure(used > 0, || "a staged ext4 volume uses some bytes".into())?;

    // A drive that is not there: exit 3, in plain words.
    let (code, _, err) = plugin(&["drive", "cordon", &format!("{node}/no-such-drive")])?;
    ensure(code == 3 && err.contains("no drive"), || format!("exit {code}: {err}"))?;

    // Cordon the active drive holding after-release.
    let drive = record_of("after-release")?["drive_id"].as_str().unwrap_or_default().to_string();
    let target = format!("{node}/{drive}");
    let asked = Instant::now();
    let out = plugin_ok(&["drive", "cordon", &target, "--wait", "30s"])?;
    ctx.measured.insert("kubectl drivelet drive cordon --wait (patch to ActionComplete True)".into(), format!("{:.2?}", asked.elapsed()));
    ensure(out.contains("cordon done"), || out.clone())?;
    let obj = object_of(&drive)?;
    let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let c = condition(&obj);
    ensure(obj["status"]["usage"] == "cordoned" && c["status"] == "True" && c["reason"] == "Cordoned", || format!("{obj}"))?;
    ensure(c["observedGeneration"] == obj["metadata"]["generation"], || format!("condition of another generation: {obj}"))?;
    wait_for("a Cordoned Event on the Drive", Duration::from_secs(10), || Ok((!drive_events(&name, "Cordoned")?.is_empty()).then_some(())))?;
    let d = ctl_drives()?.into_iter().find(|d| d["id"] == drive.as_str()).unwrap_or_default();
    ensure(d["usage"] == "cordoned", || format!("ctl drives: {d}"))?;
    // spec.action is the plugin's: drivelet's field manager never owns it.
    let full = get_json(&["get", "drive", &name, "--show-managed-fields"])?;
    let fields = full["metadata"]["managedFields"].as_array().cloned().unwrap_or_default();
    let owner = |m: &Value| m["fieldsV1"]["f:spec"].get("f:action").is_some();
    let owners: Vec<&str> = fields.iter().filter(|m| owner(m)).filter_map(|m| m["manager"].as_str()).collect();
    ensure(owners == ["kubectl-drivelet"], || format!("spec.action is owned by {owners:?}: {}", full["metadata"]["managedFields"]))?;
    wait_for("the tables still match with the drive cordoned", Duration::from_secs(45), || {
        tables_match(&["drives"], &["drives"], ("PATH", Some("SIZE")))
    })?;

    // Uncordon: active again.
    let out = plugin_ok(&["drive", "uncordon", &target, "--wait", "30s"])?;
    ensure(out.contains("uncordon done"), || out.clone())?;
    let obj = object_of(&drive)?;
    ensure(obj["status"]["usage"] == "active" && obj["spec"]["action"] == "none", || format!("{obj}"))?;

    // Release: waits for the volume on it (exit 4 within a short wait), the condition
    // names it; the claim deleted, the drive is released.
    let (code, _, err) = plugin(&["drive", "release", &target, "--wait", "3s"])?;
    ensure(code == 4 && err.contains(&id), || format!("exit {code}: {err}"))?;
    let c = condition(&object_of(&drive)?);
    ensure(c["status"] == "False" && c["reason"] == "Releasing", || format!("{c}"))?;
    kubectl(&["delete", "pod", "-n", NS, "after-release", "--wait=true", "--timeout=120s"])?;
    kubectl(&["delete", "pvc", "-n", NS, "after-release", "--wait=true", "--timeout=120s"])?;
    let obj = wait_for("the drive released once its claim is gone", Duration::from_secs(120), || {
        let o = object_of(&drive)?;
        Ok((condition(&o)["status"] == "True" && o["status"]["usage"] == "released").then_some(o))
    })?;
    ensure(condition(&obj)["reason"] == "Released", || format!("{obj}"))?;
    wait_for("a Released Event on the Drive", Duration::from_secs(10), || Ok((!drive_events(&name, "Released")?.is_empty()).then_some(())))?;
    let out = plugin_ok(&["drive", "release", &target, "--wait", "5s"])?;
    ensure(out.contains("release done") && out.contains("may be pulled"), || out.clone())
}
