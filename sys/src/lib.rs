//! scute's bottom layer, shared by the daemon and the shim: it imports nothing of either.
//!
//! - `clock`: wall-clock nanoseconds, as the CRI reports times.
//! - `errors`: an error with its causes, for messages a person can act on.
//! - `files`: atomic writes, directory usage.
//! - `mountinfo`: the one parser of /proc/self/mountinfo (with the kernel's octal escapes).
//! - `cgroupfs`: the cgroup hierarchies mounted here (v1, v2, hybrid) and where a cgroup's
//!   directory is in each.
//! - `pidfd`: a process's pidfd, to sleep until it exits.

pub mod cgroupfs;
pub mod clock;
pub mod errors;
pub mod files;
pub mod mountinfo;
pub mod pidfd;
