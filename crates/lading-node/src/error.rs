//! The errors of this crate: each keeps the typed error of the layer that refused (so the
//! command line picks its exit code from it) and, where it helps, what was being done.

use crate::client::HttpError;
use crate::node::NoStore;

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
