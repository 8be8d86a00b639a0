//! The volume side of the capacity objects: [`CapacityBackend`], what the capacity loop
//! asks, implemented for a running agent's CSI front state ([`FrontBackend`]: GetCapacity's
//! own answer from the published view, and the view's changes).
//!
//! Rules:
//! - The room of a class is exactly what the GetCapacity RPC answers
//!   ([`crate::grpc::controller::capacity`]) to the external-provisioner's question: the
//!   class's parameters, this node's segments, no capabilities.
//! - UNAVAILABLE (the volume manager starting, or gone) is "not ready", never a room of 0;
//!   any other refusal is the class's, in GetCapacity's words.
//! - Nothing here sends a message: the view is read in memory, so a recompute of every
//!   class on each change is cheap.

use std::collections::BTreeMap;
use std::future::Future;

use super::{Answer, Room};
use crate::actors::volumes::view::ViewReader;
use crate::grpc::proto::csi;
use crate::grpc::Front;

/// The volume side of the capacity objects.
pub(crate) trait CapacityBackend: Send + 'static {
    /// What GetCapacity answers for a class with `parameters` on this node.
    fn answer(&self, parameters: &BTreeMap<String, String>) -> Answer;
    /// Waits until drives, volumes or reservations change; `false` once the volume
    /// manager is gone for good.
    fn changed(&mut self) -> impl Future<Output = bool> + Send;
}

/// The volume side of a running agent: its CSI front's state.
pub(crate) struct FrontBackend {
    front: Front,
    view: ViewReader,
    segments: std::collections::HashMap<String, String>,
}

impl FrontBackend {
    /// Asks `front` (its config's segments, its published view).
    pub(crate) fn new(front: &Front) -> Self {
        let segments = front.cfg.topology_segments().into_iter().collect();
        Self { front: front.clone(), view: front.views.volumes.clone(), segments }
    }
}

/// A GetCapacity answer as the capacity objects take it.
pub(crate) fn answer_of(r: Result<csi::GetCapacityResponse, tonic::Status>) -> Answer {
    let bytes = |v: i64| u64::try_from(v).unwrap_or(0);
    match r {
        Ok(a) => Answer::Room(Room {
            available: bytes(a.available_capacity),
            maximum: bytes(a.maximum_volume_size.unwrap_or(a.available_capacity)),
        }),
        Err(s) if s.code() == tonic::Code::Unavailable => Answer::NotReady,
        Err(s) => Answer::Refused(s.message().to_string()),
    }
}

impl CapacityBackend for FrontBackend {
    fn answer(&self, parameters: &BTreeMap<String, String>) -> Answer {
        let req = csi::GetCapacityRequest {
            volume_capabilities: Vec::new(),
            parameters: parameters.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            accessible_topology: Some(csi::Topology { segments: self.segments.clone() }),
        };
        answer_of(crate::grpc::controller::capacity(&self.front, &req))
    }

    async fn changed(&mut self) -> bool {
        let alive = self.view.changed().await.is_ok();
        // Seen: the next wait is for a view newer than this one.
        alive && self.view.latest().is_some()
    }
}
