//! ListPulls (Admin): the image pulls in flight with their progress, for `scute pulls`.

use super::{Cri, RpcError};
use crate::admin_api::{ListPullsRequest, ListPullsResponse, Pull};

impl Cri {
    pub(super) async fn list_pulls(&self, _request: ListPullsRequest) -> Result<ListPullsResponse, RpcError> {
        let pulls = self
            .images
            .pulls()
            .into_iter()
            .map(|p| Pull {
                image: p.image,
                phase: p.phase.as_str().to_string(),
                bytes_done: p.bytes_done,
                bytes_total: p.bytes_total,
                layers_done: p.layers_done,
                layers_total: p.layers_total,
                elapsed_ms: p.elapsed.as_millis() as u64,
                idle_ms: p.idle.as_millis() as u64,
            })
            .collect();
        Ok(ListPullsResponse { pulls })
    }
}
