//! RunPodSandbox: network, files, shim and pause; answers the new sandbox's ID.

use super::{Cri, RpcError};
use crate::api::{RunPodSandboxRequest, RunPodSandboxResponse};

impl Cri {
    pub(super) async fn run_pod_sandbox(
        &self,
        request: RunPodSandboxRequest,
    ) -> Result<RunPodSandboxResponse, RpcError> {
        let config = request
            .config
            .ok_or_else(|| RpcError::InvalidArgument("RunPodSandbox: config is required".into()))?;
        let id = self.sandboxes.run(config, request.runtime_handler).await?;
        tracing::Span::current().record("id", id.as_str());
        self.containers.watch_shim(id.clone());
        Ok(RunPodSandboxResponse { pod_sandbox_id: id })
    }
}
