//! What a stage handler made of one job or batch, and a stage's settings (concurrency,
//! attempts, the pause between them).

use lading_engine::EngineError;
use std::time::Duration;

/// What a stage handler made of one job or batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// Not ready yet; look again after `after`. Not counted as an attempt.
    Wait {
        after: Duration,
        reason: String,
    },
    /// Might work later (a network error, a busy service).
    Transient(String),
    /// Will never work without an admin (bad input).
    Fatal(String),
    /// An outside service is unavailable: waits for it, using no attempt (see the crate's
    /// page). `cause` is in plain words (`connection refused`); the library's own text goes
    /// to the log where the error was classified.
    Unavailable {
        dependency: lading_engine::deps::Dependency,
        cause: String,
    },
}

impl Outcome {
    pub fn fatal(e: impl std::fmt::Display) -> Outcome {
        Outcome::Fatal(e.to_string())
    }

    /// Its reason without the passwords of the URLs it quotes: a reason is recorded in the
    /// job's or batch's status, reported, mailed and logged.
    pub(crate) fn without_passwords(self) -> Outcome {
        let hide = |r: String| match lading_core::text::without_passwords(&r) {
            std::borrow::Cow::Borrowed(_) => r,
            std::borrow::Cow::Owned(o) => o,
        };
        match self {
            Outcome::Done => Outcome::Done,
            Outcome::Wait { after, reason } => Outcome::Wait {
                after,
                reason: hide(reason),
            },
            Outcome::Transient(r) => Outcome::Transient(hide(r)),
            Outcome::Fatal(r) => Outcome::Fatal(hide(r)),
            Outcome::Unavailable { dependency, cause } => Outcome::Unavailable {
                dependency,
                cause: hide(cause),
            },
        }
    }
}

/// How long a handler that found the store out of reach waits before it tries again.
pub const STORE_WAIT: Duration = Duration::from_secs(1);

/// An engine error inside a handler: a lost lease or a store hiccup is worth a retry, a corrupt
/// node is not.
impl From<EngineError> for Outcome {
    fn from(e: EngineError) -> Outcome {
        // The store itself out of reach (a lost connection, a dropped reply) is an outage,
        // not the job's or batch's error: it waits, using no attempt (found by `lading-sim`,
        // seed 1000994: a batch's report failed it after four lost reads).
        if let EngineError::Tree(t) = &e
            && matches!(t.root(), lading_core::TreeError::ConnectionLoss(_))
        {
            return Outcome::Wait {
                after: STORE_WAIT,
                reason: format!("the queue's store is out of reach: {e}"),
            };
        }
        if e.is_retryable() || matches!(e, EngineError::LeaseLost(_)) {
            Outcome::Transient(e.to_string())
        } else {
            Outcome::Fatal(e.to_string())
        }
    }
}

/// How one stage runs.
#[derive(Debug, Clone)]
pub struct StageConfig {
    /// Jobs of this stage handled at once by this process.
    pub concurrency: usize,
    /// Longest a handler may run; past it the attempt counts as transient.
    pub timeout: Duration,
    /// Attempts ending in a transient error before the job is Failed.
    pub max_attempts: u32,
    /// First retry delay; doubles per attempt, up to `backoff_max`, with jitter.
    pub backoff_base: Duration,
    pub backoff_max: Duration,
}

impl Default for StageConfig {
    fn default() -> Self {
        StageConfig {
            concurrency: 2,
            timeout: Duration::from_secs(3600),
            max_attempts: 5,
            backoff_base: Duration::from_secs(2),
            backoff_max: Duration::from_secs(300),
        }
    }
}

impl StageConfig {
    /// The delay before retry number `attempt` (1 = after the first failure): doubling from
    /// the base, capped, then scaled by a random factor in [0.5, 1] so retries of many jobs
    /// that failed together spread out.
    pub fn backoff(&self, attempt: u32, unit_random: f64) -> Duration {
        let exp = attempt.saturating_sub(1).min(30);
        let raw = self.backoff_base.saturating_mul(1u32 << exp);
        raw.min(self.backoff_max)
            .mul_f64(0.5 + 0.5 * unit_random.clamp(0.0, 1.0))
    }
}
