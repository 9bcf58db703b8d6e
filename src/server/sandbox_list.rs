//! ListPodSandbox and StreamPodSandboxes (the same list, paged): filters by ID (or prefix),
//! state and label selector.

use tonic::codegen::BoxStream;

use super::{Cri, RpcError};
use crate::api;

impl Cri {
    pub(super) async fn list_pod_sandbox(
        &self,
        request: api::ListPodSandboxRequest,
    ) -> Result<api::ListPodSandboxResponse, RpcError> {
        let items = self.pod_sandboxes(request.filter).await?;
        Ok(api::ListPodSandboxResponse { items })
    }

    pub(super) async fn stream_pod_sandboxes(
        &self,
        request: api::StreamPodSandboxesRequest,
    ) -> Result<BoxStream<api::StreamPodSandboxesResponse>, RpcError> {
        let items = self.pod_sandboxes(request.filter).await?;
        Ok(self.paged(items, |pod_sandboxes| api::StreamPodSandboxesResponse { pod_sandboxes }))
    }

    /// The pods `filter` selects, newest first.
    async fn pod_sandboxes(&self, filter: Option<api::PodSandboxFilter>) -> Result<Vec<api::PodSandbox>, RpcError> {
        let filter = filter.unwrap_or_default();
        let mut selected = Vec::new();
        for record in self.sandboxes.list()? {
            if !filter.id.is_empty() && !record.id.starts_with(&filter.id) {
                continue;
            }
            if !record.matches_labels(&filter.label_selector) {
                continue;
            }
            // A pod whose shim pushes its exits has a current record (pause's exit makes it
            // NotReady at once): no round trip to each shim.
            let state = match self.sandboxes.exit_notices.is_pushing(&record.id) {
                true => record.state,
                false => self.sandboxes.live_state(&record).await,
            }
            .to_cri();
            if let Some(wanted) = &filter.state {
                if wanted.state != state as i32 {
                    continue;
                }
            }
            selected.push((record, state));
        }
        // Sorted as records, then viewed (as ListContainers does).
        selected.sort_by_key(|(r, _)| std::cmp::Reverse(r.created_at));
        Ok(selected.iter().map(|(r, state)| r.to_cri_pod(*state)).collect())
    }
}
