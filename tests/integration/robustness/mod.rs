//! What must hold when things go wrong: kill -9 at every step, the crash campaign, actors failing, hostile input.

/// kill -9 at every named crash point, then restart and retry.
mod crash;
/// Random lifecycles with random crashes.
mod crash_campaign;
/// Supervised actors failing and being restarted.
mod actor_failure;
/// Hostile input to every RPC changes nothing.
mod abuse;
/// Symlink swaps raced against every call that takes a path.
mod race;
/// A staging path swapped between a check and the act: the clone, the growth and the
/// health check act on what was checked.
mod path_swaps;
