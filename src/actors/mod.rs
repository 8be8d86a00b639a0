//! The core actors: one concern each, talking only by message. Each wraps a plain
//! struct that holds the logic; handlers forward to it in a line or two.
//!
//! Rules: nothing here knows a front. The gRPC front (`src/grpc`) and the Kubernetes
//! front (`src/k8s`) hold these actors' addresses and send them messages; these
//! actors never import either, and tell the fronts about changes only through the
//! subscriptions the fronts ask for (`SubscribeConditions`, `SubscribeDrives`,
//! `SubscribeVolumes`). All of them are started by `crate::supervisor::start`.

/// The HealthPoller: the probing schedule of SMART and volume checks.
pub(crate) mod health_poller;
/// The DriveInventory: the set of drives and their classes (inventory/: classify.rs the policy, model.rs the set).
pub mod inventory;
/// The drive inventory's messages (the volume manager's are in volumes/messages.rs).
pub(crate) mod messages;
/// The VolumeManager: volume records, the state machine, placement and every disk step.
pub mod volumes;

/// Sends `event` to every subscriber, forgetting those that are gone (a full mailbox
/// keeps its subscriber; it misses this one).
pub(crate) fn tell_all<M>(subscribers: &mut Vec<actix::Recipient<M>>, event: &M)
where
    M: actix::Message + Send + Clone + 'static,
    M::Result: Send,
{
    subscribers.retain(|s| s.try_send(event.clone()).is_ok() || s.connected());
}
