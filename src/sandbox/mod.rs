//! Pod sandboxes: lifecycle (manager) and records, per-pod files, pinned network namespaces
//! (netns) and CNI (cni), run through the per-pod shim.

pub mod cni;
pub mod files;
pub mod manager;
pub mod netns;
pub mod record;
pub mod spec;
