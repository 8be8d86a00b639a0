//! Loop devices over sparse files, for the demo and for tests: create, attach, find,
//! detach. Uses util-linux `losetup`, which speaks the loop-control ioctls.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::DiskError;

fn run(cmd: &mut Command) -> Result<String, DiskError> {
    let out = cmd.output().map_err(DiskError::io("run losetup"))?;
    if !out.status.success() {
        return Err(DiskError::Tool {
            tool: "losetup".into(),
            message: format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim()),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Creates `file` as a sparse file of `size` bytes if it does not exist yet.
/// An existing file keeps its contents; it is grown (never shrunk) to `size`.
pub(crate) fn ensure_sparse_file(file: &Path, size: u64) -> Result<(), DiskError> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(file)
        .map_err(DiskError::io(format!("create {}", file.display())))?;
    let len = f.metadata().map_err(DiskError::io(format!("stat {}", file.display())))?.len();
    if len < size {
        f.set_len(size).map_err(DiskError::io(format!("size {}", file.display())))?;
    }
    Ok(())
}

/// Loop devices currently backed by `file`.
pub(crate) fn find(file: &Path) -> Result<Vec<PathBuf>, DiskError> {
    let out = run(Command::new("losetup").arg("--associated").arg(file).arg("--noheadings").arg("--output").arg("NAME"))
        .or_else(|_| run(Command::new("losetup").arg("-j").arg(file)))?;
    Ok(out
        .lines()
        .filter_map(|l| l.split(':').next())
        .map(|s| PathBuf::from(s.trim()))
        .filter(|p| !p.as_os_str().is_empty())
        .collect())
}

/// Attaches `file` to a free loop device and returns its path; reuses an existing
/// attachment of the same file.
pub(crate) fn attach(file: &Path) -> Result<PathBuf, DiskError> {
    if let Some(existing) = find(file)?.into_iter().next() {
        return Ok(existing);
    }
    run(Command::new("losetup").arg("--find").arg("--show").arg("--partscan").arg(file)).map(PathBuf::from)
}

/// Detaches a loop device.
pub(crate) fn detach(dev: &Path) -> Result<(), DiskError> {
    run(Command::new("losetup").arg("--detach").arg(dev)).map(|_| ())
}
