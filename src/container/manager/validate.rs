//! CreateContainer's checks of a request, before anything is made.

use super::ContainerError;
use crate::api;

/// Checks a CreateContainer request before anything is made: what the kubelet never sends and
/// the spec or the shim would trip over later (or, worse, follow: a log path or mount target
/// leaving its directory).
pub(super) fn validate_config(config: &api::ContainerConfig) -> Result<(), ContainerError> {
    fn invalid(message: String) -> Result<(), ContainerError> {
        Err(ContainerError::InvalidArgument(format!("CreateContainer: {message}")))
    }
    fn no_nul(field: &str, value: &str) -> Result<(), ContainerError> {
        if value.contains('\0') {
            return invalid(format!("{field} contains a NUL byte"));
        }
        Ok(())
    }
    /// An absolute path with no `..` component.
    fn absolute(field: &str, value: &str) -> Result<(), ContainerError> {
        no_nul(field, value)?;
        if value.len() > 4096 {
            return invalid(format!("{field} is {} bytes long (at most 4096)", value.len()));
        }
        if !value.starts_with('/') {
            return invalid(format!("{field} {value:?} must be an absolute path"));
        }
        if value.split('/').any(|c| c == "..") {
            return invalid(format!("{field} {value:?} must not contain \"..\""));
        }
        Ok(())
    }
    let Some(metadata) = &config.metadata else {
        return invalid("config.metadata is required".into());
    };
    let limits = crate::cri_limits::check_name("config.metadata.name", &metadata.name)
        .and_then(|()| crate::cri_limits::check_labels("config.labels", &config.labels));
    if let Err(message) = limits {
        return invalid(message);
    }
    let image = config.image.as_ref().map(|i| i.image.as_str()).unwrap_or_default();
    if image.is_empty() {
        return invalid("config.image.image is required".into());
    }
    if image.len() > 4096 {
        return invalid(format!(
            "config.image.image is {} bytes long (at most 4096)",
            image.len()
        ));
    }
    no_nul("config.image.image", image)?;
    for arg in config.command.iter().chain(&config.args) {
        no_nul("config.command/args", arg)?;
    }
    if !config.working_dir.is_empty() {
        absolute("config.working_dir", &config.working_dir)?;
    }
    for env in &config.envs {
        if env.key.is_empty() || env.key.contains('=') {
            return invalid(format!("environment variable name {:?} is not valid", env.key));
        }
        no_nul("an environment variable", &env.key)?;
        if env.value.contains(&0) {
            return invalid(format!("environment variable {:?} contains a NUL byte", env.key));
        }
    }
    for mount in &config.mounts {
        absolute("mount container_path", &mount.container_path)?;
        // An image volume names an image instead of a host path.
        if !mount.host_path.is_empty() || mount.image.is_none() {
            absolute("mount host_path", &mount.host_path)?;
        }
        if api::MountPropagation::try_from(mount.propagation).is_err() {
            return invalid(format!(
                "mount {:?}: propagation {} is not a MountPropagation",
                mount.container_path, mount.propagation
            ));
        }
    }
    for device in &config.devices {
        absolute("device container_path", &device.container_path)?;
        absolute("device host_path", &device.host_path)?;
        if !device.permissions.chars().all(|c| matches!(c, 'r' | 'w' | 'm')) {
            return invalid(format!(
                "device {:?}: permissions {:?} are not a combination of r, w and m",
                device.container_path, device.permissions
            ));
        }
    }
    if !config.log_path.is_empty() {
        no_nul("config.log_path", &config.log_path)?;
        if config.log_path.starts_with('/') || config.log_path.split('/').any(|c| c == "..") {
            return invalid(format!(
                "config.log_path {:?} must be relative to the pod's log directory, without \"..\"",
                config.log_path
            ));
        }
    }
    if let Some(linux) = &config.linux {
        if let Some(resources) = &linux.resources {
            validate_resources("CreateContainer", resources)?;
        }
        if let Some(security) = &linux.security_context {
            if let Some(ns) = &security.namespace_options {
                crate::oci::check_namespace_options(ns).map_err(|e| ContainerError::InvalidArgument(e.to_string()))?;
            }
            let profiles = [&security.seccomp, &security.apparmor];
            for profile in profiles.into_iter().flatten() {
                if api::security_profile::ProfileType::try_from(profile.profile_type).is_err() {
                    return invalid(format!("security profile type {} is not known", profile.profile_type));
                }
            }
        }
    }
    Ok(())
}

/// `oci::check_resources`, its message prefixed with the RPC.
pub(super) fn validate_resources(rpc: &str, r: &api::LinuxContainerResources) -> Result<(), ContainerError> {
    crate::oci::check_resources(r).map_err(|e| ContainerError::InvalidArgument(format!("{rpc}: {e}")))
}
