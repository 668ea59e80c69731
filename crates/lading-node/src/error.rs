//! The errors of this crate: each keeps the typed error of the layer that refused (so the
//! command line picks its exit code from it) and, where it helps, what was being done.

/// An error the server answered with; the exit code follows its status.
#[derive(Debug, thiserror::Error)]
#[error("{message} (HTTP {status})")]
pub struct HttpError {
    pub status: u16,
    pub message: String,
}

impl HttpError {
    pub fn exit_code(&self) -> u8 {
        exit_code(self.status)
    }
}

/// The command line's exit code for an answer of this HTTP status: 3 unknown, 4 refused
/// (bad input, not allowed, an illegal transition), 1 anything else.
pub fn exit_code(status: u16) -> u8 {
    match status {
        404 => 3,
        400 | 401 | 403 | 409 | 413 | 422 => 4,
        _ => 1,
    }
}

/// A command that only reads (or administers) a store was pointed at one that does not exist.
#[derive(Debug, thiserror::Error)]
#[error(
    "no store at {0}: only lading serve, worker, submit and demo create one (is --store right?)"
)]
pub struct NoStore(pub String);

/// A failure of a process's setup, of a verb, or of the API's client.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The server answered with an error status.
    #[error(transparent)]
    Http(#[from] HttpError),
    /// A verb refused on a store this process opened.
    #[error(transparent)]
    Ops(#[from] lading_server::ops::OpsError),
    #[error(transparent)]
    Engine(#[from] lading_engine::EngineError),
    #[error(transparent)]
    Tree(#[from] lading_core::TreeError),
    #[error(transparent)]
    NoStore(#[from] NoStore),
    /// A submission the service refused.
    #[error(transparent)]
    Submit(#[from] lading_ingest::SubmitError),
    #[error(transparent)]
    Config(#[from] lading_ingest::config::ConfigError),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// The server could not be reached, or its answer not read.
    #[error(transparent)]
    Client(#[from] reqwest::Error),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// What was being done when `source` failed (shown as `what: source`).
    #[error("{what}: {source}")]
    Context {
        what: String,
        source: Box<NodeError>,
    },
    /// A refusal or failure this crate names itself.
    #[error("{0}")]
    Other(String),
}

pub type Result<T, E = NodeError> = std::result::Result<T, E>;

impl NodeError {
    /// The error of the layer that refused, under any [`NodeError::Context`].
    pub fn cause(&self) -> &NodeError {
        match self {
            NodeError::Context { source, .. } => source.cause(),
            e => e,
        }
    }
}

impl From<String> for NodeError {
    fn from(s: String) -> NodeError {
        NodeError::Other(s)
    }
}

/// Names what was being done when a call failed, as `anyhow::Context` does for binaries.
pub trait Context<T> {
    fn context(self, what: impl Into<String>) -> Result<T>;
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: Into<NodeError>> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl Into<String>) -> Result<T> {
        self.map_err(|e| NodeError::Context {
            what: what.into(),
            source: Box::new(e.into()),
        })
    }

    fn with_context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| NodeError::Context {
            what: what(),
            source: Box::new(e.into()),
        })
    }
}
