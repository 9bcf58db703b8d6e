//! A container's namespaces: the pod's (pause's, joined by path) per the NamespaceOption modes.

use std::path::PathBuf;

use oci_spec::runtime::{LinuxNamespace, LinuxNamespaceBuilder, LinuxNamespaceType};

use super::ContainerSpec;
use super::SpecError;
use crate::api;
use crate::api::NamespaceMode;

pub(super) fn container_namespaces(
    s: &ContainerSpec<'_>,
    sc: &api::LinuxContainerSecurityContext,
    privileged: bool,
) -> Result<Vec<LinuxNamespace>, SpecError> {
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
    let pause = |typ: LinuxNamespaceType| -> Result<LinuxNamespace, SpecError> {
        if s.pause_pid == 0 {
            return Err(SpecError::Host("the pod sandbox has no running pause process".into()));
        }
        namespace(typ, Some(format!("/proc/{}/ns/{}", s.pause_pid, proc_name(typ)).into()))
    };
    let mut namespaces = vec![namespace(LinuxNamespaceType::Mount, None)?];
    // Joined first (libcontainer enters the user namespace before the others).
    if s.userns.is_some() {
        namespaces.push(pause(LinuxNamespaceType::User)?);
    }
    if !s.host_network {
        namespaces.push(pause(LinuxNamespaceType::Network)?);
        namespaces.push(pause(LinuxNamespaceType::Uts)?);
    }
    if !s.host_ipc {
        namespaces.push(pause(LinuxNamespaceType::Ipc)?);
    }
    match options.pid() {
        NamespaceMode::Pod => {
            if !s.host_pid {
                namespaces.push(pause(LinuxNamespaceType::Pid)?);
            }
        }
        NamespaceMode::Container => namespaces.push(namespace(LinuxNamespaceType::Pid, None)?),
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
        namespaces.push(namespace(LinuxNamespaceType::Cgroup, None)?);
    }
    Ok(namespaces)
}

/// A namespace to create (`path` None) or to join.
pub(crate) fn namespace(typ: LinuxNamespaceType, path: Option<PathBuf>) -> Result<LinuxNamespace, SpecError> {
    let mut b = LinuxNamespaceBuilder::default().typ(typ);
    if let Some(path) = path {
        b = b.path(path);
    }
    Ok(b.build()?)
}

/// The namespace's file under /proc/<pid>/ns/.
fn proc_name(typ: LinuxNamespaceType) -> &'static str {
    match typ {
        LinuxNamespaceType::Mount => "mnt",
        LinuxNamespaceType::Cgroup => "cgroup",
        LinuxNamespaceType::Uts => "uts",
        LinuxNamespaceType::Ipc => "ipc",
        LinuxNamespaceType::User => "user",
        LinuxNamespaceType::Pid => "pid",
        LinuxNamespaceType::Network => "net",
        LinuxNamespaceType::Time => "time",
    }
}

/// The check every RPC that carries a NamespaceOption makes (RunPodSandbox, CreateContainer):
/// each mode is one the CRI defines. The message names the field.
pub fn check_namespace_options(ns: &api::NamespaceOption) -> Result<(), SpecError> {
    let modes = [
        ("network", ns.network),
        ("pid", ns.pid),
        ("ipc", ns.ipc),
        ("userns", ns.userns_options.as_ref().map(|u| u.mode).unwrap_or_default()),
    ];
    match modes
        .into_iter()
        .find(|(_, mode)| NamespaceMode::try_from(*mode).is_err())
    {
        Some((field, mode)) => Err(SpecError::Invalid(format!(
            "namespace_options.{field} {mode} is not a NamespaceMode"
        ))),
        None => Ok(()),
    }
}
