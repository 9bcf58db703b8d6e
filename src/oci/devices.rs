//! Devices: the CRI's requested host devices, every host device for a privileged container, the
//! device cgroup rules.

use std::collections::HashSet;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use oci_spec::runtime::{
    LinuxDevice, LinuxDeviceBuilder, LinuxDeviceCgroup, LinuxDeviceCgroupBuilder, LinuxDeviceType,
};

use super::{clean_absolute, SpecError};
use crate::api;

/// Directories of /dev that hold no device a privileged container should get (runc's list).
pub(super) const HOST_DEV_SKIP: &[&str] = &[".lxc", ".lxd-mounts", ".mount", ".udev", "fd", "mqueue", "pts", "shm"];

/// A device node as the spec lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct DeviceNode {
    pub(super) path: String,
    pub(super) kind: LinuxDeviceType,
    pub(super) major: u64,
    pub(super) minor: u64,
    pub(super) mode: u32,
    pub(super) uid: u32,
    pub(super) gid: u32,
}

impl DeviceNode {
    fn from_metadata(path: String, md: &std::fs::Metadata) -> Option<DeviceNode> {
        let ft = md.file_type();
        let kind = if ft.is_char_device() {
            LinuxDeviceType::C
        } else if ft.is_block_device() {
            LinuxDeviceType::B
        } else {
            return None;
        };
        Some(DeviceNode {
            path,
            kind,
            major: nix::sys::stat::major(md.rdev()),
            minor: nix::sys::stat::minor(md.rdev()),
            mode: md.mode() & 0o7777,
            uid: md.uid(),
            gid: md.gid(),
        })
    }

    fn spec(&self) -> Result<LinuxDevice, SpecError> {
        Ok(LinuxDeviceBuilder::default()
            .path(&self.path)
            .typ(self.kind)
            .major(self.major as i64)
            .minor(self.minor as i64)
            .file_mode(self.mode)
            .uid(self.uid)
            .gid(self.gid)
            .build()?)
    }
}

/// (linux.devices, linux.resources.devices): deny all, then runc's defaults (or everything for
/// a privileged container, with every host device), then each requested device.
pub(super) fn container_devices(
    requested: &[api::Device],
    privileged: bool,
) -> Result<(Vec<LinuxDevice>, Vec<LinuxDeviceCgroup>), SpecError> {
    let mut nodes = Vec::new();
    let mut rules = vec![device_rule(false, None, None, None, "rwm")?];
    if privileged {
        host_devices(Path::new("/dev"), Path::new("/dev"), "/dev", true, &mut nodes)
            .map_err(|e| SpecError::Host(format!("listing the host's devices: {e}")))?;
        rules.push(device_rule(true, None, None, None, "rwm")?);
    } else {
        rules.extend(default_device_rules()?);
    }
    for d in requested {
        let access = device_access(&d.permissions)?;
        for node in requested_device(d)? {
            rules.push(device_rule(
                true,
                Some(node.kind),
                Some(node.major),
                Some(node.minor),
                &access,
            )?);
            nodes.push(node);
        }
    }
    // A requested device replaces a host device at the same path.
    let mut seen = HashSet::new();
    let mut unique: Vec<DeviceNode> = nodes
        .into_iter()
        .rev()
        .filter(|n| seen.insert(n.path.clone()))
        .collect();
    unique.reverse();
    let devices = unique.iter().map(DeviceNode::spec).collect::<Result<_, _>>()?;
    Ok((devices, rules))
}

/// A device cgroup rule; None is "any" (all types, all majors, all minors).
pub(crate) fn device_rule(
    allow: bool,
    typ: Option<LinuxDeviceType>,
    major: Option<u64>,
    minor: Option<u64>,
    access: &str,
) -> Result<LinuxDeviceCgroup, SpecError> {
    let mut b = LinuxDeviceCgroupBuilder::default().allow(allow).access(access);
    if let Some(typ) = typ {
        b = b.typ(typ);
    }
    if let Some(major) = major {
        b = b.major(major as i64);
    }
    if let Some(minor) = minor {
        b = b.minor(minor as i64);
    }
    Ok(b.build()?)
}

/// runc's allowed devices: mknod of anything, null, zero, full, tty, random, urandom, ptmx, pts.
pub(super) fn default_device_rules() -> Result<Vec<LinuxDeviceCgroup>, SpecError> {
    let (c, b) = (Some(LinuxDeviceType::C), Some(LinuxDeviceType::B));
    let mut rules = vec![
        device_rule(true, c, None, None, "m")?,
        device_rule(true, b, None, None, "m")?,
    ];
    for (major, minor) in [(1, 3), (1, 5), (1, 7), (5, 0), (1, 8), (1, 9), (5, 2)] {
        rules.push(device_rule(true, c, Some(major), Some(minor), "rwm")?);
    }
    rules.push(device_rule(true, c, Some(136), None, "rwm")?);
    Ok(rules)
}

/// "" means "rwm"; otherwise a subset of `rwm`, each letter once.
pub(super) fn device_access(permissions: &str) -> Result<String, SpecError> {
    if permissions.is_empty() {
        return Ok("rwm".into());
    }
    let mut seen = HashSet::new();
    for c in permissions.chars() {
        if !matches!(c, 'r' | 'w' | 'm') || !seen.insert(c) {
            return Err(SpecError::Invalid(format!(
                "device permissions {permissions:?} must be a subset of \"rwm\""
            )));
        }
    }
    Ok(permissions.to_string())
}

/// The device node(s) of a CRI Device: one for a device file, every device below a directory.
pub(super) fn requested_device(d: &api::Device) -> Result<Vec<DeviceNode>, SpecError> {
    if !d.host_path.starts_with('/') {
        return Err(SpecError::Invalid(format!(
            "device host_path {:?} must be an absolute path",
            d.host_path
        )));
    }
    let container = if d.container_path.is_empty() {
        &d.host_path
    } else {
        &d.container_path
    };
    if !container.starts_with('/') {
        return Err(SpecError::Invalid(format!(
            "device container_path {container:?} must be an absolute path"
        )));
    }
    let container = clean_absolute(container);
    let invalid = |e: std::io::Error| SpecError::Invalid(format!("device {}: {e}", d.host_path));
    let host = std::fs::canonicalize(&d.host_path).map_err(invalid)?;
    let md = std::fs::metadata(&host).map_err(invalid)?;
    if md.is_dir() {
        let mut nodes = Vec::new();
        host_devices(&host, &host, &container, false, &mut nodes).map_err(invalid)?;
        return Ok(nodes);
    }
    DeviceNode::from_metadata(container, &md)
        .map(|n| vec![n])
        .ok_or_else(|| SpecError::Invalid(format!("device {} is not a character or block device", d.host_path)))
}

/// Every device below `dir` (not following symlinks), at `prefix` + its path below `root`.
pub(super) fn host_devices(
    root: &Path,
    dir: &Path,
    prefix: &str,
    skip_runc: bool,
    out: &mut Vec<DeviceNode>,
) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.filter_map(Result::ok).collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let Ok(md) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if md.is_dir() {
            if !(skip_runc && HOST_DEV_SKIP.contains(&name.as_ref())) {
                host_devices(root, &path, prefix, skip_runc, out)?;
            }
            continue;
        }
        if skip_runc && name == "console" {
            continue;
        }
        let below = path.strip_prefix(root).unwrap_or(&path);
        let container = format!("{}/{}", prefix.trim_end_matches('/'), below.display());
        if let Some(node) = DeviceNode::from_metadata(container, &md) {
            out.push(node);
        }
    }
    Ok(())
}
