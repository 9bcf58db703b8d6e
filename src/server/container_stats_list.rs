//! ListContainerStats and StreamContainerStats (the same list, paged): filters by ID (or
//! prefix), sandbox (or prefix) and label selector. Containers removed while their stats were
//! read are left out.

use std::sync::Arc;

use tonic::codegen::BoxStream;

use super::{Cri, RpcError};
use crate::api;

impl Cri {
    pub(super) async fn list_container_stats(
        &self,
        request: api::ListContainerStatsRequest,
    ) -> Result<api::ListContainerStatsResponse, RpcError> {
        let stats = self.containers_stats_listed(request.filter).await?;
        Ok(api::ListContainerStatsResponse { stats })
    }

    pub(super) async fn stream_container_stats(
        &self,
        request: api::StreamContainerStatsRequest,
    ) -> Result<BoxStream<api::StreamContainerStatsResponse>, RpcError> {
        let stats = self.containers_stats_listed(request.filter).await?;
        Ok(self.paged(stats, |container_stats| api::StreamContainerStatsResponse {
            container_stats,
        }))
    }

    /// Stats of the containers `filter` selects.
    async fn containers_stats_listed(
        &self,
        filter: Option<api::ContainerStatsFilter>,
    ) -> Result<Vec<api::ContainerStats>, RpcError> {
        let filter = filter.unwrap_or_default();
        let all = self.containers.list_records()?;
        // Samples of removed containers are dropped here, where every live ID is at hand.
        self.stats.keep_containers(all.iter().map(|r| r.id.as_str()));
        let records: Vec<_> = all
            .into_iter()
            .filter(|r| filter.id.is_empty() || r.id.starts_with(&filter.id))
            .filter(|r| filter.pod_sandbox_id.is_empty() || r.sandbox_id.starts_with(&filter.pod_sandbox_id))
            .filter(|r| r.matches_labels(&filter.label_selector))
            .map(Arc::unwrap_or_clone)
            .collect();
        let mut stats = Vec::with_capacity(records.len());
        for s in self.containers_stats(records).await? {
            let id = s.attributes.as_ref().map(|a| a.id.as_str()).unwrap_or_default();
            if self.containers.get(id).is_ok() {
                stats.push(s);
            }
        }
        Ok(stats)
    }
}
