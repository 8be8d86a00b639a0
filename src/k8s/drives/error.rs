//! The errors of a sync of the `Drive` objects.

use actix::MailboxError;

/// Errors of a sync.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DrivesError {
    /// Listing this node's objects failed.
    #[error("listing the Drive objects of node {node}: {source}")]
    List {
        /// This node.
        node: String,
        /// The API error.
        source: kube::Error,
    },
    /// Applying an object (spec and labels) failed.
    #[error("applying Drive {name}: {source}")]
    Apply {
        /// The object.
        name: String,
        /// The API error.
        source: kube::Error,
    },
    /// Applying an object's status failed.
    #[error("applying the status of Drive {name}: {source}")]
    ApplyStatus {
        /// The object.
        name: String,
        /// The API error.
        source: kube::Error,
    },
    /// Deleting a stale object failed.
    #[error("deleting Drive {name}: {source}")]
    Delete {
        /// The object.
        name: String,
        /// The API error.
        source: kube::Error,
    },
    /// A query to another actor got no answer.
    #[error("asking the {actor} for {what}: {source}")]
    Ask {
        /// The actor asked.
        actor: &'static str,
        /// What was asked.
        what: &'static str,
        /// Why there was no answer.
        source: MailboxError,
    },
}
