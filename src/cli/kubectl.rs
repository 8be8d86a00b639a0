//! `kubectl drivelet`: the cluster-wide view and the drive actions, a kubectl plugin (the
//! same binary installed as `kubectl-drivelet`, or `drivelet kubectl ...`). It reads the
//! `Drive` objects every node's agent publishes, with the user's kubeconfig (no exec into
//! pods), and starts drive actions by patching a Drive's `spec.action`; the node's agent
//! carries them out and reports in the object's status.
//!
//! Rules:
//! - The tables say what `ctl drives` and `ctl volumes` say on each node, in the same
//!   columns and words (the shared [`super::ctl::drive_reason`], [`super::ctl::table`],
//!   and the volume details the agents publish), with the node first; `ctl`'s local-only
//!   columns (a drive's path, a volume's staging and target paths) are left out.
//! - Rows are sorted by node, then drive, then volume id, so two runs compare.
//! - `-o json|yaml` prints the same rows with exact byte counts, for scripts.
//! - A drive is named `NODE/DRIVE` (the drive id as `ctl drives` prints it) or by its
//!   object's name. An action is a JSON merge patch of `spec.action` alone, under field
//!   manager [`FIELD_MANAGER`]: nothing else of the object is written.
//! - `drive evacuate` asks `spec.action: evacuate`; when the drive's evacuation already
//!   stands with failed moves, it asks again (a patch to `none`, then to `evacuate`: a
//!   new generation, which the agent answers by retrying them; `none` undoes nothing of
//!   an evacuation). With `--wait`, each new word of the condition is a progress line,
//!   until it is evacuated (0), a move failed (1) or the time is up (4).
//! - `drive adopt` asks `spec.action: adopt` and sets `spec.restoreClaims` to what
//!   `--restore-claims` says (removed without it), so the adoption restores claims only
//!   when this ask says so. A refusal (the drive is not owned elsewhere) exits 1.
//! - `volumes -o wide` adds the PODS column (the pods of the node using each volume);
//!   the default table keeps `ctl volumes`' columns.
//! - Exit codes ([`KubectlError::exit_code`]): 0 done; 1 the API or the agent failed or
//!   refused; 2 bad arguments (from the argument parser); 3 no such node or drive; 4 an
//!   action waited for (`--wait`) was not complete in time.

use std::process::ExitCode;
use std::time::Duration;

use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};
use serde::Serialize;
use serde_json::json;

use super::args::{Format, KubectlArgs, KubectlCmd, KubectlDriveCmd};
use super::ctl::{drive_reason, health_words, table, used_words};
use super::CliError;
use crate::actors::inventory::model::NOT_CHECKED;
use crate::config::human_bytes;
use crate::k8s::crd::{Drive, DriveAction, DriveClass, DriveHealth};
use crate::k8s::drive_actions::{ACTION_COMPLETE, EVACUATION_FAILED, REFUSED};
use crate::k8s::drives::NODE_LABEL;

/// The field manager of the plugin's patches.
pub const FIELD_MANAGER: &str = "kubectl-drivelet";

/// How often `--wait` looks at the Drive's status.
const WAIT_POLL: Duration = Duration::from_millis(500);

/// Errors of the plugin.
#[derive(Debug, thiserror::Error)]
pub enum KubectlError {
    /// No usable kubeconfig.
    #[error("cannot use the kubeconfig: {0}")]
    Config(String),
    /// The API server answered an error or could not be reached.
    #[error("{what}: {source}")]
    Api {
        /// What was asked.
        what: String,
        /// The API error.
        source: kube::Error,
    },
    /// The drive named is not there.
    #[error("{0}")]
    NotFound(String),
    /// The node's agent refused the action.
    #[error("{0}")]
    Refused(String),
    /// The action was not complete within the time waited.
    #[error("{0}")]
    TimedOut(String),
}

impl KubectlError {
    /// The exit code a script sees (see the module rules).
    pub fn exit_code(&self) -> u8 {
        match self {
            KubectlError::Config(_) | KubectlError::Api { .. } | KubectlError::Refused(_) => 1,
            KubectlError::NotFound(_) => 3,
            KubectlError::TimedOut(_) => 4,
        }
    }
}

/// A client with the user's kubeconfig: `kubeconfig` or else `$KUBECONFIG` or
/// `~/.kube/config` (or the pod's service account), with `context` if given.
pub async fn client(kubeconfig: Option<&std::path::Path>, context: Option<String>) -> Result<Client, KubectlError> {
    let options = KubeConfigOptions { context, ..Default::default() };
    let config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).map_err(|e| KubectlError::Config(format!("{}: {e}", path.display())))?;
            Config::from_custom_kubeconfig(kc, &options).await.map_err(|e| KubectlError::Config(e.to_string()))?
        }
        None if options.context.is_some() => {
            Config::from_kubeconfig(&options).await.map_err(|e| KubectlError::Config(e.to_string()))?
        }
        None => Config::infer().await.map_err(|e| KubectlError::Config(e.to_string()))?,
    };
    Client::try_from(config).map_err(|e| KubectlError::Config(e.to_string()))
}

/// The Drive objects, of `node` only when given.
pub(crate) async fn list(client: &Client, node: Option<&str>) -> Result<Vec<Drive>, KubectlError> {
    let api: Api<Drive> = Api::all(client.clone());
    let mut params = ListParams::default();
    if let Some(n) = node {
        params = params.labels(&format!("{NODE_LABEL}={}", crate::k8s::drives::node_label_value(n)));
    }
    let list = api.list(&params).await.map_err(|source| KubectlError::Api { what: "listing the Drive objects".into(), source })?;
    let mut items: Vec<Drive> = list.items.into_iter().filter(|d| node.is_none_or(|n| d.spec.node == n)).collect();
    items.sort_by(|a, b| (&a.spec.node, &a.spec.drive_id).cmp(&(&b.spec.node, &b.spec.drive_id)));
    Ok(items)
}

/// One drive as `kubectl drivelet drives` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DriveRow {
    /// The node.
    pub node: String,
    /// The drive id, as `ctl drives` prints it.
    pub id: String,
    /// The Drive object's name.
    pub object: String,
    /// Size in bytes (0: not known, a drive missing since before its object was made).
    pub size_bytes: u64,
    /// `hdd`, `ssd`, `nvme` or `virtual`.
    pub media: String,
    /// `managed`, `system`, `foreign`, `excluded` or `owned-elsewhere`.
    pub class: String,
    /// Whose a drive owned elsewhere is, in words ("node node-2 of this cluster").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// `good`, `unknown`, `suspect` or `bad`.
    pub health: String,
    /// `active`, `cordoned`, `releasing` or `released`.
    pub usage: String,
    /// Whether the node sees the drive: `present` or `missing`.
    pub presence: String,
    /// Bytes free for new volumes (managed drives).
    pub free_bytes: Option<u64>,
    /// Partition-table slots free for new volumes (managed drives).
    #[serde(default)]
    pub free_slots: Option<u32>,
    /// Volumes on it.
    pub volumes: usize,
    /// What an admin asked of it (`spec.action`), if anything.
    pub action: Option<String>,
    /// How far that is (the `ActionComplete` condition's message).
    pub action_status: Option<String>,
    /// Why it is as it is, in the words of `ctl drives`.
    pub reason: String,
}

/// One volume as `kubectl drivelet volumes` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeRow {
    /// The node.
    pub node: String,
    /// The volume id.
    pub id: String,
    /// The name it was created with (the PV's name).
    pub name: String,
    /// The drive it lives on.
    pub drive: String,
    /// Size in bytes.
    pub size_bytes: u64,
    /// Bytes its filesystem uses, when staged.
    pub used_bytes: Option<u64>,
    /// `block`, or its filesystem.
    pub kind: String,
    /// Its state.
    pub state: String,
    /// `normal` or `abnormal`.
    pub health: String,
    /// Why it is abnormal.
    pub reason: Option<String>,
    /// The pods of its node using it, `namespace/name`.
    pub pods: Vec<String>,
}

fn word<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}

/// The row of one Drive object.
pub(crate) fn drive_row(d: &Drive) -> DriveRow {
    let st = d.status.clone().unwrap_or_default();
    let managed = st.class == Some(DriveClass::Managed);
    let health_reason = st.health_reason.clone().unwrap_or_default();
    let checked = !matches!(st.health, Some(DriveHealth::Good)) && !health_reason.is_empty() && health_reason != NOT_CHECKED;
    let usage = st.usage.as_ref().map(word).unwrap_or_else(|| "active".into());
    let condition = st.conditions.iter().find(|c| c.type_ == ACTION_COMPLETE);
    DriveRow {
        node: d.spec.node.clone(),
        id: d.spec.drive_id.clone(),
        object: d.name_any(),
        size_bytes: d.spec.size_bytes,
        media: d.spec.media.clone(),
        class: st.class.as_ref().map(word).unwrap_or_default(),
        owner: st.owner.as_ref().map(|o| o.words.clone()),
        health: st.health.as_ref().map(word).unwrap_or_default(),
        presence: word(&st.presence),
        free_bytes: st.free_bytes,
        free_slots: st.free_slots,
        volumes: st.volumes.len(),
        action: d.spec.action.map(|a| a.as_str().to_string()),
        action_status: condition.map(|c| c.message.clone()),
        reason: drive_reason(
            st.class_reason.as_deref().unwrap_or_default(),
            managed,
            checked.then_some(health_reason.as_str()),
            &usage,
            st.usage_reason.as_deref().unwrap_or_default(),
            st.cleaning.as_deref(),
        ),
        usage,
    }
}

/// The rows of the volumes on the Drive objects, by node, drive and id.
pub(crate) fn volume_rows(drives: &[Drive]) -> Vec<VolumeRow> {
    let mut rows: Vec<VolumeRow> = drives
        .iter()
        .flat_map(|d| {
            let details = d.status.as_ref().map(|s| s.volume_details.clone()).unwrap_or_default();
            details.into_iter().map(move |v| VolumeRow {
                node: d.spec.node.clone(),
                id: v.id,
                name: v.name,
                drive: d.spec.drive_id.clone(),
                size_bytes: v.size_bytes,
                used_bytes: v.used_bytes,
                kind: v.kind,
                state: v.state,
                health: v.health,
                reason: v.health_reason,
                pods: v.pods,
            })
        })
        .collect();
    rows.sort_by(|a, b| (&a.node, &a.drive, &a.id).cmp(&(&b.node, &b.drive, &b.id)));
    rows
}

/// The drives of the cluster (of `node` only, when given), as rows.
pub async fn drives(client: &Client, node: Option<&str>) -> Result<Vec<DriveRow>, KubectlError> {
    Ok(list(client, node).await?.iter().map(drive_row).collect())
}

/// The volumes of the cluster (of `node` and `drive` only, when given), as rows.
pub async fn volumes(client: &Client, node: Option<&str>, drive: Option<&str>) -> Result<Vec<VolumeRow>, KubectlError> {
    let drives = list(client, node).await?;
    Ok(volume_rows(&drives).into_iter().filter(|v| drive.is_none_or(|d| v.drive == d)).collect())
}

/// The drives table: `ctl drives`' columns with the node first and no path.
pub fn drives_table(rows: &[DriveRow]) -> String {
    let header = ["NODE", "ID", "SIZE", "MEDIA", "CLASS", "HEALTH", "USAGE", "FREE", "SLOTS", "VOLS", "REASON"];
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.node.clone(),
                r.id.clone(),
                if r.size_bytes == 0 { "-".into() } else { human_bytes(r.size_bytes) },
                r.media.clone(),
                r.class.clone(),
                r.health.clone(),
                r.usage.clone(),
                r.free_bytes.map(human_bytes).unwrap_or_else(|| "-".into()),
                r.free_slots.map(|n| n.to_string()).unwrap_or_else(|| "-".into()),
                if r.class == "managed" { r.volumes.to_string() } else { "-".into() },
                r.reason.clone(),
            ]
        })
        .collect();
    table(&header, &cells)
}

/// The volumes table: `ctl volumes`' columns with the node first and no paths; `wide`
/// adds the pods using each volume (before REASON, which is last as in `ctl`).
pub fn volumes_table(rows: &[VolumeRow], wide: bool) -> String {
    let mut header = vec!["NODE", "ID", "NAME", "DRIVE", "SIZE", "USED", "KIND", "STATE", "HEALTH", "REASON"];
    if wide {
        header.insert(9, "PODS");
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut row = vec![
                r.node.clone(),
                r.id.clone(),
                r.name.clone(),
                r.drive.clone(),
                human_bytes(r.size_bytes),
                used_words(r.used_bytes),
                r.kind.clone(),
                r.state.clone(),
                health_words(r.health == "abnormal").to_string(),
                r.reason.clone().unwrap_or_default(),
            ];
            if wide {
                row.insert(9, if r.pods.is_empty() { "-".into() } else { r.pods.join(",") });
            }
            row
        })
        .collect();
    table(&header, &cells)
}

/// The Drive object `target` names: `NODE/DRIVE` or an object name.
pub(crate) fn find<'a>(drives: &'a [Drive], target: &str) -> Result<&'a Drive, KubectlError> {
    let found = match target.split_once('/') {
        Some((node, id)) => drives.iter().find(|d| d.spec.node == node && d.spec.drive_id == id),
        None => drives.iter().find(|d| d.name_any() == target),
    };
    found.ok_or_else(|| {
        KubectlError::NotFound(format!(
            "no drive {target}: name it NODE/DRIVE as `kubectl drivelet drives` lists it (node, then id), or by its Drive object's name"
        ))
    })
}

/// Where an action stands after it was asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ActionOutcome {
    /// The drive, `NODE/DRIVE`.
    pub drive: String,
    /// The action asked.
    pub action: String,
    /// Whether the agent reports it complete.
    pub complete: bool,
    /// The agent's words (or that it has not answered yet).
    pub message: String,
}

/// A drive action a user asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// No new volumes; the volumes stay.
    Cordon,
    /// Lift a cordon (`spec.action: none`).
    Uncordon,
    /// No new volumes; released once its volumes are gone.
    Release,
    /// No new volumes; its volumes move to other drives of the node; released once
    /// they have.
    Evacuate,
    /// A drive owned elsewhere becomes its node's; `restore_claims`: a volume whose PV
    /// and claim are gone gets them back.
    Adopt {
        /// Recreate the claims that are gone.
        restore_claims: bool,
    },
}

impl Action {
    /// The word the user typed.
    pub fn word(self) -> &'static str {
        match self {
            Action::Cordon => "cordon",
            Action::Uncordon => "uncordon",
            Action::Release => "release",
            Action::Evacuate => "evacuate",
            Action::Adopt { .. } => "adopt",
        }
    }

    fn spec(self) -> DriveAction {
        match self {
            Action::Cordon => DriveAction::Cordon,
            Action::Uncordon => DriveAction::None,
            Action::Release => DriveAction::Release,
            Action::Evacuate => DriveAction::Evacuate,
            Action::Adopt { .. } => DriveAction::Adopt,
        }
    }
}

/// Whether asking `asked` of `drive` must first make a new generation of its spec: an
/// evacuation asked already whose moves failed is asked again (see the module rules).
pub(crate) fn ask_again(drive: &Drive, asked: Action) -> bool {
    let failed = drive
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == ACTION_COMPLETE))
        .is_some_and(|c| c.reason == EVACUATION_FAILED || c.reason == REFUSED);
    asked == Action::Evacuate && drive.spec.action == Some(DriveAction::Evacuate) && failed
}

/// Asks `action` of the drive `target` (a merge patch of `spec.action`), then, when
/// `wait` is given, waits that long for the node's agent to report it complete, telling
/// `progress` each new message of its condition.
pub async fn act(
    client: &Client,
    target: &str,
    asked: Action,
    wait: Option<Duration>,
    progress: &mut dyn FnMut(&str),
) -> Result<ActionOutcome, KubectlError> {
    let action = asked.spec();
    let drives = list(client, None).await?;
    let drive = find(&drives, target)?;
    let (name, shown) = (drive.name_any(), format!("{}/{}", drive.spec.node, drive.spec.drive_id));
    let api: Api<Drive> = Api::all(client.clone());
    let params = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
    if ask_again(drive, asked) {
        let none = json!({ "spec": { "action": DriveAction::None.as_str() } });
        api.patch(&name, &params, &Patch::Merge(&none))
            .await
            .map_err(|source| KubectlError::Api { what: format!("asking drive {shown} to {} again", asked.word()), source })?;
    }
    let patch = match asked {
        Action::Adopt { restore_claims } => {
            json!({ "spec": { "action": action.as_str(), "restoreClaims": if restore_claims { json!(true) } else { json!(null) } } })
        }
        _ => json!({ "spec": { "action": action.as_str() } }),
    };
    let patched = api
        .patch(&name, &params, &Patch::Merge(&patch))
        .await
        .map_err(|source| KubectlError::Api { what: format!("asking drive {shown} to {}", asked.word()), source })?;
    let generation = patched.metadata.generation.unwrap_or(0);
    let mut told = String::new();
    let deadline = wait.map(|w| tokio::time::Instant::now() + w);
    loop {
        let now = api.get(&name).await.map_err(|source| KubectlError::Api { what: format!("reading drive {shown}"), source })?;
        let c = now
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == ACTION_COMPLETE && c.observed_generation >= generation))
            .cloned();
        let outcome = ActionOutcome {
            drive: shown.clone(),
            action: asked.word().into(),
            complete: c.as_ref().is_some_and(|c| c.status == "True"),
            message: c.as_ref().map(|c| c.message.clone()).unwrap_or_else(|| format!("asked; node {} has not answered yet", now.spec.node)),
        };
        if let Some(c) = c.as_ref().filter(|c| c.reason == REFUSED) {
            return Err(KubectlError::Refused(c.message.clone()));
        }
        if wait.is_some() && outcome.message != told {
            told = outcome.message.clone();
            progress(&told);
        }
        if let Some(c) = c.as_ref().filter(|c| c.reason == EVACUATION_FAILED && wait.is_some()) {
            return Err(KubectlError::Refused(c.message.clone()));
        }
        match deadline {
            None => return Ok(outcome),
            Some(_) if outcome.complete => return Ok(outcome),
            Some(d) if tokio::time::Instant::now() >= d => {
                return Err(KubectlError::TimedOut(format!(
                    "drive {shown}: {} not complete after {} s: {}",
                    asked.word(),
                    wait.unwrap_or_default().as_secs(),
                    outcome.message
                )))
            }
            Some(_) => tokio::time::sleep(WAIT_POLL).await,
        }
    }
}

/// `value` printed as `format` asks: the table `table` makes, or JSON or YAML.
fn print_as<T: Serialize>(format: Format, value: &T, table: impl FnOnce() -> String) -> Result<(), CliError> {
    match format {
        Format::Table | Format::Wide => print!("{}", table()),
        Format::Json => println!("{}", super::json(value)?),
        Format::Yaml => print!("{}", serde_norway::to_string(value).map_err(CliError::Yaml)?),
    }
    Ok(())
}

/// `kubectl drivelet`: the subcommand's body, with its own exit codes
/// ([`KubectlError::exit_code`]).
pub fn run(args: KubectlArgs) -> ExitCode {
    let run = async {
        let client = client(args.kubeconfig.as_deref(), args.context).await?;
        let res = match args.cmd {
            KubectlCmd::Drives { node, output } => {
                let rows = drives(&client, node.as_deref()).await?;
                print_as(output, &rows, || drives_table(&rows))
            }
            KubectlCmd::Volumes { node, drive, output } => {
                let rows = volumes(&client, node.as_deref(), drive.as_deref()).await?;
                print_as(output, &rows, || volumes_table(&rows, output == Format::Wide))
            }
            KubectlCmd::Drive { cmd } => {
                let (action, a) = match cmd {
                    KubectlDriveCmd::Cordon(a) => (Action::Cordon, a),
                    KubectlDriveCmd::Uncordon(a) => (Action::Uncordon, a),
                    KubectlDriveCmd::Release(a) => (Action::Release, a),
                    KubectlDriveCmd::Evacuate(a) => (Action::Evacuate, a),
                    KubectlDriveCmd::Adopt { args, restore_claims } => (Action::Adopt { restore_claims }, args),
                };
                let (table, drive) = (matches!(a.output, Format::Table | Format::Wide), a.drive.clone());
                let mut progress = |m: &str| {
                    if table {
                        println!("drive {drive}: {m}");
                    }
                };
                let o = act(&client, &a.drive, action, a.wait, &mut progress).await?;
                let done = if o.complete { "done" } else { "asked" };
                print_as(a.output, &o, || format!("drive {}: {} {done}: {}\n", o.drive, o.action, o.message))
            }
        };
        Ok::<_, KubectlError>(res)
    };
    let rt = match super::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kubectl drivelet: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run) {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("kubectl drivelet: {}", super::chain(&e));
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("kubectl drivelet: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

#[cfg(test)]
mod tests;
