//! ListPodSandboxStats and StreamPodSandboxStats (the same list, paged): filters by ID (or
//! prefix) and label selector. Only ready pods are listed (as containerd does): a stopped pod has
//! no network and no running processes to account.

use std::sync::Arc;

use tonic::codegen::BoxStream;

use super::{Cri, RpcError};
use crate::api;
use crate::sandbox::record::SandboxState;

impl Cri {
    pub(super) async fn list_pod_sandbox_stats(
        &self,
        request: api::ListPodSandboxStatsRequest,
    ) -> Result<api::ListPodSandboxStatsResponse, RpcError> {
        let stats = self.pod_sandboxes_stats_listed(request.filter).await?;
        Ok(api::ListPodSandboxStatsResponse { stats })
    }

    pub(super) async fn stream_pod_sandbox_stats(
        &self,
        request: api::StreamPodSandboxStatsRequest,
    ) -> Result<BoxStream<api::StreamPodSandboxStatsResponse>, RpcError> {
        let stats = self.pod_sandboxes_stats_listed(request.filter).await?;
        Ok(
            self.paged(stats, |pod_sandbox_stats| api::StreamPodSandboxStatsResponse {
                pod_sandbox_stats,
            }),
        )
    }

    /// Stats of the ready pods `filter` selects.
    async fn pod_sandboxes_stats_listed(
        &self,
        filter: Option<api::PodSandboxStatsFilter>,
    ) -> Result<Vec<api::PodSandboxStats>, RpcError> {
        let filter = filter.unwrap_or_default();
        let sandboxes = self.sandboxes.list()?;
        // Samples of removed pods are dropped here, where every live ID is at hand.
        self.stats.keep_pods(sandboxes.iter().map(|s| s.id.as_str()));
        let containers = self.containers.list_records()?;
        let mut pods = Vec::new();
        for sandbox in sandboxes {
            if !filter.id.is_empty() && !sandbox.id.starts_with(&filter.id) {
                continue;
            }
            if !sandbox.matches_labels(&filter.label_selector) {
                continue;
            }
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
        let mut stats = Vec::with_capacity(pods.len());
        for s in self.sandboxes_stats(pods).await? {
            let id = s.attributes.as_ref().map(|a| a.id.as_str()).unwrap_or_default();
            if self.sandboxes.get(id).is_ok() {
                stats.push(s);
            }
        }
        Ok(stats)
    }
}
