//! StopContainer: stop signal, then SIGKILL after the timeout (seconds; 0 = at once). Unknown
//! IDs succeed (the kubelet retries).

use std::time::Duration;

use super::{Cri, RpcError};
use crate::api::{StopContainerRequest, StopContainerResponse};

impl Cri {
    pub(super) async fn stop_container(
        &self,
        request: StopContainerRequest,
    ) -> Result<StopContainerResponse, RpcError> {
        if request.container_id.is_empty() {
            return Err(RpcError::InvalidArgument(
                "StopContainer: container_id is required".into(),
            ));
        }
        tracing::Span::current().record("id", request.container_id.as_str());
        let timeout = Duration::from_secs(request.timeout.max(0) as u64);
        self.containers.stop(&request.container_id, timeout).await?;
        Ok(StopContainerResponse {})
    }
}
