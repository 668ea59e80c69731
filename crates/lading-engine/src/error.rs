//! The engine's one error type. Every variant names the thing it is about and says whether a
//! retry can help.

use lading_core::layout::{BadId, BadName};
use lading_core::{IllegalTransition, TreeError};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    #[error("no such batch: {0}")]
    NoBatch(String),
    #[error("no such job: {0}")]
    NoJob(String),
    #[error("no such access request: {0}")]
    NoAccess(String),
    #[error(transparent)]
    Illegal(#[from] IllegalTransition),
    /// The caller's lock is gone (session expired, or the lease was taken over): it must stop
    /// working on the item and commit nothing.
    #[error("lease lost on {0}: the lock is no longer held by this session")]
    LeaseLost(String),
    #[error("{0} is locked by a worker; try again when it is released")]
    Locked(String),
    /// A Held batch is locked: Lading never leaves such a lock, so another tool holds it.
    #[error(
        "{0} is Held but locked by another tool (a Merritt consumer that failed on it keeps its lock while its process lives); `lading admin clear-lock batch {0}` removes it"
    )]
    ForeignLocked(String),
    #[error("corrupt node {path}: {reason}")]
    Corrupt { path: String, reason: String },
    #[error("invalid input: {0}")]
    Invalid(String),
    #[error("{0} changed concurrently; retry")]
    Conflict(String),
    #[error(transparent)]
    Tree(TreeError),
}

impl EngineError {
    /// Whether the call was refused before it wrote or asked the store anything (an illegal
    /// move, bad input): a lease's lock is then as it was, still the caller's to release.
    pub(crate) fn refused_up_front(&self) -> bool {
        matches!(self, EngineError::Illegal(_) | EngineError::Invalid(_))
    }

    /// Whether the same call may succeed if repeated.
    pub fn is_retryable(&self) -> bool {
        match self {
            EngineError::Locked(_) | EngineError::Conflict(_) => true,
            EngineError::Tree(e) => e.is_retryable(),
            _ => false,
        }
    }
}

impl From<TreeError> for EngineError {
    fn from(e: TreeError) -> Self {
        EngineError::Tree(e)
    }
}

impl From<BadId> for EngineError {
    fn from(e: BadId) -> Self {
        EngineError::Invalid(e.to_string())
    }
}

impl From<BadName> for EngineError {
    fn from(e: BadName) -> Self {
        EngineError::Invalid(e.to_string())
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
