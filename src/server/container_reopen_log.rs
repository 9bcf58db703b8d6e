//! ReopenContainerLog: the shim reopens the log file after the kubelet rotated it.

use super::{Cri, RpcError};
use crate::api::{ReopenContainerLogRequest, ReopenContainerLogResponse};

impl Cri {
    pub(super) async fn reopen_container_log(
        &self,
        request: ReopenContainerLogRequest,
    ) -> Result<ReopenContainerLogResponse, RpcError> {
        tracing::Span::current().record("id", request.container_id.as_str());
        self.containers.reopen_log(&request.container_id).await?;
        Ok(ReopenContainerLogResponse {})
    }
}
