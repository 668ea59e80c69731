//! Test fixtures shared by the test suites, used only as a dev-dependency: real ZooKeeper
//! servers and ensembles on free loopback ports, with relays that can cut a session off
//! (`zk`).

pub mod zk;
