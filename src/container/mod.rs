//! Containers: records and state machine, the manager that runs them through their pod's shim,
//! and OCI runtime specs.

pub mod manager;
pub mod record;
pub mod seccomp;
pub mod spec;
pub mod streams;
pub mod user;
