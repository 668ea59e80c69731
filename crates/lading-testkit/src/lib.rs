//! Test fixtures shared by the test suites, used only as a dev-dependency: real ZooKeeper
//! servers and ensembles on free loopback ports, with relays that can cut a session off
//! (`zk`), private PostgreSQL servers (`pg`), an SMTP receiver (`smtp`), and the one way the suites wait where no signal
//! reaches them (`poll`).

pub mod events;
pub mod pg;
pub mod poll;
pub mod smtp;
pub mod zk;
