//! The pod network: CNI ADD on the pod's pinned network namespace, DEL and the netns's removal,
//! and whether a pod gets its network before its pause container or beside it.

use std::collections::HashMap;
use std::path::Path;

use super::{failed, SandboxError, SandboxManager};
use crate::api;
use crate::sandbox::cni::{AttachRequest, AttachResult, PortMapping};
use crate::sandbox::netns::NetNs;
use crate::sandbox::record::SandboxRecord;

/// Makes the pod's pinned network namespace (lo up). That spawns and joins a short-lived
/// thread: kept off the async workers.
pub(super) async fn create_netns(path: &Path) -> Result<(), SandboxError> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || NetNs::create(&path))
        .await
        .map_err(|e| SandboxError::Failed(e.to_string()))?
        .map_err(failed("creating the network namespace"))?;
    Ok(())
}

/// Pause applies the pod's sysctls when it is made; one of an interface's (or of all of them:
/// net.ipv4.conf.eth0.*, net.ipv6.conf.all.disable_ipv6, net.ipv4.neigh.eth0.*) needs the
/// plugins' interface or undoes what they set up, so such a pod gets its network first, as
/// containerd does every pod. Every other pod's network is made beside pause.
pub(super) fn needs_network_before_pause(sysctls: &HashMap<String, String>) -> bool {
    sysctls
        .keys()
        .any(|k| k.starts_with("net.") && (k.contains(".conf.") || k.contains(".neigh.")))
}

impl SandboxManager {
    /// CNI ADD on the pod's pinned network namespace.
    pub(super) async fn cni_attach(
        &self,
        config: &api::PodSandboxConfig,
        id: &str,
        netns: &Path,
    ) -> Result<AttachResult, SandboxError> {
        let metadata = config.metadata.clone().unwrap_or_default();
        let request = attach_request(id, netns, &metadata, config);
        self.cni
            .setup(&request)
            .await
            .map_err(|e| SandboxError::Failed(format!("setting up the pod network: {e}")))
    }

    /// What CNI ADD attached, on record before anything else can fail.
    pub(super) fn record_network(
        &self,
        record: &mut SandboxRecord,
        attached: AttachResult,
    ) -> Result<(), SandboxError> {
        record.ips = attached.ips.iter().map(|ip| ip.to_string()).collect();
        record.cni_result = Some(attached.raw);
        self.store.put(&*record)?;
        Ok(())
    }

    /// CNI DEL on the pod's netns (an empty CNI_NETNS when it is gone).
    pub(super) async fn cni_detach(
        &self,
        config: &api::PodSandboxConfig,
        id: &str,
        netns: &Path,
    ) -> Result<(), SandboxError> {
        let metadata = config.metadata.clone().unwrap_or_default();
        let request = attach_request(id, netns, &metadata, config);
        self.cni
            .teardown(&request)
            .await
            .map_err(|e| SandboxError::Failed(format!("tearing down the pod network: {e}")))
    }

    /// CNI DEL and the pinned netns's removal, unless the network was released already.
    pub(super) async fn detach_network(&self, record: &SandboxRecord) -> Result<(), SandboxError> {
        let Some(netns) = record.netns.as_ref().filter(|_| !record.network_released) else {
            return Ok(());
        };
        self.cni_detach(&record.config(), &record.id, netns).await?;
        NetNs::remove(netns).map_err(failed("removing the network namespace"))?;
        tracing::info!(sandbox = %record.id, "pod network detached (CNI DEL, netns removed)");
        Ok(())
    }
}

fn attach_request<'a>(
    id: &'a str,
    netns: &'a Path,
    metadata: &'a api::PodSandboxMetadata,
    config: &api::PodSandboxConfig,
) -> AttachRequest<'a> {
    AttachRequest {
        container_id: id,
        netns,
        ifname: "eth0",
        pod_name: &metadata.name,
        pod_namespace: &metadata.namespace,
        pod_uid: &metadata.uid,
        port_mappings: config
            .port_mappings
            .iter()
            .filter(|p| p.host_port > 0)
            .map(|p| PortMapping {
                host_port: p.host_port,
                container_port: p.container_port,
                protocol: match p.protocol() {
                    api::Protocol::Tcp => "tcp",
                    api::Protocol::Udp => "udp",
                    api::Protocol::Sctp => "sctp",
                }
                .to_string(),
                host_ip: p.host_ip.clone(),
            })
            .collect(),
        bandwidth: None,
        dns: None,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::needs_network_before_pause;

    fn sysctls(keys: &[&str]) -> HashMap<String, String> {
        keys.iter().map(|k| (k.to_string(), "1".to_string())).collect()
    }

    #[test]
    fn only_an_interfaces_sysctls_wait_for_the_network() {
        for key in [
            "net.ipv4.conf.eth0.rp_filter",
            "net.ipv6.conf.all.disable_ipv6",
            "net.ipv4.neigh.eth0.gc_stale_time",
        ] {
            assert!(needs_network_before_pause(&sysctls(&[key])), "{key}");
        }
        for key in [
            "net.ipv4.ip_unprivileged_port_start",
            "net.core.somaxconn",
            "kernel.shm_rmid_forced",
        ] {
            assert!(!needs_network_before_pause(&sysctls(&[key])), "{key}");
        }
        assert!(!needs_network_before_pause(&sysctls(&[])));
    }
}
