//! The one place where domain errors become `tonic::Status` codes (CSI spec tables).
//!
//! Rules: the message is the whole error chain in plain words and names the object;
//! client input is repeated in it only through [`echo`] (quoted, at most 64
//! characters); errors are logged once, here at the boundary, by the handler's
//! `instrument(err)`.

use tonic::{Code, Status};

use crate::actors::volumes::VolumeError;

/// Errors the CSI front can return, each mapped to one gRPC code.
#[derive(Debug, thiserror::Error)]
pub enum FrontError {
    /// A required field is missing or malformed, or a capability is unsupported.
    #[error("{0}")]
    InvalidArgument(String),
    /// An actor behind the front did not answer (it is restarting or stopped).
    #[error("{actor} is not answering ({reason}); retry shortly")]
    Unavailable {
        /// Which actor.
        actor: &'static str,
        /// The mailbox error.
        reason: String,
    },
}

impl FrontError {
    /// A mailbox error from `actor`.
    pub fn mailbox(actor: &'static str) -> impl FnOnce(actix::MailboxError) -> FrontError {
        move |e| FrontError::Unavailable { actor, reason: e.to_string() }
    }
}

/// Longest piece of client input an error message repeats.
const MAX_ECHO: usize = 64;

/// A piece of client input as an error message shows it: quoted and escaped, cut to
/// [`MAX_ECHO`] characters with the full length said, so that hostile input (a 1 MiB
/// parameter) never makes a reply too large to read or a log line of a megabyte.
pub fn echo(input: &str) -> String {
    if input.chars().count() <= MAX_ECHO {
        return format!("{input:?}");
    }
    let head: String = input.chars().take(MAX_ECHO).collect();
    format!("{head:?}... ({} bytes)", input.len())
}

impl From<VolumeError> for Status {
    fn from(e: VolumeError) -> Status {
        let code = match &e {
            VolumeError::NotFound { .. } | VolumeError::PathNotFound { .. } => Code::NotFound,
            VolumeError::InvalidArgument { .. } => Code::InvalidArgument,
            VolumeError::AlreadyExists { .. } => Code::AlreadyExists,
            VolumeError::ResourceExhausted { .. } => Code::ResourceExhausted,
            VolumeError::OutOfRange { .. } => Code::OutOfRange,
            VolumeError::FailedPrecondition { .. } => Code::FailedPrecondition,
            VolumeError::Aborted { .. } => Code::Aborted,
            VolumeError::NotReady => Code::Unavailable,
            // The drive holds data drivelet did not write: a fact about the drive, not a
            // fault of drivelet's (CreateVolume goes on to another drive instead).
            VolumeError::Disk { source: crate::disk::DiskError::Foreign { .. }, .. } => Code::FailedPrecondition,
            VolumeError::Disk { .. } | VolumeError::Store(_) => Code::Internal,
        };
        Status::new(code, e.to_string())
    }
}

impl From<FrontError> for Status {
    fn from(e: FrontError) -> Status {
        let code = match &e {
            FrontError::InvalidArgument(_) => Code::InvalidArgument,
            FrontError::Unavailable { .. } => Code::Unavailable,
        };
        Status::new(code, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_maps_to_its_csi_code_with_a_plain_message() {
        let table: Vec<(FrontError, Code, &str)> = vec![
            (FrontError::InvalidArgument("parameter \"media\" must be one of".into()), Code::InvalidArgument, "media"),
            (
                FrontError::Unavailable { actor: "inventory", reason: "Mailbox has closed".into() },
                Code::Unavailable,
                "inventory is not answering",
            ),
        ];
        for (err, code, text) in table {
            let s: Status = err.into();
            assert_eq!(s.code(), code);
            assert!(s.message().contains(text), "{}", s.message());
        }
    }

    #[test]
    fn echoed_input_is_quoted_and_cut() {
        assert_eq!(echo("ssd"), "\"ssd\"");
        assert_eq!(echo("a\0b"), "\"a\\0b\"");
        let long = echo(&"v".repeat(1 << 20));
        assert!(long.len() < 100 && long.ends_with("... (1048576 bytes)"), "{long}");
    }

    #[test]
    fn each_volume_error_maps_to_its_csi_code() {
        let id = || "v1".to_string();
        let table: Vec<(VolumeError, Code, &str)> = vec![
            (VolumeError::NotFound { volume_id: id() }, Code::NotFound, "volume v1 does not exist"),
            (VolumeError::InvalidArgument { reason: "path x is not absolute".into() }, Code::InvalidArgument, "not absolute"),
            (VolumeError::AlreadyExists { volume: "pvc-1".into(), reason: "exists with 5 bytes".into() }, Code::AlreadyExists, "pvc-1"),
            (VolumeError::ResourceExhausted { reason: "no managed drive".into() }, Code::ResourceExhausted, "no managed drive"),
            (VolumeError::OutOfRange { reason: "too big".into() }, Code::OutOfRange, "too big"),
            (VolumeError::FailedPrecondition { volume_id: id(), reason: "is still staged".into() }, Code::FailedPrecondition, "v1 is still staged"),
            (VolumeError::Aborted { volume_id: id() }, Code::Aborted, "in progress"),
            (VolumeError::NotReady, Code::Unavailable, "starting"),
            (
                VolumeError::Disk {
                    volume_id: id(),
                    op: "make the filesystem",
                    source: crate::disk::DiskError::Tool { tool: "mkfs.ext4".into(), message: "exit 1".into() },
                },
                Code::Internal,
                "cannot make the filesystem: mkfs.ext4 failed",
            ),
            (
                VolumeError::Disk {
                    volume_id: id(),
                    op: "update the partition table",
                    source: crate::disk::DiskError::Foreign {
                        device: "/dev/sdb".into(),
                        found: "a Linux RAID member (md superblock 1.0) beside a drivelet GPT".into(),
                    },
                },
                Code::FailedPrecondition,
                "refusing to write to it: a Linux RAID member",
            ),
        ];
        for (err, code, text) in table {
            let s: Status = err.into();
            assert_eq!(s.code(), code, "{}", s.message());
            assert!(s.message().contains(text), "{}", s.message());
        }
    }
}
