//! A Lading process as an application: the store it opens ([`node::open`]), its wiring
//! ([`node::Node`]: stages, access queues, the monitor, the fixity audit and the HTTP API on
//! one supervisor), the signals that stop it, the API's [`client::Client`] (with the
//! operator's verbs over it, [`lading_server::ops::Ops`]), the command line's text and the
//! demo. The HTTP API (handlers, wire types, limits) is `lading-server`, which knows nothing
//! of this crate.

pub mod client;
pub mod demo;
pub mod error;
pub mod node;
pub mod signals;
pub mod text;

pub use error::{Context, NodeError, Result};
