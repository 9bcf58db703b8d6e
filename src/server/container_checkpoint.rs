//! CheckpointContainer: CRIU checkpoints a running container into an archive at `location`
//! (the container keeps running); see `container::checkpoint` for what the archive holds.

use std::time::Duration;

use super::{Cri, RpcError};
use crate::api::{CheckpointContainerRequest, CheckpointContainerResponse};

impl Cri {
    pub(super) async fn checkpoint_container(
        &self,
        request: CheckpointContainerRequest,
    ) -> Result<CheckpointContainerResponse, RpcError> {
        if request.container_id.is_empty() {
            return Err(RpcError::InvalidArgument(
                "CheckpointContainer: container_id is required".into(),
            ));
        }
        tracing::Span::current().record("id", request.container_id.as_str());
        let timeout = Duration::from_secs(request.timeout.max(0) as u64);
        self.containers
            .checkpoint(&request.container_id, &request.location, timeout)
            .await?;
        Ok(CheckpointContainerResponse {})
    }
}
