//! `drivelet ctl`: the admin client. Talks to a running agent over its admin socket
//! and renders answers as a table or JSON; [`run`] is the subcommand's body.

use std::path::{Path, PathBuf};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use super::args::{CtlCmd, DriveCmd, Output};
use super::CliError;
use crate::actors::volumes::model::VolumeRecord;
use crate::actors::volumes::VolumeDetail;

use crate::config::human_bytes;
use crate::grpc::admin::{AdminRequest, AdminResponse, DriveView};
use crate::words::DriveUse;

/// Errors talking to the agent.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    /// The socket could not be reached.
    #[error("cannot reach drivelet at {path}: {source} (is `drivelet run` running, and are you root?)")]
    Connect {
        /// Admin socket path.
        path: String,
        /// OS error.
        source: std::io::Error,
    },
    /// The exchange failed.
    #[error("admin socket: {0}")]
    Io(#[from] std::io::Error),
    /// The agent answered with an error or something unexpected.
    #[error("drivelet answered: {0}")]
    Agent(String),
}

/// Sends one request and reads one answer.
pub async fn request(socket: &Path, req: &AdminRequest) -> Result<AdminResponse, CtlError> {
    let stream = UnixStream::connect(socket)
        .await
        .map_err(|source| CtlError::Connect { path: socket.display().to_string(), source })?;
    let (r, mut w) = stream.into_split();
    let mut line = serde_json::to_vec(req).map_err(|e| CtlError::Agent(e.to_string()))?;
    line.push(b'\n');
    w.write_all(&line).await?;
    let mut answer = String::new();
    BufReader::new(r).read_line(&mut answer).await?;
    serde_json::from_str(&answer).map_err(|e| CtlError::Agent(format!("unreadable answer: {e}")))
}

/// Asks the agent to release a drive.
pub async fn release(socket: &Path, drive_id: &str, force: bool) -> Result<DriveUse, CtlError> {
    match request(socket, &AdminRequest::ReleaseDrive { drive_id: drive_id.to_string(), force }).await? {
        AdminResponse::Released(u) => Ok(u),
        AdminResponse::Error(e) => Err(CtlError::Agent(e)),
        other => Err(CtlError::Agent(format!("unexpected answer {other:?}"))),
    }
}

/// Asks the agent to cordon (`true`) or uncordon a drive; answers its usage from then
/// on (`None`: active).
pub async fn cordon(socket: &Path, drive_id: &str, cordon: bool) -> Result<Option<DriveUse>, CtlError> {
    match request(socket, &AdminRequest::CordonDrive { drive_id: drive_id.to_string(), cordon }).await? {
        AdminResponse::Cordoned(u) => Ok(u),
        AdminResponse::Error(e) => Err(CtlError::Agent(e)),
        other => Err(CtlError::Agent(format!("unexpected answer {other:?}"))),
    }
}

/// Asks the agent to adopt a drive owned elsewhere.
pub async fn adopt_drive(socket: &Path, drive_id: &str) -> Result<crate::actors::messages::Adopted, CtlError> {
    match request(socket, &AdminRequest::AdoptDrive { drive_id: drive_id.to_string() }).await? {
        AdminResponse::DriveAdopted(a) => Ok(a),
        AdminResponse::Error(e) => Err(CtlError::Agent(e)),
        other => Err(CtlError::Agent(format!("unexpected answer {other:?}"))),
    }
}

/// What an adoption did, in a line or a few.
pub fn adopted_words(a: &crate::actors::messages::Adopted) -> String {
    if a.already {
        return format!("drive {}: this node's already; nothing written\n", a.drive_id);
    }
    let mut out = format!("drive {}: adopted from {}; this node owns it now and serves its volumes\n", a.drive_id, a.from);
    for v in &a.volumes {
        let claim = v.claim.as_deref().map(|c| format!(" of claim {c}")).unwrap_or_default();
        out.push_str(&format!("  volume {} ({}){claim}\n", v.id, crate::config::human_bytes(v.size_bytes)));
    }
    out
}

/// Asks the agent to evacuate a drive; answers where the evacuation stands.
pub async fn evacuate(socket: &Path, drive_id: &str, force: bool) -> Result<crate::actors::volumes::Evacuation, CtlError> {
    match request(socket, &AdminRequest::EvacuateDrive { drive_id: drive_id.to_string(), force }).await? {
        AdminResponse::Evacuation(e) => Ok(e),
        AdminResponse::Error(e) => Err(CtlError::Agent(e)),
        other => Err(CtlError::Agent(format!("unexpected answer {other:?}"))),
    }
}

/// Fetches where every evacuation stands.
pub async fn evacuations(socket: &Path) -> Result<Vec<crate::actors::volumes::Evacuation>, CtlError> {
    match request(socket, &AdminRequest::Evacuations).await? {
        AdminResponse::Evacuations(e) => Ok(e),
        AdminResponse::Error(e) => Err(CtlError::Agent(e)),
        other => Err(CtlError::Agent(format!("unexpected answer {other:?}"))),
    }
}

/// Renders evacuations: one line per drive in words, then a row per volume moved or
/// still on it.
pub fn evacuations_table(list: &[crate::actors::volumes::Evacuation]) -> String {
    let header = ["DRIVE", "VOLUME", "NAME", "STATE", "WHERE / WHY"];
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut lines = String::new();
    for e in list {
        lines += &format!("drive {}: {}\n", e.drive_id, e.words());
        for m in &e.moved {
            let mut to = format!("on drive {} ({} copied and verified)", m.to_drive, human_bytes(m.bytes));
            if !m.unreadable.is_empty() {
                to += &format!("; unreadable, zeros now: {}", crate::disk::mover::ranges_words(&m.unreadable));
            }
            rows.push(vec![e.drive_id.clone(), m.volume_id.clone(), m.name.clone(), "moved".into(), to]);
        }
        for p in &e.pending {
            rows.push(vec![e.drive_id.clone(), p.volume_id.clone(), p.name.clone(), p.state.as_str().into(), p.reason.clone()]);
        }
    }
    if list.is_empty() {
        return "no evacuation asked for on this node\n".into();
    }
    lines + &table(&header, &rows)
}

/// Asks the agent to adopt a migrated volume (an `AdminRequest::Adopt`).
pub async fn adopt(socket: &Path, req: &AdminRequest) -> Result<VolumeRecord, CtlError> {
    match request(socket, req).await? {
        AdminResponse::Adopted(r) => Ok(*r),
        AdminResponse::Error(e) => Err(CtlError::Agent(e)),
        other => Err(CtlError::Agent(format!("unexpected answer {other:?}"))),
    }
}

/// Fetches the drive list.
pub async fn drives(socket: &Path) -> Result<Vec<DriveView>, CtlError> {
    match request(socket, &AdminRequest::Drives).await? {
        AdminResponse::Drives(d) => Ok(d),
        AdminResponse::Error(e) => Err(CtlError::Agent(e)),
        other => Err(CtlError::Agent(format!("unexpected answer {other:?}"))),
    }
}

/// Fetches the volume list.
pub async fn volumes(socket: &Path) -> Result<Vec<VolumeRecord>, CtlError> {
    match request(socket, &AdminRequest::Volumes).await? {
        AdminResponse::Volumes(v) => Ok(v),
        AdminResponse::Error(e) => Err(CtlError::Agent(e)),
        other => Err(CtlError::Agent(format!("unexpected answer {other:?}"))),
    }
}

/// Fetches the volumes as an admin's listing shows them (used bytes, health).
pub async fn volume_details(socket: &Path) -> Result<Vec<VolumeDetail>, CtlError> {
    match request(socket, &AdminRequest::VolumeDetails).await? {
        AdminResponse::VolumeDetails(v) => Ok(v),
        AdminResponse::Error(e) => Err(CtlError::Agent(e)),
        other => Err(CtlError::Agent(format!("unexpected answer {other:?}"))),
    }
}

/// Fetches the snapshot list.
pub async fn snapshots(socket: &Path) -> Result<Vec<crate::actors::volumes::snapshot::SnapshotRecord>, CtlError> {
    match request(socket, &AdminRequest::Snapshots).await? {
        AdminResponse::Snapshots(s) => Ok(s),
        AdminResponse::Error(e) => Err(CtlError::Agent(e)),
        other => Err(CtlError::Agent(format!("unexpected answer {other:?}"))),
    }
}

/// Renders snapshots as an aligned table: SIZE is the data it holds (the smallest
/// restore), ON DRIVE what it takes there.
pub fn snapshots_table(snaps: &[crate::actors::volumes::snapshot::SnapshotRecord]) -> String {
    let header = ["ID", "NAME", "SOURCE VOLUME", "DRIVE", "SIZE", "ON DRIVE", "KIND", "STATE", "TAKEN", "WHY"];
    let rows: Vec<Vec<String>> = snaps
        .iter()
        .map(|s| {
            let kind = if s.block { "block".to_string() } else if s.fs_type.is_empty() { "fs (empty)".to_string() } else { s.fs_type.clone() };
            let secs = s.created_unix_nanos.div_euclid(1_000_000_000);
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
            let taken = i64::try_from(now).map(|now| format!("{} ago", human_age(now - secs))).unwrap_or_default();
            vec![
                s.id.clone(),
                s.name.clone(),
                s.source_volume_id.clone(),
                s.drive_id.clone(),
                human_bytes(s.restore_size),
                human_bytes(s.size),
                kind,
                s.state.as_str().to_string(),
                taken,
                s.unusable.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    table(&header, &rows)
}

/// An age in the largest whole unit: 40s, 5m, 3h, 2d.
fn human_age(secs: i64) -> String {
    match secs.max(0) {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}


/// The USED column: the bytes a staged filesystem uses, else `-`.
pub(crate) fn used_words(used: Option<u64>) -> String {
    used.map(human_bytes).unwrap_or_else(|| "-".into())
}

/// The HEALTH column: `normal` or `abnormal`.
pub(crate) fn health_words(abnormal: bool) -> &'static str {
    if abnormal { "abnormal" } else { "normal" }
}

/// Renders volumes as an aligned table, with their used bytes and health from
/// `details` (`ctl volumes`; `kubectl drivelet volumes` shows the same columns from the
/// Drive objects, with the node first and without the paths).
pub fn volumes_table(vols: &[VolumeRecord], details: &[VolumeDetail]) -> String {
    let header = ["ID", "NAME", "DRIVE", "SIZE", "USED", "KIND", "STATE", "HEALTH", "STAGED AT", "PUBLISHED AT", "REASON"];
    let rows: Vec<Vec<String>> = vols
        .iter()
        .map(|v| {
            let d = details.iter().find(|d| d.id == v.id);
            vec![
                v.id.clone(),
                v.name.clone(),
                v.drive_id.clone(),
                human_bytes(v.size),
                used_words(d.and_then(|d| d.used_bytes)),
                crate::actors::volumes::volume_kind(v),
                crate::actors::volumes::volume_state(v),
                d.map_or("-", |d| health_words(d.abnormal)).to_string(),
                v.staging.as_ref().map(|s| s.path.display().to_string()).unwrap_or_else(|| "-".into()),
                if v.targets.is_empty() {
                    "-".into()
                } else {
                    v.targets.keys().map(|t| t.display().to_string()).collect::<Vec<_>>().join(",")
                },
                d.and_then(|d| d.reason.clone()).unwrap_or_default(),
            ]
        })
        .collect();
    table(&header, &rows)
}

/// The REASON column of a drive, as `ctl drives` and `kubectl drivelet drives` print it:
/// its class reason and, for a managed drive, its health when checked and not good
/// (`health_note`), why it is not active, and the space being cleaned.
pub(crate) fn drive_reason(
    class_reason: &str,
    managed: bool,
    health_note: Option<&str>,
    usage: &str,
    usage_reason: &str,
    cleaning: Option<&str>,
) -> String {
    let mut reason = class_reason.to_string();
    if managed {
        if let Some(h) = health_note {
            reason = format!("{reason}; health: {h}");
        }
        if !usage_reason.is_empty() {
            reason = format!("{reason}; {usage}: {usage_reason}");
        }
        if let Some(c) = cleaning {
            reason = format!("{reason}; {c} (zeroed before reuse, not free until then)");
        }
    }
    reason
}

/// An aligned table of `rows` under `header`, two spaces between columns.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let fmt = |cells: Vec<&str>| {
        let mut line = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                line.push_str(c);
            } else {
                line.push_str(&format!("{c:<w$}  ", w = widths[i]));
            }
        }
        line.trim_end().to_string() + "\n"
    };
    let mut out = fmt(header.to_vec());
    for r in rows {
        out += &fmt(r.iter().map(String::as_str).collect());
    }
    out
}

/// Renders drives as an aligned table.
pub fn drives_table(drives: &[DriveView]) -> String {
    let header = ["ID", "PATH", "SIZE", "MEDIA", "CLASS", "HEALTH", "USAGE", "FREE", "SLOTS", "VOLS", "REASON"];
    let rows: Vec<Vec<String>> = drives
        .iter()
        .map(|v| {
            let d = &v.drive;
            let checked = !matches!(d.health.health, crate::words::Health::Good) && d.health.checked_unix != 0;
            let reason = drive_reason(
                &d.reason,
                d.class == crate::words::DriveClass::Managed,
                checked.then_some(d.health.reason.as_str()),
                &v.usage,
                &v.usage_reason,
                v.cleaning.as_ref().map(|c| c.words()).as_deref(),
            );
            vec![
                d.id.clone(),
                d.path.display().to_string(),
                human_bytes(d.size_bytes),
                d.media.as_str().to_string(),
                d.class.as_str().to_string(),
                d.health.health.as_str().to_string(),
                v.usage.clone(),
                if d.class == crate::words::DriveClass::Managed {
                    human_bytes(d.free_bytes.saturating_sub(v.cleaning.as_ref().map_or(0, |c| c.left_bytes)))
                } else {
                    "-".into()
                },
                // Slots free in its partition table: a volume takes one whatever its size.
                if d.class == crate::words::DriveClass::Managed { d.slots_free.to_string() } else { "-".into() },
                // Partitions on a drive drivelet does not manage are not its
                // volumes (another node's, seen through a shared backing store).
                if d.class == crate::words::DriveClass::Managed { d.volumes.to_string() } else { "-".into() },
                reason,
            ]
        })
        .collect();
    table(&header, &rows)
}

/// `drivelet ctl`: asks the agent at `socket` (else the config's admin socket) and
/// prints its answer.
pub fn run(config: Option<PathBuf>, socket: Option<PathBuf>, cmd: CtlCmd) -> Result<(), CliError> {
    if let CtlCmd::Migrate { file, from_cluster, apply } = cmd {
        let source = match (file, from_cluster) {
            (Some(f), None) => Some(super::migrate::Source::File(f)),
            (None, Some(name)) => Some(super::migrate::Source::Cluster(name)),
            _ => None,
        };
        return Ok(super::migrate::run(config.as_deref(), socket, source, apply)?);
    }
    let socket = match socket {
        Some(s) => s,
        None => crate::config::Config::load(config.as_deref())?.paths.admin_socket,
    };
    let rt = super::runtime()?;
    let print_use = |u: &DriveUse| println!("drive {}: {} ({})", u.drive_id, u.state.as_str(), u.reason);
    match cmd {
        CtlCmd::Drives { output } => {
            let drives = rt.block_on(drives(&socket))?;
            match output {
                Output::Json => println!("{}", super::json(&drives)?),
                Output::Table => print!("{}", drives_table(&drives)),
            }
        }
        CtlCmd::Drive { cmd: DriveCmd::Release { id, force } } => print_use(&rt.block_on(release(&socket, &id, force))?),
        CtlCmd::Drive { cmd: DriveCmd::Adopt { id } } => print!("{}", adopted_words(&rt.block_on(adopt_drive(&socket, &id))?)),
        CtlCmd::Drive { cmd: DriveCmd::Evacuate { id, force } } => {
            let e = rt.block_on(evacuate(&socket, &id, force))?;
            print!("{}", evacuations_table(std::slice::from_ref(&e)));
        }
        CtlCmd::Evacuations { output } => {
            let list = rt.block_on(evacuations(&socket))?;
            match output {
                Output::Json => println!("{}", super::json(&list)?),
                Output::Table => print!("{}", evacuations_table(&list)),
            }
        }
        CtlCmd::Drive { cmd: cordon @ (DriveCmd::Cordon { .. } | DriveCmd::Uncordon { .. }) } => {
            let (id, on) = match cordon {
                DriveCmd::Cordon { id } => (id, true),
                DriveCmd::Uncordon { id } | DriveCmd::Release { id, .. } | DriveCmd::Evacuate { id, .. } | DriveCmd::Adopt { id } => (id, false),
            };
            match rt.block_on(self::cordon(&socket, &id, on))? {
                Some(u) => print_use(&u),
                None => println!("drive {id}: active"),
            }
        }
        CtlCmd::Volumes { output } => {
            let vols = rt.block_on(volumes(&socket))?;
            match output {
                Output::Json => println!("{}", super::json(&vols)?),
                Output::Table => {
                    let details = rt.block_on(volume_details(&socket))?;
                    print!("{}", volumes_table(&vols, &details))
                }
            }
        }
        CtlCmd::Snapshots { output } => {
            let snaps = rt.block_on(snapshots(&socket))?;
            match output {
                Output::Json => println!("{}", super::json(&snaps)?),
                Output::Table => print!("{}", snapshots_table(&snaps)),
            }
        }
        CtlCmd::Migrate { .. } => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_human() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(2 << 30), "2.0 GiB");
        assert_eq!(human_bytes(1536 << 20), "1.5 GiB");
    }
}
