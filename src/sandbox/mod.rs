//! Pod sandboxes. So far: the CNI network readiness probe behind the NetworkReady condition.

pub mod cni;
