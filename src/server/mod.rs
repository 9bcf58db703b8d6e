//! The CRI v1 gRPC services, and scute's Admin service beside them (`admin_service.rs`).
//!
//! `runtime_service.rs` and `image_service.rs` are routing tables: each RPC goes through
//! [`instrument`] (span with method and ids, duration, outcome log) to a handler in its own file
//! (`version.rs`, `status.rs`, …), which returns a typed [`RpcError`]. This module is the one place
//! where errors become gRPC status codes.

mod admin_service;
mod container_attach;
mod container_checkpoint;
mod container_create;
mod container_events;
mod container_exec;
mod container_exec_sync;
mod container_list;
mod container_remove;
mod container_reopen_log;
mod container_start;
mod container_stats;
mod container_stats_list;
mod container_status;
mod container_stop;
mod container_update;
mod doctor;
mod image_convert;
mod image_fs_info;
mod image_list;
mod image_pull;
mod image_remove;
mod image_service;
mod image_status;
mod metric_descriptors_list;
mod paging;
mod pulls_list;
mod runtime_config;
mod runtime_service;
mod sandbox_list;
mod sandbox_metrics_list;
mod sandbox_metrics_stream;
mod sandbox_port_forward;
mod sandbox_remove;
mod sandbox_run;
mod sandbox_stats;
mod sandbox_stats_list;
mod sandbox_status;
mod sandbox_stop;
mod sandbox_update_resources;
mod status;
mod update_runtime_config;
mod version;

use std::future::Future;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use tonic::{Code, Response, Status};
use tracing::Instrument;

use crate::cdi::CdiError;
use crate::config::Config;
use crate::container::manager::{ContainerError, ContainerManager};
use crate::image::{ImageError, ImageManager, PullError};
use crate::oci::SpecError;
use crate::sandbox::manager::{SandboxError, SandboxManager};
use crate::store::{self, Store};

pub use admin_service::admin_server;
pub use image_service::image_service_server;
pub use runtime_service::runtime_service_server;

/// Daemon state shared by every RPC handler. Each piece has one owner module; handlers reach it
/// through here.
pub struct Cri {
    pub config: Arc<Config>,
    pub store: Arc<Store>,
    pub images: Arc<ImageManager>,
    pub sandboxes: Arc<SandboxManager>,
    pub containers: Arc<ContainerManager>,
    /// GetContainerEvents' channel, which both managers send to.
    pub events: Arc<crate::events::Events>,
    /// Serves the sessions behind Exec, Attach and PortForward URLs.
    pub streaming: Arc<crate::streaming::StreamingServer>,
    pub started_at: SystemTime,
    /// Last node check (RuntimeReady), re-run every few seconds.
    pub runtime_readiness: crate::check::RuntimeReadiness,
    /// cgroup layout and previous CPU samples, for the stats RPCs.
    pub stats: Arc<crate::stats::Stats>,
}

/// The tonic service object (cheap to clone; both services share one [`Cri`]).
#[derive(Clone)]
pub struct CriService {
    cri: Arc<Cri>,
}

impl CriService {
    pub fn new(cri: Arc<Cri>) -> Self {
        CriService { cri }
    }
}

/// Every way an RPC can fail, by what the caller should do about it.
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    DeadlineExceeded(String),
    #[error("{0}")]
    ResourceExhausted(String),
    #[error(transparent)]
    Store(#[from] store::Error),
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error(transparent)]
    Container(#[from] ContainerError),
    #[error("{0}")]
    Internal(String),
}

impl From<tokio::task::JoinError> for RpcError {
    fn from(e: tokio::task::JoinError) -> Self {
        RpcError::Internal(format!("background task failed: {e}"))
    }
}

/// InvalidArgument unless `value` (a required ID) is set.
pub(crate) fn required(rpc: &str, field: &str, value: &str) -> Result<(), RpcError> {
    if value.is_empty() {
        return Err(RpcError::InvalidArgument(format!("{rpc}: {field} is required")));
    }
    Ok(())
}

/// InvalidArgument unless `cmd` names a program and no argument holds a NUL byte (which no
/// exec can pass on).
pub(crate) fn check_cmd(rpc: &str, cmd: &[String]) -> Result<(), RpcError> {
    if cmd.first().is_none_or(|c| c.is_empty()) {
        return Err(RpcError::InvalidArgument(format!("{rpc}: cmd must not be empty")));
    }
    if cmd.iter().any(|a| a.contains('\0')) {
        return Err(RpcError::InvalidArgument(format!("{rpc}: cmd contains a NUL byte")));
    }
    Ok(())
}

/// Longest error message sent: messages may quote a request's strings, which can be huge, and
/// the message travels in a header (grpc-message) that clients cap (often at 8-16 KiB).
const MAX_MESSAGE: usize = 4096;

fn capped(mut message: String) -> String {
    if message.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        let total = message.len();
        message.truncate(end);
        message.push_str(&format!("… ({total} bytes, cut)"));
    }
    message
}

/// The one mapping from scute errors to gRPC codes.
impl From<RpcError> for Status {
    fn from(err: RpcError) -> Status {
        let code = match &err {
            RpcError::InvalidArgument(_) => Code::InvalidArgument,
            RpcError::NotFound(_) => Code::NotFound,
            RpcError::FailedPrecondition(_) => Code::FailedPrecondition,
            RpcError::Store(e) => store_code(e),
            RpcError::DeadlineExceeded(_) => Code::DeadlineExceeded,
            RpcError::ResourceExhausted(_) => Code::ResourceExhausted,
            RpcError::Sandbox(e) => sandbox_code(e),
            RpcError::Container(e) => match e {
                ContainerError::InvalidArgument(_) => Code::InvalidArgument,
                ContainerError::NotFound(_) => Code::NotFound,
                ContainerError::AlreadyExists(_) => Code::AlreadyExists,
                ContainerError::FailedPrecondition(_) => Code::FailedPrecondition,
                ContainerError::Failed(_) | ContainerError::Io { .. } | ContainerError::Shim { .. } => Code::Internal,
                ContainerError::Store(e) => store_code(e),
                ContainerError::Image(e) => image_code(e),
                ContainerError::Sandbox(e) => sandbox_code(e),
                ContainerError::Spec(e) => spec_code(e),
                ContainerError::Cdi(e) => cdi_code(e),
            },
            RpcError::Image(e) => image_code(e),
            RpcError::Internal(_) => Code::Internal,
        };
        Status::new(code, capped(err.to_string()))
    }
}

fn spec_code(e: &SpecError) -> Code {
    match e {
        SpecError::Invalid(_) => Code::InvalidArgument,
        // The host is not as the request needs it (a mount's propagation or source, no pause).
        SpecError::Host(_) => Code::FailedPrecondition,
        SpecError::Build(_) => Code::Internal,
    }
}

fn cdi_code(e: &CdiError) -> Code {
    match e {
        CdiError::Unresolvable { .. } | CdiError::Ambiguous(_) | CdiError::Annotation { .. } => Code::InvalidArgument,
        // The node cannot give what was asked: CDI off, a spec that cannot be applied here (a
        // device it names is missing), a renamed node in a user-namespaced pod.
        CdiError::Disabled(_) | CdiError::Apply { .. } | CdiError::UserNamespace { .. } => Code::FailedPrecondition,
    }
}

fn sandbox_code(e: &SandboxError) -> Code {
    match e {
        SandboxError::InvalidArgument(_) => Code::InvalidArgument,
        SandboxError::NotFound(_) => Code::NotFound,
        SandboxError::AlreadyExists(_) => Code::AlreadyExists,
        SandboxError::FailedPrecondition(_) => Code::FailedPrecondition,
        SandboxError::Failed(_) | SandboxError::Io { .. } | SandboxError::Shim { .. } => Code::Internal,
        SandboxError::Store(e) => store_code(e),
        SandboxError::Image(e) => image_code(e),
        SandboxError::Spec(e) => spec_code(e),
    }
}

fn image_code(e: &ImageError) -> Code {
    match e {
        ImageError::InvalidReference(_) => Code::InvalidArgument,
        ImageError::NotFound(_) => Code::NotFound,
        ImageError::Pull { source, .. } => match source {
            PullError::NotFound(_) | PullError::NoPlatform(_) => Code::NotFound,
            PullError::Unauthorized(_) => Code::Unauthenticated,
            // The registry or the network may recover: the kubelet retries with backoff.
            PullError::Remote(_) => Code::Unavailable,
            // The image itself is bad: a retry cannot help, so no retryable code.
            PullError::Integrity(_) | PullError::Hostile { .. } | PullError::Malformed(_) => Code::FailedPrecondition,
            PullError::Config(_) => Code::FailedPrecondition,
            PullError::Unsupported(_) => Code::InvalidArgument,
            PullError::NoSpace(_) => Code::ResourceExhausted,
            PullError::Stalled(_) => Code::DeadlineExceeded,
        },
        ImageError::Store(e) => store_code(e),
        ImageError::Content(_) | ImageError::Io(_) => Code::Internal,
    }
}

fn store_code(e: &store::Error) -> Code {
    match e {
        store::Error::NotFound { .. } => Code::NotFound,
        store::Error::Ambiguous { .. } => Code::InvalidArgument,
        store::Error::NameTaken { .. } | store::Error::AlreadyExists { .. } => Code::AlreadyExists,
        store::Error::SchemaTooNew { .. }
        | store::Error::Locked { .. }
        | store::Error::Corrupt { .. }
        | store::Error::BadSetting { .. }
        | store::Error::Db(_) => Code::Internal,
    }
}

/// Runs one RPC handler inside a span named after the method, logs its outcome and duration,
/// and maps its error. Handlers add ids to the span with `Span::current().record("id", …)`.
pub(crate) async fn instrument<T, F>(method: &'static str, handler: F) -> Result<Response<T>, Status>
where
    F: Future<Output = Result<T, RpcError>>,
{
    let span = tracing::info_span!("rpc", method, id = tracing::field::Empty);
    let start = Instant::now();
    let result = handler.instrument(span.clone()).await;
    let took = start.elapsed();
    let duration_ms = took.as_secs_f64() * 1000.0;
    let _entered = span.enter();
    match result {
        Ok(value) => {
            crate::metrics::global().rpc(method, Code::Ok, took);
            // The kubelet polls Status and List* every second: successes are debug-level.
            tracing::debug!(duration_ms, code = "OK", "rpc done");
            Ok(Response::new(value))
        }
        Err(err) => {
            let status = Status::from(err);
            crate::metrics::global().rpc(method, status.code(), took);
            match status.code() {
                Code::Internal | Code::Unknown | Code::DataLoss => {
                    tracing::error!(duration_ms, code = ?status.code(), error = status.message(), "rpc failed")
                }
                _ => {
                    tracing::info!(duration_ms, code = ?status.code(), error = status.message(), "rpc failed")
                }
            }
            Err(status)
        }
    }
}

/// The deadline the client set (`grpc-timeout` header, e.g. `9999m`), so long operations can stop
/// and report DeadlineExceeded themselves.
pub(crate) fn grpc_timeout(metadata: &tonic::metadata::MetadataMap) -> Option<std::time::Duration> {
    let value = metadata.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => std::time::Duration::from_secs(n.saturating_mul(3600)),
        "M" => std::time::Duration::from_secs(n.saturating_mul(60)),
        "S" => std::time::Duration::from_secs(n),
        "m" => std::time::Duration::from_millis(n),
        "u" => std::time::Duration::from_micros(n),
        "n" => std::time::Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_the_codes_the_kubelet_expects() {
        let cases: Vec<(RpcError, Code)> = vec![
            (RpcError::InvalidArgument("x".into()), Code::InvalidArgument),
            (RpcError::NotFound("x".into()), Code::NotFound),
            (RpcError::FailedPrecondition("x".into()), Code::FailedPrecondition),
            (
                store::Error::NotFound {
                    kind: store::Kind::Container,
                    id: "c".into(),
                }
                .into(),
                Code::NotFound,
            ),
            (
                store::Error::NameTaken {
                    kind: store::Kind::Sandbox,
                    name: "n".into(),
                    holder: "h".into(),
                }
                .into(),
                Code::AlreadyExists,
            ),
            (
                store::Error::Ambiguous {
                    kind: store::Kind::Sandbox,
                    prefix: "a".into(),
                    matches: 2,
                }
                .into(),
                Code::InvalidArgument,
            ),
            (RpcError::Internal("boom".into()), Code::Internal),
        ];
        for (err, code) in cases {
            let msg = err.to_string();
            let status = Status::from(err);
            assert_eq!(status.code(), code, "{msg}");
            assert_eq!(status.message(), msg);
        }
    }
}
