//! UpdateContainerResources: the request merged into the container's recorded resources and
//! applied to its cgroup through its shim.

use super::validate::validate_resources;
use super::{shim_failed, ContainerError, ContainerManager};
use crate::api;
use crate::container::record::{ContainerRecord, ContainerState};
use crate::shim_client::pb::ErrorCode as ShimCode;
use crate::shim_client::ShimError;

impl ContainerManager {
    /// UpdateContainerResources, with containerd's semantics: the request is merged into the
    /// container's resources (a field it leaves zero or empty keeps its value) that ContainerStatus
    /// reports from then on; a created or running container's cgroup gets the new limits through
    /// its shim (converted as CreateContainer converts them; its device rules stay); an exited
    /// container (also one that exits meanwhile) only has them recorded. Negative values are
    /// refused, but -1 ("no limit" in OCI) for the CPU quota and the swap limit. oom_score_adj is
    /// not changed on a live process and keeps its recorded value.
    pub async fn update_resources(
        &self,
        id_or_prefix: &str,
        resources: Option<api::LinuxContainerResources>,
    ) -> Result<(), ContainerError> {
        let id = self.resolve(id_or_prefix)?;
        let Some(resources) = resources else {
            return Ok(());
        };
        validate_resources("UpdateContainerResources", &resources)?;
        let oci = crate::oci::update_resources(&resources, &self.host)?;
        let _lock = self.id_locks.lock(&id).await;
        let mut record = self.refresh(self.get(&id)?).await?;
        // A created container is not in its shim yet: its bundle gets them (below).
        let in_bundle = record.state == ContainerState::Created && record.deferred;
        if record.state != ContainerState::Exited && !in_bundle {
            let shim = self.shim(&record.sandbox_id).await?;
            match shim.update_resources(&id, &oci).await {
                Ok(()) => {}
                Err(ShimError::Remote {
                    code: ShimCode::InvalidArgument,
                    message,
                }) => return Err(ContainerError::InvalidArgument(message)),
                Err(
                    e @ (ShimError::NotFound(_)
                    | ShimError::Remote {
                        code: ShimCode::FailedPrecondition,
                        ..
                    }),
                ) => {
                    // It exited meanwhile: then only the record changes.
                    record = self.refresh(record).await?;
                    if record.state != ContainerState::Exited {
                        return Err(shim_failed("updating the container's resources")(e));
                    }
                }
                Err(e) => return Err(shim_failed("updating the container's resources")(e)),
            }
        }
        let mut config = record.config();
        let linux = config.linux.get_or_insert_with(Default::default);
        let merged = merge_resources(linux.resources.take().unwrap_or_default(), resources);
        if in_bundle {
            self.update_bundle(&record, &merged)?;
        }
        linux.resources = Some(merged);
        record.config = ContainerRecord::encode_config(&config);
        self.store.put(&record)?;
        tracing::info!(container = %id, state = ?record.state, "container resources updated");
        Ok(())
    }
}

impl ContainerManager {
    /// The created container's bundle with `resources` in place of its resources, converted as
    /// CreateContainer converts them (its device rules stay), for the cgroup its start makes.
    fn update_bundle(
        &self,
        record: &ContainerRecord,
        resources: &api::LinuxContainerResources,
    ) -> Result<(), ContainerError> {
        let dir = self.dir(&record.id);
        let path = dir.join("bundle").join("config.json");
        let mut spec = oci_spec::runtime::Spec::load(&path)
            .map_err(|e| ContainerError::Failed(format!("reading the container's bundle: {e}")))?;
        let mut updated = crate::oci::update_resources(resources, &self.host)?;
        if let Some(linux) = spec.linux_mut() {
            let devices = linux.resources().as_ref().and_then(|r| r.devices().clone());
            updated.set_devices(devices);
            linux.set_resources(Some(updated));
        }
        crate::sandbox::files::write_bundle(&dir, &spec).map_err(super::failed("writing the bundle"))?;
        Ok(())
    }
}

/// `update` over `old`, field by field: what the update leaves zero or empty keeps its value
/// (unified entries are merged key by key); oom_score_adj is not updatable.
pub(super) fn merge_resources(
    old: api::LinuxContainerResources,
    update: api::LinuxContainerResources,
) -> api::LinuxContainerResources {
    fn pick<T: PartialEq + Default>(old: T, new: T) -> T {
        if new == T::default() {
            old
        } else {
            new
        }
    }
    let mut unified = old.unified;
    unified.extend(update.unified);
    api::LinuxContainerResources {
        cpu_period: pick(old.cpu_period, update.cpu_period),
        cpu_quota: pick(old.cpu_quota, update.cpu_quota),
        cpu_shares: pick(old.cpu_shares, update.cpu_shares),
        memory_limit_in_bytes: pick(old.memory_limit_in_bytes, update.memory_limit_in_bytes),
        oom_score_adj: old.oom_score_adj,
        cpuset_cpus: pick(old.cpuset_cpus, update.cpuset_cpus),
        cpuset_mems: pick(old.cpuset_mems, update.cpuset_mems),
        hugepage_limits: pick(old.hugepage_limits, update.hugepage_limits),
        unified,
        memory_swap_limit_in_bytes: pick(old.memory_swap_limit_in_bytes, update.memory_swap_limit_in_bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_updates_merge_and_refuse_negatives() {
        let old = api::LinuxContainerResources {
            cpu_shares: 512,
            cpu_period: 100_000,
            memory_limit_in_bytes: 64 << 20,
            memory_swap_limit_in_bytes: 64 << 20,
            oom_score_adj: 900,
            cpuset_cpus: "0".into(),
            unified: [("memory.high".to_string(), "1".to_string())].into(),
            ..Default::default()
        };
        let update = api::LinuxContainerResources {
            cpu_shares: 1024,
            cpu_quota: 50_000,
            memory_limit_in_bytes: 128 << 20,
            oom_score_adj: -5,
            unified: [("pids.max".to_string(), "9".to_string())].into(),
            ..Default::default()
        };
        validate_resources("", &update).unwrap();
        let merged = merge_resources(old, update);
        assert_eq!(
            (merged.cpu_shares, merged.cpu_quota, merged.cpu_period),
            (1024, 50_000, 100_000)
        );
        assert_eq!(
            (merged.memory_limit_in_bytes, merged.memory_swap_limit_in_bytes),
            (128 << 20, 64 << 20)
        );
        assert_eq!((merged.oom_score_adj, merged.cpuset_cpus.as_str()), (900, "0"));
        assert_eq!(merged.unified.len(), 2);

        for bad in [
            api::LinuxContainerResources {
                cpu_shares: -2,
                ..Default::default()
            },
            api::LinuxContainerResources {
                cpu_quota: -2,
                ..Default::default()
            },
            api::LinuxContainerResources {
                cpu_period: -1,
                ..Default::default()
            },
            api::LinuxContainerResources {
                memory_limit_in_bytes: -1,
                ..Default::default()
            },
        ] {
            assert!(
                matches!(validate_resources("", &bad), Err(ContainerError::InvalidArgument(_))),
                "{bad:?}"
            );
        }
        validate_resources(
            "",
            &api::LinuxContainerResources {
                cpu_quota: -1,
                memory_swap_limit_in_bytes: -1,
                ..Default::default()
            },
        )
        .unwrap();
    }
}
