//! Plain functions over the operating system: udev and sysfs, mounts, GPT layout,
//! loop devices. Nothing here knows about actors or CSI, and nothing here holds state.

pub mod gpt;
pub mod loopdev;
pub mod mounts;
pub mod udev;

/// Errors from talking to the OS about disks.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// A libudev call failed.
    #[error("udev: {what}: {source}")]
    Udev {
        /// What was being done.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file or device operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, naming the path.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// An external tool failed.
    #[error("{tool} failed: {message}")]
    Tool {
        /// The command, e.g. `losetup`.
        tool: String,
        /// Its exit status and stderr.
        message: String,
    },
}

impl DiskError {
    pub(crate) fn udev(what: &'static str) -> impl FnOnce(std::io::Error) -> DiskError {
        move |source| DiskError::Udev { what: what.to_string(), source }
    }

    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> DiskError {
        let what = what.into();
        move |source| DiskError::Io { what, source }
    }
}
