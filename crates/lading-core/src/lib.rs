//! The heart of Lading, with no I/O: ids, the state machines and their transition rules,
//! the node layout, and the [`tree::Tree`] trait every backend implements.
//!
//! **Architecture invariant:** this crate does no I/O and starts no threads. Everything here
//! is plain data and pure functions, so it is tested exhaustively without a store.

pub mod json;
pub mod layout;
pub mod random;
pub mod recorded;
pub mod sabotage;
pub mod state;
pub mod text;
pub mod time;
pub mod tree;

pub use recorded::Recorded;
pub use state::{AccessState, BatchState, Event, IllegalTransition, JobProgress, JobState};
pub use tree::{
    BoxFuture, CreateMode, Names, Node, Op, OpResult, Stat, Tree, TreeError, TreeFuture, Watch,
    WatchKind,
};
