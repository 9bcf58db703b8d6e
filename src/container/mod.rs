//! Containers: records and state machine, the manager that runs them through their pod's shim,
//! OCI runtime specs, and the events subscribers of GetContainerEvents receive.

pub mod events;
pub mod manager;
pub mod record;
pub mod streams;
