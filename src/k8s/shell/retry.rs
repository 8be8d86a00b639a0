//! The retry policy of this front's loops: how long a failed run waits before it runs
//! again. One policy, from one place in the config (`kubernetes.retry_base`,
//! `retry_cap`, `retry_terminal`), for every loop that retries with backoff: the
//! attach, resize and snapshot queues, the node labelling, the Drive sync and the
//! capacity objects.
//!
//! Rules:
//! - A failure that may pass by retrying waits [`RetryPolicy::backoff`]: `base` after the
//!   first, doubled per failure in a row, never more than `cap` (the crate's one rule,
//!   [`crate::backoff`]).
//! - A failure that will not pass by retrying (an unusable drive, a size the drive cannot
//!   meet) waits `terminal`.

use std::time::Duration;

use crate::config::KubernetesConfig;

/// Retry delays (base, cap and terminal come from `[kubernetes]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RetryPolicy {
    /// Delay after the first failure; doubled per consecutive failure.
    pub base: Duration,
    /// The longest backoff delay.
    pub cap: Duration,
    /// Delay after a failure that will not pass by retrying (an unusable drive).
    pub terminal: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(300),
            terminal: Duration::from_secs(600),
        }
    }
}

impl RetryPolicy {
    /// The policy `[kubernetes]` configures.
    pub(crate) fn from_config(k: &KubernetesConfig) -> Self {
        Self { base: k.retry_base, cap: k.retry_cap, terminal: k.retry_terminal }
    }

    /// The delay after `failures` earlier failures in a row (0: the first retry).
    pub(crate) fn backoff(&self, failures: u32) -> Duration {
        crate::backoff::backoff(failures, self.base, self.cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_is_the_configured_one_and_backs_off_by_the_crates_rule() {
        let k = KubernetesConfig { retry_base: Duration::from_secs(2), retry_cap: Duration::from_secs(10), ..Default::default() };
        let p = RetryPolicy::from_config(&k);
        assert_eq!(p, RetryPolicy { base: Duration::from_secs(2), cap: Duration::from_secs(10), terminal: Duration::from_secs(600) });
        let delays: Vec<u64> = (0..4).map(|f| p.backoff(f).as_secs()).collect();
        assert_eq!(delays, [2, 4, 8, 10]);
        assert_eq!(RetryPolicy::from_config(&KubernetesConfig::default()), RetryPolicy::default());
    }
}
