//! Test fixtures shared by the test suites, used only as a dev-dependency: real ZooKeeper
//! servers and ensembles on free loopback ports, with relays that can cut a session off
//! (`zk`), private PostgreSQL servers (`pg`), and an SMTP receiver (`smtp`).

pub mod events;
pub mod pg;
pub mod smtp;
pub mod zk;
