//! ListMetricDescriptors: the cAdvisor-named metrics ListPodSandboxMetrics sends, with their
//! label keys (see `stats::metrics`). The kubelet asks once and builds its Prometheus
//! descriptions from the answer.

use super::{Cri, RpcError};
use crate::api;

impl Cri {
    pub(super) async fn list_metric_descriptors(
        &self,
        _request: api::ListMetricDescriptorsRequest,
    ) -> Result<api::ListMetricDescriptorsResponse, RpcError> {
        Ok(api::ListMetricDescriptorsResponse {
            descriptors: crate::stats::metrics::descriptors(),
        })
    }
}
