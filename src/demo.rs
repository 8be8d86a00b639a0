//! Demo drives: sparse files attached as loop devices at start and detached at stop,
//! so drivelet can run on a machine with no spare disks.
//!
//! Rules: only files under `demo.dir` are created or attached; an existing file is
//! reused with its data; at stop, only the loop devices this run attached are
//! detached, and the files are removed only with `demo.remove_files_on_stop`; then the
//! volume store goes with them, so the next start's store matches its blank drives
//! (after a crash the files stay, with their data, and so does the store).

use std::path::PathBuf;

use tracing::{info, warn};

use crate::config::DemoConfig;
use crate::disk::{loopdev, DiskError};

/// The demo drives of this run.
pub struct Demo {
    cfg: DemoConfig,
    /// The agent's state directory (the volume store).
    state_dir: PathBuf,
    attached: Vec<(PathBuf, PathBuf)>,
}

impl Demo {
    /// Creates the backing files and attaches them; waits for udev to process them.
    pub fn setup(cfg: &DemoConfig, state_dir: &std::path::Path) -> Result<Demo, DiskError> {
        std::fs::create_dir_all(&cfg.dir).map_err(DiskError::io(format!("create {}", cfg.dir.display())))?;
        let mut demo = Demo { cfg: cfg.clone(), state_dir: state_dir.to_path_buf(), attached: Vec::new() };
        for i in 0..cfg.drives {
            let file = cfg.dir.join(format!("drive-{i}.img"));
            loopdev::ensure_sparse_file(&file, cfg.size)?;
            let dev = match loopdev::attach(&file) {
                Ok(d) => d,
                Err(e) => {
                    demo.teardown();
                    return Err(e);
                }
            };
            info!(drive.path = %dev.display(), demo.file = %file.display(), "demo drive attached");
            demo.attached.push((dev, file));
        }
        // Let udev probe the new devices so the first scan classifies them.
        let _ = std::process::Command::new("udevadm").args(["settle", "--timeout=10"]).status();
        Ok(demo)
    }

    /// Detaches the loop devices (and removes the files if configured).
    pub fn teardown(&mut self) {
        let removing = self.cfg.remove_files_on_stop && !self.attached.is_empty();
        for (dev, file) in self.attached.drain(..) {
            match loopdev::detach(&dev) {
                Ok(()) => info!(drive.path = %dev.display(), "demo drive detached"),
                Err(e) => warn!(drive.path = %dev.display(), error = %e, "cannot detach demo drive"),
            }
            if self.cfg.remove_files_on_stop {
                if let Err(e) = std::fs::remove_file(&file) {
                    warn!(demo.file = %file.display(), error = %e, "cannot remove demo file");
                }
            }
        }
        if removing {
            let store = crate::store::Store::path_in(&self.state_dir);
            match std::fs::remove_file(&store) {
                Ok(()) => info!(store.path = %store.display(), "demo drives removed, and the volume store with them"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => warn!(store.path = %store.display(), error = %e, "cannot remove the volume store"),
            }
        }
    }
}
