//! The benchmarks' error: the typed error of the layer that failed, or what the benchmark
//! found wrong (a run that did not do what it measures is refused, not reported).

/// Why a benchmark could not run or refused its own run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Node(#[from] lading_node::NodeError),
    #[error(transparent)]
    Engine(#[from] lading_engine::EngineError),
    #[error(transparent)]
    Tree(#[from] lading_core::TreeError),
    #[error(transparent)]
    Jobs(#[from] lading_jobs::JobsError),
    #[error(transparent)]
    Submit(#[from] lading_ingest::SubmitError),
    #[error(transparent)]
    Client(#[from] reqwest::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A task of the benchmark panicked or was cancelled.
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
    /// What the benchmark found wrong, or a failure it names itself.
    #[error("{0}")]
    Other(String),
}

pub type Result<T, E = BenchError> = std::result::Result<T, E>;

impl From<std::time::SystemTimeError> for BenchError {
    fn from(e: std::time::SystemTimeError) -> BenchError {
        BenchError::Other(format!("the system clock is before 1970: {e}"))
    }
}

impl From<tokio::sync::AcquireError> for BenchError {
    fn from(e: tokio::sync::AcquireError) -> BenchError {
        BenchError::Other(format!("the benchmark's window closed: {e}"))
    }
}

impl From<String> for BenchError {
    fn from(s: String) -> BenchError {
        BenchError::Other(s)
    }
}

/// Ends the function with a [`BenchError::Other`] of a formatted message.
macro_rules! bail {
    ($($t:tt)*) => {
        return Err($crate::error::BenchError::Other(format!($($t)*)))
    };
}

/// [`bail!`] unless the condition holds.
macro_rules! ensure {
    ($c:expr, $($t:tt)*) => {
        if !$c {
            $crate::error::bail!($($t)*);
        }
    };
}

pub(crate) use {bail, ensure};
