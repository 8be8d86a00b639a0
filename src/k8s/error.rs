//! The Kubernetes front's own error, [`KubeError`]: making the API client, and the volume
//! manager asked by a controller. API calls of one controller keep their module's enum
//! (`AttachError`, `ResizeError`, `EventsError`, `DrivesError`, `DutyError`), each variant
//! naming the object; this one is what they share, so no error here is a `String`.
//!
//! Rules:
//! - Every variant carries what it is about (the kubeconfig path, the volume id) and its
//!   source; the words are plain and the same the agent always printed.

use std::path::PathBuf;

use crate::actors::volumes::VolumeError;

/// Why the front could not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// `[kubernetes]` names no kubeconfig and there is no in-cluster service account.
    #[error("no in-cluster service account and no kubeconfig: {source}")]
    NoConfig {
        /// Why neither was found.
        source: kube::config::InferConfigError,
    },
    /// The kubeconfig named cannot be read.
    #[error("cannot read kubernetes.kubeconfig {}: {source}", path.display())]
    ReadKubeconfig {
        /// `kubernetes.kubeconfig`.
        path: PathBuf,
        /// Why.
        source: kube::config::KubeconfigError,
    },
    /// The kubeconfig named is read but not usable.
    #[error("kubernetes.kubeconfig {}: {source}", path.display())]
    Kubeconfig {
        /// `kubernetes.kubeconfig`.
        path: PathBuf,
        /// Why.
        source: kube::config::KubeconfigError,
    },
    /// The client could not be built from a good configuration.
    #[error("cannot build the Kubernetes client: {source}")]
    Client {
        /// Why.
        source: kube::Error,
    },
    /// The volume manager did not answer a question about a volume (it is restarting).
    #[error("the volume manager did not answer: {source}")]
    Unanswered {
        /// The volume asked about.
        volume_id: String,
        /// The mailbox error.
        source: actix::MailboxError,
    },
    /// The volume manager refused or failed a call about a volume.
    #[error("{source}")]
    Volume {
        /// The volume.
        volume_id: String,
        /// Its error, whose words name the volume.
        source: VolumeError,
    },
}

impl KubeError {
    /// The volume manager did not answer about `volume_id`.
    pub(crate) fn unanswered(volume_id: &str) -> impl FnOnce(actix::MailboxError) -> KubeError + '_ {
        move |source| KubeError::Unanswered { volume_id: volume_id.to_string(), source }
    }

    /// The volume manager refused a call about `volume_id`.
    pub(crate) fn volume(volume_id: &str) -> impl FnOnce(VolumeError) -> KubeError + '_ {
        move |source| KubeError::Volume { volume_id: volume_id.to_string(), source }
    }
}
