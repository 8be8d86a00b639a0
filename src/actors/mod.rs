//! Actors: one concern each, talking only by message. Each wraps a plain struct that
//! holds the logic; handlers forward to it in a line or two.

pub mod attach;
pub mod health;
pub mod inventory;
pub mod messages;
pub mod supervisor;
pub mod volumes;
