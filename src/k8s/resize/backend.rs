//! The volume side of resizing: [`ResizeBackend`], what the resize controller asks of
//! the volume manager, and [`ManagerBackend`], the one of a running agent, which asks the
//! VolumeManager actor by message (`GetVolume`, `ExpandVolume`, `WaitReady`).
//!
//! Rules:
//! - How a refusal counts for the claim's status is decided from the volume manager's
//!   error variant ([`failure_of`]), never from its words.
//! - Readiness is asked again every [`READY_RETRY`] until the volume manager's start-up
//!   reconciliation is done.

use std::future::Future;
use std::time::Duration;

use actix::Addr;

use super::Failure;
use crate::actors::volumes::model::CapacityRange;
use crate::actors::volumes::{ExpandVolume, GetVolume, VolumeError, VolumeManager, WaitReady};

/// How long to wait before asking the volume manager for its readiness again.
pub(crate) const READY_RETRY: Duration = Duration::from_secs(1);

/// The volume side of resizing.
pub(crate) trait ResizeBackend: Clone + Unpin + 'static {
    /// Whether the volume manager knows the volume; `Err` when it cannot tell now.
    fn known(&self, volume_id: &str) -> impl Future<Output = Result<bool, String>> + Send;
    /// ControllerExpandVolume to at least `bytes`: the size now and whether the node must
    /// grow a filesystem, or how it failed and why in plain words.
    fn expand(&self, volume_id: &str, bytes: u64) -> impl Future<Output = Result<(u64, bool), (Failure, String)>> + Send;
    /// Resolves once the volume side is ready (start-up done).
    fn wait_ready(&self) -> impl Future<Output = ()> + Send;
}

/// The backend of a running agent: the VolumeManager actor.
#[derive(Clone)]
pub(crate) struct ManagerBackend {
    volumes: Addr<VolumeManager>,
}

impl ManagerBackend {
    /// Asks `volumes`.
    pub(crate) fn new(volumes: Addr<VolumeManager>) -> Self {
        Self { volumes }
    }
}

/// How an expansion refusal counts for the claim's status (see the module rules of
/// [`super`]): the codes external-resizer takes as infeasible, final or transient.
pub(crate) fn failure_of(e: &VolumeError) -> Failure {
    match e {
        VolumeError::OutOfRange { .. } | VolumeError::NotFound { .. } | VolumeError::InvalidArgument { .. } => Failure::Infeasible,
        VolumeError::ResourceExhausted { .. } | VolumeError::Busy { .. } | VolumeError::NotReady => Failure::Transient,
        _ => Failure::Final,
    }
}

impl ResizeBackend for ManagerBackend {
    async fn known(&self, volume_id: &str) -> Result<bool, String> {
        match self.volumes.send(GetVolume { volume_id: volume_id.to_string() }).await {
            Ok(Ok(_)) => Ok(true),
            Ok(Err(VolumeError::NotFound { .. })) => Ok(false),
            Ok(Err(e)) => Err(e.to_string()),
            Err(e) => Err(format!("the volume manager did not answer: {e}")),
        }
    }

    async fn expand(&self, volume_id: &str, bytes: u64) -> Result<(u64, bool), (Failure, String)> {
        let m = ExpandVolume { volume_id: volume_id.to_string(), range: CapacityRange { required: bytes, limit: 0 } };
        match self.volumes.send(m).await {
            Ok(Ok(done)) => Ok(done),
            Ok(Err(e)) => Err((failure_of(&e), e.to_string())),
            Err(e) => Err((Failure::Transient, format!("the volume manager did not answer: {e}"))),
        }
    }

    async fn wait_ready(&self) {
        while !matches!(self.volumes.send(WaitReady).await, Ok(true)) {
            tokio::time::sleep(READY_RETRY).await;
        }
    }
}

