//! ListContainers and StreamContainers (the same list, paged): filters by ID prefix, state,
//! sandbox and labels.

use std::sync::Arc;

use tonic::codegen::BoxStream;

use super::{Cri, RpcError};
use crate::api;
use crate::container::record::ContainerState;

impl Cri {
    pub(super) async fn list_containers(
        &self,
        request: api::ListContainersRequest,
    ) -> Result<api::ListContainersResponse, RpcError> {
        let containers = self.containers_listed(request.filter).await?;
        Ok(api::ListContainersResponse { containers })
    }

    pub(super) async fn stream_containers(
        &self,
        request: api::StreamContainersRequest,
    ) -> Result<BoxStream<api::StreamContainersResponse>, RpcError> {
        let containers = self.containers_listed(request.filter).await?;
        Ok(self.paged(containers, |containers| api::StreamContainersResponse { containers }))
    }

    /// The containers `filter` selects, newest first.
    async fn containers_listed(&self, filter: Option<api::ContainerFilter>) -> Result<Vec<api::Container>, RpcError> {
        let filter = filter.unwrap_or_default();
        let mut selected = Vec::new();
        for record in self.containers.list_records()? {
            if !filter.id.is_empty() && !record.id.starts_with(&filter.id) {
                continue;
            }
            if !filter.pod_sandbox_id.is_empty() && !record.sandbox_id.starts_with(&filter.pod_sandbox_id) {
                continue;
            }
            if !record.matches_labels(&filter.label_selector) {
                continue;
            }
            // Only a running container's record can be behind its shim (`refresh`), and not
            // when its pod's shim pushes its exits (as containerd's store is current): no round
            // trip to the shim per running container.
            let behind =
                record.state == ContainerState::Running && !self.sandboxes.exit_notices.is_pushing(&record.sandbox_id);
            let record = match behind {
                // A shim that does not answer costs its containers their freshness, not the
                // whole list (the kubelet's relist).
                true => match self.containers.refresh((*record).clone()).await {
                    Ok(refreshed) => Arc::new(refreshed),
                    Err(e) => {
                        tracing::warn!(container = %record.id, error = %e, "listed as last stored");
                        record
                    }
                },
                false => record,
            };
            if let Some(wanted) = &filter.state {
                if wanted.state != record.state.to_cri() as i32 {
                    continue;
                }
            }
            selected.push(record);
        }
        // Sorted as records (pointers), then viewed: moving 1000 built Containers around was a
        // good part of the listing's copying.
        selected.sort_by_key(|r| std::cmp::Reverse(r.created_at));
        Ok(selected.iter().map(|r| r.to_cri_container()).collect())
    }
}
