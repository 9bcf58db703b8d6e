//! ContainerStats: one container's cpu (with usage_nano_cores against its previous sample),
//! memory, swap, pressure and writable layer. A container without a cgroup (created, exited)
//! has only its writable layer.

use std::path::Path;

use super::{Cri, RpcError};
use crate::api;
use crate::container::manager::ContainerManager;
use crate::container::record::ContainerRecord;
use crate::stats::cgroup::Sample;
use crate::stats::{self, Stats};

impl Cri {
    pub(super) async fn container_stats(
        &self,
        request: api::ContainerStatsRequest,
    ) -> Result<api::ContainerStatsResponse, RpcError> {
        super::required("ContainerStats", "container_id", &request.container_id)?;
        let id = self.containers.resolve(&request.container_id)?;
        tracing::Span::current().record("id", id.as_str());
        let record = self.containers.get(&id)?;
        let mut stats = self.containers_stats(vec![record]).await?;
        Ok(api::ContainerStatsResponse { stats: stats.pop() })
    }

    /// Stats of `records`, read in one blocking task (cgroup files, a walk of each writable layer).
    pub(super) async fn containers_stats(
        &self,
        records: Vec<ContainerRecord>,
    ) -> Result<Vec<api::ContainerStats>, RpcError> {
        let stats = self.stats.clone();
        let containers = self.containers.clone();
        let mountpoint = self.images.snapshots_root().to_path_buf();
        Ok(tokio::task::spawn_blocking(move || {
            records
                .iter()
                .map(|r| container_stats(&stats, &containers, r, &mountpoint).0)
                .collect()
        })
        .await?)
    }
}

/// The CRI stats of one container and the cgroup sample they came from (a pod without a cgroup
/// of its own adds up its containers' samples). Blocks.
pub(super) fn container_stats(
    stats: &Stats,
    containers: &ContainerManager,
    record: &ContainerRecord,
    mountpoint: &Path,
) -> (api::ContainerStats, Sample) {
    let sample = stats.sample(&record.cgroups_path);
    let config = record.config();
    let cri = api::ContainerStats {
        attributes: Some(api::ContainerAttributes {
            id: record.id.clone(),
            metadata: config.metadata,
            labels: config.labels,
            annotations: config.annotations,
        }),
        cpu: stats.container_cpu(&record.id, &sample),
        memory: stats::memory(&sample),
        // Container writable layers share the filesystem ImageFsInfo reports for containers.
        writable_layer: Some(stats::writable_layer(
            &containers.writable_layer_dir(&record.id),
            mountpoint,
        )),
        swap: stats::swap(&sample),
        io: stats::io(&sample),
    };
    (cri, sample)
}
