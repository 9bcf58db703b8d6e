//! RunPodSandbox's checks, made before anything is created: metadata, log directory, handler,
//! hostname and DNS, port mappings, namespace modes and resources (the checks `oci` shares
//! with CreateContainer), sysctls.

use super::files;
use crate::api;
use crate::config::Config;
use crate::cri_limits;

/// Checks a RunPodSandbox request before anything is created; Err is the InvalidArgument
/// message.
pub(super) fn validate(config: &api::PodSandboxConfig, handler: &str, daemon: &Config) -> Result<(), String> {
    let invalid = |m: String| Err(m);
    let Some(metadata) = &config.metadata else {
        return invalid("PodSandboxConfig.metadata is required".into());
    };
    for (field, value) in [
        ("name", &metadata.name),
        ("namespace", &metadata.namespace),
        ("uid", &metadata.uid),
    ] {
        cri_limits::check_name(&format!("PodSandboxConfig.metadata.{field}"), value)?;
    }
    cri_limits::check_labels("PodSandboxConfig.labels", &config.labels)?;
    if !config.log_directory.is_empty()
        && (!config.log_directory.starts_with('/') || config.log_directory.contains('\0'))
    {
        return invalid(format!(
            "PodSandboxConfig.log_directory {:?} must be an absolute path",
            config.log_directory
        ));
    }
    if !daemon.handler_names().any(|h| h == handler) {
        return invalid(format!(
            "unknown runtime handler {handler:?} (configured: {:?})",
            daemon.runtime.handlers.keys().collect::<Vec<_>>()
        ));
    }
    if !config.hostname.is_empty() {
        files::validate_hostname(&config.hostname)?;
    }
    if let Some(dns) = &config.dns_config {
        files::validate_dns(dns)?;
    }
    for p in &config.port_mappings {
        if !(0..=65535).contains(&p.host_port) || !(1..=65535).contains(&p.container_port) {
            return invalid(format!(
                "port mapping {}:{} is out of range",
                p.host_port, p.container_port
            ));
        }
        if api::Protocol::try_from(p.protocol).is_err() {
            return invalid(format!("port mapping protocol {} is not a Protocol", p.protocol));
        }
        if !p.host_ip.is_empty() && p.host_ip.parse::<std::net::IpAddr>().is_err() {
            return invalid(format!("port mapping host_ip {:?} is not an IP address", p.host_ip));
        }
    }
    let linux = config.linux.clone().unwrap_or_default();
    if let Some(ns) = linux
        .security_context
        .as_ref()
        .and_then(|s| s.namespace_options.as_ref())
    {
        if let Err(e) = crate::oci::check_namespace_options(ns) {
            return invalid(e.to_string());
        }
    }
    for (field, resources) in [("resources", &linux.resources), ("overhead", &linux.overhead)] {
        let Some(r) = resources else { continue };
        if let Err(e) = crate::oci::check_resources(r) {
            return invalid(format!("linux.{field}.{e}"));
        }
    }
    let host_network = linux
        .security_context
        .as_ref()
        .and_then(|s| s.namespace_options.as_ref())
        .is_some_and(|n| n.network() == api::NamespaceMode::Node);
    for key in linux.sysctls.keys() {
        if !is_namespaced_sysctl(key, host_network) {
            return invalid(format!(
                "sysctl {key:?} is not namespaced (or not allowed for a host-network pod)"
            ));
        }
        if !sysctl_exists(key) {
            return invalid(format!("sysctl {key:?} does not exist on this node's kernel"));
        }
    }
    Ok(())
}

/// Whether the kernel has sysctl `key` (`net.ipv4.ip_forward` or `net/ipv4/ip_forward`), as
/// /proc/sys shows it to the daemon: a pod's own namespaces have the same names, except for
/// per-interface ones (`net.ipv4.conf.eth0.*`: the pod's eth0 is not the node's), which are
/// left to the kernel.
fn sysctl_exists(key: &str) -> bool {
    let rel = key.replace('.', "/");
    let parts: Vec<&str> = rel.split('/').collect();
    if parts.iter().any(|c| c.is_empty() || *c == "..") {
        return false;
    }
    let per_interface = parts.len() >= 5
        && parts[0] == "net"
        && matches!(parts[2], "conf" | "neigh")
        && !matches!(parts[3], "all" | "default");
    per_interface || std::path::Path::new("/proc/sys").join(rel).is_file()
}

/// The sysctls a pod may set: the kernel's namespaced ones (IPC; network unless the pod uses the
/// host's network; UTS).
fn is_namespaced_sysctl(key: &str, host_network: bool) -> bool {
    let ipc = matches!(
        key,
        "kernel.sem"
            | "kernel.shmall"
            | "kernel.shmmax"
            | "kernel.shmmni"
            | "kernel.shm_rmid_forced"
            | "kernel.msgmax"
            | "kernel.msgmnb"
            | "kernel.msgmni"
    ) || key.starts_with("fs.mqueue.");
    let uts = matches!(key, "kernel.hostname" | "kernel.domainname");
    let net = key.starts_with("net.");
    ipc || uts || (net && !host_network)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysctl_namespacing() {
        assert!(is_namespaced_sysctl("net.ipv4.ip_forward", false));
        assert!(!is_namespaced_sysctl("net.ipv4.ip_forward", true));
        assert!(is_namespaced_sysctl("kernel.shm_rmid_forced", true));
        assert!(!is_namespaced_sysctl("kernel.panic", false));
        assert!(!is_namespaced_sysctl("vm.overcommit_memory", false));
        assert!(sysctl_exists("net.ipv4.ip_forward") && sysctl_exists("kernel/shm_rmid_forced"));
        assert!(!sysctl_exists("net.ipv4.no_such_sysctl"));
        assert!(!sysctl_exists("net..ipv4") && !sysctl_exists("net/../kernel/panic"));
        // The pod's own interfaces are not the node's.
        assert!(sysctl_exists("net.ipv4.conf.eth0.rp_filter"));
        assert!(!sysctl_exists("net.ipv4.conf.all.no_such_sysctl"));
    }

    #[test]
    fn requests_are_validated() {
        let daemon = Config::defaults();
        let ok = api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: "web".into(),
                uid: "u".into(),
                namespace: "default".into(),
                attempt: 0,
            }),
            ..Default::default()
        };
        assert!(validate(&ok, "", &daemon).is_ok());
        assert!(validate(&ok, "runc", &daemon).is_ok());
        assert!(validate(&ok, "kata", &daemon).unwrap_err().contains("kata"));
        assert!(validate(&api::PodSandboxConfig::default(), "", &daemon)
            .unwrap_err()
            .contains("metadata"));
        let mut bad = ok.clone();
        bad.hostname = "bad host".into();
        assert!(validate(&bad, "", &daemon).is_err());
        let mut bad = ok.clone();
        bad.linux = Some(api::LinuxPodSandboxConfig {
            sysctls: [("kernel.panic".to_string(), "1".to_string())].into(),
            ..Default::default()
        });
        assert!(validate(&bad, "", &daemon).is_err());
    }
}
