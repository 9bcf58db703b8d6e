//! Containers: records and state machine, the manager that runs them through their pod's shim,
//! and their events.

pub mod checkpoint;
pub mod manager;
pub mod record;
pub mod streams;
