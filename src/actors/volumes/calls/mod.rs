//! The volume manager's handlers, one file per feature. They are the shell's own rooms:
//! each handler asks the book ([`super::book`]) what to do, hands the disk steps it
//! asks for ([`super::steps`]) to [`VolumeManager::run`](super::VolumeManager), and
//! answers; none decides anything itself.
//!
//! - [`controller`]: create, delete, attach, detach, expand, adopt, binding;
//! - [`node`]: stage, unstage, publish, unpublish, node expand, stats;
//! - [`snapshots`]: take, delete and list snapshots;
//! - [`drives`]: the inventory's drive events, the cleaner's reports, release and
//!   cordon;
//! - [`evacuation`]: evacuate a drive, its moves one at a time, their listing;
//! - [`drive_view`]: the one view the Drive sync reads ([`GetDriveView`](super::messages::GetDriveView));
//! - [`listing`]: the queries (volumes, statuses, health, uses, metrics) and the
//!   subscriptions;
//! - [`startup`]: start-up reconciliation, and the same for one drive read again.

mod controller;
mod drive_view;
mod drives;
mod evacuation;
mod listing;
mod node;
mod snapshots;
mod startup;
