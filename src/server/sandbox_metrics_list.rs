//! ListPodSandboxMetrics: for each ready pod, the cAdvisor-named metrics of the pod and of its
//! containers. They are a view of the same reads as ListPodSandboxStats (`sandboxes_stats`), so
//! both RPCs agree; a call also refreshes the CPU rate samples ListPodSandboxStats reports
//! against (the rate stays right, over a shorter interval).

use std::collections::HashMap;
use std::sync::Arc;

use super::{Cri, RpcError};
use crate::api;
use crate::sandbox::record::SandboxState;

impl Cri {
    pub(super) async fn list_pod_sandbox_metrics(
        &self,
        _request: api::ListPodSandboxMetricsRequest,
    ) -> Result<api::ListPodSandboxMetricsResponse, RpcError> {
        Ok(api::ListPodSandboxMetricsResponse {
            pod_metrics: self.pods_metrics().await?,
        })
    }

    /// The metrics of every ready pod (stopped pods have no processes or network to measure,
    /// as in ListPodSandboxStats).
    pub(super) async fn pods_metrics(&self) -> Result<Vec<api::PodSandboxMetrics>, RpcError> {
        let sandboxes = self.sandboxes.list()?;
        let containers = self.containers.list_records()?;
        let images: HashMap<String, String> = containers.iter().map(|c| (c.id.clone(), c.image_ref.clone())).collect();
        let mut pods = Vec::new();
        for sandbox in sandboxes {
            if self.sandboxes.live_state(&sandbox).await != SandboxState::Ready {
                continue;
            }
            let members = containers
                .iter()
                .filter(|c| c.sandbox_id == sandbox.id)
                .map(|c| (**c).clone())
                .collect();
            pods.push((Arc::unwrap_or_clone(sandbox), members));
        }
        Ok(self
            .sandboxes_stats(pods)
            .await?
            .iter()
            .map(|s| crate::stats::metrics::pod_metrics(s, &images))
            .collect())
    }
}
