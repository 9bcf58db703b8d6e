//! Pod sandboxes: lifecycle (manager) and records, per-pod files, pinned network namespaces
//! (netns) and CNI (cni), run through the per-pod shim; the pod's own events.

pub mod cni;
mod events;
pub mod exit_notices;
pub mod files;
pub mod manager;
pub mod netns;
pub mod record;
pub mod spec;
mod validate;
