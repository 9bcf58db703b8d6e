//! scute: a Kubernetes CRI v1 container runtime.
//!
//! Data flows one way: `server` (one file per RPC) → domain modules (`sandbox`, …) → `store`.

/// CRI v1 messages and services generated from proto/runtime/v1/api.proto.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod api {
    tonic::include_proto!("runtime.v1");
}

/// scute's operator API (not CRI), generated from proto/scute/admin/v1/admin.proto.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod admin_api {
    tonic::include_proto!("scute.admin.v1");
}

pub mod blocking;
pub mod cdi;
pub mod cgroups;
pub mod check;
pub mod client;
pub mod config;
pub mod container;
pub mod cri_limits;
pub mod criu;
pub mod daemon;
pub mod distribution;
pub mod doctor;
pub mod events;
#[doc(hidden)]
pub mod fuzz;
pub mod handover;
pub mod ids;
pub mod image;
pub mod keyed_lock;
pub mod logging;
pub mod memory;
pub mod metrics;
pub mod oci;
pub mod sandbox;
pub mod server;
pub mod shim_client;
pub mod snapshot;
pub mod stats;
pub mod store;
pub mod streaming;

/// The name reported as VersionResponse.runtime_name.
pub const RUNTIME_NAME: &str = "scute";
/// The CRI version served (VersionResponse.runtime_api_version).
pub const CRI_API_VERSION: &str = "v1";
/// scute's own version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git commit scute was built from ("unknown" outside a checkout; build.rs).
pub const COMMIT: &str = env!("SCUTE_COMMIT");
/// That commit's date, or SOURCE_DATE_EPOCH's (build.rs).
pub const COMMIT_DATE: &str = env!("SCUTE_COMMIT_DATE");
/// `0.1.0 (commit 0123456789ab, 2026-11-28)`: what `scute --version` prints after the name.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("SCUTE_COMMIT"),
    ", ",
    env!("SCUTE_COMMIT_DATE"),
    ")"
);
