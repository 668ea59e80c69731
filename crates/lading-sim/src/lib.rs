//! The deterministic simulator (`lading-sim`): a whole Lading deployment — several
//! processes, each a real [`lading_engine::Engine`] running the real stage loops — on one
//! simulated tree with ZooKeeper's semantics, simulated time and faults drawn from a seed.
//! The same seed gives the same trace, byte for byte.

pub mod callback;
pub mod check;
pub mod command;
pub mod http;
pub mod payload;
pub mod sim;
pub mod smtp;
pub mod tree;
