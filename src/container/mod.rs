//! Containers. So far: the OCI runtime spec of a pod sandbox's pause container.

pub mod spec;
