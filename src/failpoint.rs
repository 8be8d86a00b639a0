//! Fault injection for tests: fail points that make an actor fail, and crash points that
//! kill the process between the steps of a volume operation. Everything here is compiled
//! in only with the `failpoints` feature (the `fail` crate); a release build has none.
//!
//! Rules:
//! - an actor fails at a fail point named `actor.<name>.stop` ([`injected_failure`]) by
//!   stopping itself, so its supervisor restarts it; it never panics there;
//! - a crash point ([`crash_point!`](crate::failpoint::crash_point)) raises SIGKILL,
//!   exactly as `kill -9` would, so no destructor, flush or unwind runs after it;
//! - fail points are armed by `FAILPOINTS` at start, or at run time through the admin
//!   socket's `fail-point` request ([`arm_failure`]); a build without the feature says so
//!   rather than pretending to arm anything.

/// Kills the process at a named point when a test armed it (`FAILPOINTS=name=return`).
macro_rules! crash_point {
    ($name:literal) => {
        fail::fail_point!($name, |_| {
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
            unreachable!("SIGKILL at crash point")
        })
    };
}
pub(crate) use crash_point;

/// Arms the fail points `FAILPOINTS` names (`name=actions;...`) for the life of the
/// returned guard; nothing without the `failpoints` feature. The agent calls it first.
pub fn from_env() -> fail::FailScenario<'static> {
    fail::FailScenario::setup()
}

/// Arms the fail point `name` with `actions` (the admin socket's `fail-point` request).
pub fn arm_failure(name: &str, actions: &str) -> Result<(), String> {
    #[cfg(feature = "failpoints")]
    return fail::cfg(name, actions).map_err(|e| format!("fail point {name}: {e}"));
    #[cfg(not(feature = "failpoints"))]
    {
        let _ = (name, actions);
        Err("this build has no fail points (built without the `failpoints` feature)".into())
    }
}

/// Whether a test armed the fail point `name` (`actor.<name>.stop`, e.g.
/// `FAILPOINTS=actor.volumes.stop=1*return`) to make the calling actor fail here; the
/// caller then stops itself so that its supervisor restarts it. Always `false` unless
/// built with the `failpoints` feature.
pub fn injected_failure(name: &str) -> bool {
    let _ = name;
    fail::fail_point!(name, |_| true);
    false
}

/// The value a test armed the fail point `name` with (`return(VALUE)`), e.g. the byte
/// range a move's reads fail in (`move.unreadable`). Always `None` unless built with
/// the `failpoints` feature.
pub fn injected_value(name: &str) -> Option<String> {
    let _ = name;
    fail::fail_point!(name, |v: Option<String>| v);
    None
}

/// Holds the calling thread at the fail point `name` for the milliseconds a test armed
/// it with (`return(MS)`; 1000 without a value), saying so first, with `what`, in a
/// line a test waits for: the test changes the host meanwhile (swaps a path), so a race
/// that would otherwise need luck happens every run. Nothing unless built with the
/// `failpoints` feature.
pub fn hold(name: &str, what: &std::path::Path) {
    let _ = (name, what);
    fail::fail_point!(name, |ms: Option<String>| {
        let ms = ms.and_then(|m| m.parse().ok()).unwrap_or(1000u64);
        tracing::warn!(fail.point = name, path = %what.display(), hold_ms = ms, "fail point: holding here");
        std::thread::sleep(std::time::Duration::from_millis(ms));
    });
}
