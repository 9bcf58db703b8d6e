//! A container's namespaces: the pod's (pause's, joined by path) per the NamespaceOption modes.

use serde_json::{json, Value};

use super::ContainerSpec;
use super::SpecError;
use crate::api;
use crate::api::NamespaceMode;

pub(super) fn container_namespaces(
    s: &ContainerSpec<'_>,
    sc: &api::LinuxContainerSecurityContext,
    privileged: bool,
) -> Result<Vec<Value>, SpecError> {
    let options = sc.namespace_options.clone().unwrap_or_default();
    // A container lives in its pod's user namespace; it can only ask for that one.
    let asked = crate::oci::userns::pod_user_namespace(&options).map_err(SpecError::Invalid)?;
    let asks_pod_userns = options
        .userns_options
        .as_ref()
        .is_some_and(|u| u.mode() == NamespaceMode::Pod);
    if asks_pod_userns && asked != s.userns {
        return Err(SpecError::Invalid(
            "the container's user namespace options differ from its pod's".into(),
        ));
    }
    let pause = |kind: &str| -> Result<Value, SpecError> {
        if s.pause_pid == 0 {
            return Err(SpecError::Host("the pod sandbox has no running pause process".into()));
        }
        Ok(json!({"type": kind_name(kind), "path": format!("/proc/{}/ns/{kind}", s.pause_pid)}))
    };
    let mut namespaces = vec![json!({"type": "mount"})];
    // Joined first (libcontainer enters the user namespace before the others).
    if s.userns.is_some() {
        namespaces.push(pause("user")?);
    }
    if !s.host_network {
        namespaces.push(pause("net")?);
        namespaces.push(pause("uts")?);
    }
    if !s.host_ipc {
        namespaces.push(pause("ipc")?);
    }
    match options.pid() {
        NamespaceMode::Pod => {
            if !s.host_pid {
                namespaces.push(pause("pid")?);
            }
        }
        NamespaceMode::Container => namespaces.push(json!({"type": "pid"})),
        NamespaceMode::Node => {
            if !s.host_pid {
                return Err(SpecError::Invalid(
                    "the container asks for the host PID namespace but its pod does not use it".into(),
                ));
            }
        }
        NamespaceMode::Target => {
            return Err(SpecError::Invalid(format!(
                "sharing the PID namespace of container {:?} (NamespaceMode TARGET) is not supported",
                options.target_id
            )))
        }
    }
    // As containerd: hide the host's cgroup tree on cgroup v2, except from privileged containers.
    if s.host.cgroup2 && !privileged {
        namespaces.push(json!({"type": "cgroup"}));
    }
    Ok(namespaces)
}

pub(super) fn kind_name(kind: &str) -> &str {
    if kind == "net" {
        "network"
    } else {
        kind
    }
}
