//! StreamPodSandboxMetrics (KEP-5825): ListPodSandboxMetrics' pods, paged across messages so a
//! node with many pods is not cut off by the message size cap.

use tonic::codegen::BoxStream;

use super::{Cri, RpcError};
use crate::api;

impl Cri {
    pub(super) async fn stream_pod_sandbox_metrics(
        &self,
        _request: api::StreamPodSandboxMetricsRequest,
    ) -> Result<BoxStream<api::StreamPodSandboxMetricsResponse>, RpcError> {
        let metrics = self.pods_metrics().await?;
        Ok(
            self.paged(metrics, |pod_sandbox_metrics| api::StreamPodSandboxMetricsResponse {
                pod_sandbox_metrics,
            }),
        )
    }
}
