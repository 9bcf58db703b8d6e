//! PodSandboxStats: the pod's cpu, memory and process count (from the pod's cgroup when the
//! kubelet gave one, else the sum of pause's and its containers' cgroups), its network interfaces
//! read inside its namespace (none for host-network pods), and its containers' stats.

use std::path::Path;
use std::sync::Arc;

use super::container_stats::container_stats;
use super::{Cri, RpcError};
use crate::api;
use crate::container::manager::ContainerManager;
use crate::container::record::ContainerRecord;
use crate::sandbox::record::SandboxRecord;
use crate::stats::cgroup::Sample;
use crate::stats::{self, Stats};

impl Cri {
    pub(super) async fn pod_sandbox_stats(
        &self,
        request: api::PodSandboxStatsRequest,
    ) -> Result<api::PodSandboxStatsResponse, RpcError> {
        let id = self.sandboxes.resolve(&request.pod_sandbox_id)?;
        tracing::Span::current().record("id", id.as_str());
        let record = self.sandboxes.get(&id)?;
        let containers = self
            .containers
            .list_records()?
            .into_iter()
            .filter(|c| c.sandbox_id == id)
            .map(Arc::unwrap_or_clone)
            .collect();
        let mut stats = self.sandboxes_stats(vec![(record, containers)]).await?;
        Ok(api::PodSandboxStatsResponse { stats: stats.pop() })
    }

    /// Stats of each pod with its containers, read in one blocking task.
    pub(super) async fn sandboxes_stats(
        &self,
        pods: Vec<(SandboxRecord, Vec<ContainerRecord>)>,
    ) -> Result<Vec<api::PodSandboxStats>, RpcError> {
        let stats = self.stats.clone();
        let containers = self.containers.clone();
        let mountpoint = self.images.snapshots_root().to_path_buf();
        let pods: Vec<_> = pods
            .into_iter()
            .map(|(sandbox, members)| (self.sandboxes.pod_cgroup(&sandbox), sandbox, members))
            .collect();
        Ok(tokio::task::spawn_blocking(move || {
            pods.iter()
                .map(|(pod_cgroup, sandbox, members)| {
                    sandbox_stats(
                        &stats,
                        &containers,
                        pod_cgroup.as_deref(),
                        sandbox,
                        members,
                        &mountpoint,
                    )
                })
                .collect()
        })
        .await?)
    }
}

/// Blocks.
fn sandbox_stats(
    stats: &Stats,
    containers: &ContainerManager,
    pod_cgroup: Option<&str>,
    sandbox: &SandboxRecord,
    members: &[ContainerRecord],
    mountpoint: &Path,
) -> api::PodSandboxStats {
    let mut samples = Vec::with_capacity(members.len() + 1);
    let mut container_stats_list = Vec::with_capacity(members.len());
    for record in members {
        let (cri, sample) = container_stats(stats, containers, record, mountpoint);
        container_stats_list.push(cri);
        samples.push(sample);
    }
    let sample = match pod_cgroup {
        Some(path) => stats.sample(path),
        None => {
            samples.push(stats.sample(&sandbox.cgroups_path));
            // A container that comes or goes changes the sum: the rate cache sees a counter going
            // back as a reset, and one appearing adds its (young) usage to one interval.
            Sample::sum(&samples)
        }
    };
    let config = sandbox.config();
    api::PodSandboxStats {
        attributes: Some(api::PodSandboxAttributes {
            id: sandbox.id.clone(),
            metadata: config.metadata,
            labels: config.labels,
            annotations: config.annotations,
        }),
        linux: Some(api::LinuxPodSandboxStats {
            cpu: stats.pod_cpu(&sandbox.id, &sample),
            memory: stats::memory(&sample),
            network: sandbox.netns.as_deref().and_then(stats::network),
            process: stats::process(&sample),
            containers: container_stats_list,
            io: stats::io(&sample),
        }),
        windows: None,
    }
}
