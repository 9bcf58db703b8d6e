//! PortForward: checks the sandbox and the ports, then hands out a one-time URL on the streaming
//! server; each forwarded connection is made inside the pod's network namespace (see
//! `crate::streaming::portforward`).

use super::container_exec::token_error;
use super::{Cri, RpcError};
use crate::api::{PortForwardRequest, PortForwardResponse};
use crate::sandbox::record::SandboxState;
use crate::streaming::Pending;

impl Cri {
    pub(super) async fn port_forward(&self, mut request: PortForwardRequest) -> Result<PortForwardResponse, RpcError> {
        tracing::Span::current().record("id", request.pod_sandbox_id.as_str());
        if request.pod_sandbox_id.is_empty() {
            return Err(RpcError::InvalidArgument("missing required pod_sandbox_id".into()));
        }
        if let Some(bad) = request.port.iter().find(|p| !(1..=65535).contains(*p)) {
            return Err(RpcError::InvalidArgument(format!(
                "port {bad} is not a TCP port (1-65535)"
            )));
        }
        let id = self.sandboxes.resolve(&request.pod_sandbox_id)?;
        let record = self.sandboxes.get(&id)?;
        if self.sandboxes.live_state(&record).await != SandboxState::Ready {
            return Err(RpcError::FailedPrecondition(format!(
                "pod sandbox {id} is not ready: port-forward needs its network"
            )));
        }
        request.pod_sandbox_id = id;
        let url = self
            .streaming
            .url_for(Pending::PortForward(request))
            .map_err(token_error)?;
        Ok(PortForwardResponse { url })
    }
}
