//! The VolumeManager as this front's controllers ask it: one handle,
//! [`ManagerBackend`], for which each controller implements its own backend trait
//! (`attach::AttachBackend`, `resize::ResizeBackend`, `duties::returned::RemovedBackend`)
//! in its own `backend.rs`. It is the front's only link to the volume side: messages,
//! never a call into the actor's state.
//!
//! Rules:
//! - Readiness ([`Ready`]) is asked again every [`READY_RETRY`] until the volume manager's
//!   start-up reconciliation is done; a volume manager that does not answer (restarting)
//!   counts as not ready.

use std::time::Duration;

use actix::Addr;

use crate::actors::volumes::{VolumeManager, WaitReady};
use crate::k8s::shell::Ready;

/// How long to wait before asking the volume manager for its readiness again.
pub(crate) const READY_RETRY: Duration = Duration::from_secs(1);

/// The volume side of a running agent: the VolumeManager actor, asked by message.
#[derive(Clone)]
pub(crate) struct ManagerBackend {
    volumes: Addr<VolumeManager>,
}

impl ManagerBackend {
    /// Asks `volumes`.
    pub(crate) fn new(volumes: Addr<VolumeManager>) -> Self {
        Self { volumes }
    }

    /// The actor, for the backends' messages.
    pub(crate) fn volumes(&self) -> &Addr<VolumeManager> {
        &self.volumes
    }
}

impl Ready for ManagerBackend {
    async fn wait_ready(&self) {
        while !matches!(self.volumes.send(WaitReady).await, Ok(true)) {
            tokio::time::sleep(READY_RETRY).await;
        }
    }
}
