//! What libcgroups 0.7's systemd manager leaves undone in a container's scope on a pure cgroup v2
//! host. It turns the spec's resources into unit properties, and has none for the device rules,
//! the hugetlb limits, or any `linux.resources.unified` key but cpu.weight, cpu.max,
//! cpuset.{cpus,mems}, memory.{min,low,high,max} and pids.max: those it drops without a word,
//! so a pod's hugepage limits or an `io.weight` would hold under the cgroupfs driver and not
//! under systemd. runc's systemd manager sets the unit's properties and then writes every
//! resource through its cgroupfs manager; the shim does the same for what is missing, in the
//! scope's directory, after libcontainer made the container (or applied an update) and before
//! any process of it runs user code.
//!
//! systemd manages the io controller itself: a slice it realizes again may have io turned off on
//! the way down (no unit of it asks for IOWeight=), and an `io.weight` written here goes with
//! it. Mapping io.weight to IOWeight= is left undone (libcgroups has no property for it).
//!
//! The files are written here, not through libcgroups' v2 manager: its controllers are private,
//! and its `apply` would also replace the device program with one from the resources given. A
//! controller systemd has not enabled on the scope's path (hugetlb, which systemd does not
//! manage) is enabled from the root down first, as runc's systemd driver does.

use std::path::{Path, PathBuf};

use libcontainer::oci_spec::runtime::{LinuxResources, Spec};

/// The `linux.resources.unified` keys libcgroups' systemd manager turns into unit properties.
const SYSTEMD_UNIFIED: [&str; 9] = [
    "cpu.weight",
    "cpu.max",
    "cpuset.cpus",
    "cpuset.mems",
    "memory.min",
    "memory.low",
    "memory.high",
    "memory.max",
    "pids.max",
];

/// Completes container `id`'s scope (init `pid`, bundle `bundle`) at creation: its device
/// program, hugetlb limits and the other unified keys. Nothing to do on a hybrid or v1 host,
/// where libcgroups' v1 manager writes every controller itself. Fails closed when the scope
/// cannot be found.
pub fn complete(id: &str, pid: i32, bundle: &Path) -> Result<(), String> {
    if !unified_host()? {
        return Ok(());
    }
    let spec = Spec::load(bundle.join("config.json")).map_err(|e| format!("reading the spec: {e}"))?;
    let cgroups_path = spec
        .linux()
        .as_ref()
        .and_then(|l| l.cgroups_path().clone())
        .unwrap_or_default();
    let dir = dir(id, pid, &cgroups_path)?;
    let resources = spec.linux().as_ref().and_then(|l| l.resources().clone());
    let rules = resources.as_ref().and_then(|r| r.devices().clone()).unwrap_or_default();
    crate::devices::attach(&dir, &crate::devices::program(&rules)?)?;
    match resources {
        Some(r) => write_beyond_properties(&dir, &r),
        None => Ok(()),
    }
}

/// An UpdateContainerResources under the systemd driver, for the container whose cgroupsPath
/// is `cgroups_path`: the part of `resources` libcgroups' systemd manager did not apply (see
/// [`complete`]). The device program stays as it is.
pub fn update(id: &str, pid: i32, cgroups_path: &Path, resources: &LinuxResources) -> Result<(), String> {
    if !unified_host()? {
        return Ok(());
    }
    write_beyond_properties(&dir(id, pid, cgroups_path)?, resources)
}

fn unified_host() -> Result<bool, String> {
    match libcgroups::common::get_cgroup_setup() {
        Ok(libcgroups::common::CgroupSetup::Unified) => Ok(true),
        Ok(_) => Ok(false),
        Err(e) => Err(format!("finding the cgroup setup: {e}")),
    }
}

/// The scope's directory: the unified cgroup `pid` is in, if it is the scope `cgroups_path`
/// (the spec's cgroupsPath) names.
fn dir(id: &str, pid: i32, cgroups_path: &Path) -> Result<PathBuf, String> {
    let unit = scope_name(&cgroups_path.to_string_lossy())
        .ok_or_else(|| format!("cgroupsPath {cgroups_path:?} does not name a systemd scope"))?;
    crate::cgroup_v2::dir_named(pid, std::slice::from_ref(&unit))
        .ok_or_else(|| format!("container {id} (pid {pid}) is not in its scope {unit}"))
}

/// The scope libcgroups' systemd manager makes of a `slice:prefix:name` cgroupsPath:
/// `prefix-name.scope` (None for a path naming a slice, or not in that form).
fn scope_name(cgroups_path: &str) -> Option<String> {
    let parts: Vec<&str> = cgroups_path.split(':').collect();
    let (prefix, name) = match parts[..] {
        [_, prefix, name] | [prefix, name] => (prefix, name),
        _ => return None,
    };
    (!name.is_empty() && !name.ends_with(".slice")).then(|| format!("{prefix}-{name}.scope"))
}

/// The files of `resources` that no unit property carries, as (file name, value).
fn files_beyond_properties(resources: &LinuxResources) -> Result<Vec<(String, String)>, String> {
    let mut files = Vec::new();
    for limit in resources.hugepage_limits().iter().flatten() {
        let size = limit.page_size();
        // Part of a file name: "2MB", "1GB" and the like only (the daemon checks it too).
        if size.is_empty() || !size.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(format!("hugepage limit: bad page size {size:?}"));
        }
        files.push((format!("hugetlb.{size}.max"), limit.limit().to_string()));
    }
    let mut unified: Vec<_> = resources.unified().iter().flatten().collect();
    unified.sort();
    for (key, value) in unified {
        if SYSTEMD_UNIFIED.contains(&key.as_str()) {
            continue;
        }
        // The daemon refuses such keys (check_resources); the shim does not rely on it.
        if key.is_empty() || key.contains('/') || key.starts_with('.') {
            return Err(format!("linux.resources.unified: bad key {key:?}"));
        }
        files.push((key.clone(), value.clone()));
    }
    Ok(files)
}

fn write_beyond_properties(dir: &Path, resources: &LinuxResources) -> Result<(), String> {
    for (name, value) in files_beyond_properties(resources)? {
        let path = dir.join(&name);
        if !path.exists() {
            let controller = name.split('.').next().unwrap_or_default();
            enable_down_to(dir, controller)?;
        }
        // Not created: a cgroup file that is not there is no such setting (kernfs answers
        // EACCES to O_CREAT).
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, value.as_bytes()))
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => format!(
                    "{name}: the container's cgroup {} has no such file (no such setting, or its controller is not on this host)",
                    dir.display()
                ),
                _ => format!("writing {value:?} to {}: {e}", path.display()),
            })?;
    }
    Ok(())
}

/// Enables `controller` in the subtree_control of each cgroup from the root down to `dir`'s
/// parent, where the root has it, as runc does for every controller under either driver.
/// systemd enables only the controllers its units ask for (it knows of no hugetlb at all).
fn enable_down_to(dir: &Path, controller: &str) -> Result<(), String> {
    let root = Path::new("/sys/fs/cgroup");
    let has =
        |file: &Path| std::fs::read_to_string(file).is_ok_and(|text| text.split_whitespace().any(|c| c == controller));
    if controller.is_empty() || controller == "cgroup" || !has(&root.join("cgroup.controllers")) {
        return Ok(());
    }
    let below = dir
        .strip_prefix(root)
        .map_err(|_| format!("{} is not under {}", dir.display(), root.display()))?;
    let mut level = root.to_path_buf();
    for component in below.components() {
        let control = level.join("cgroup.subtree_control");
        if !has(&control) {
            std::fs::write(&control, format!("+{controller}"))
                .map_err(|e| format!("enabling the {controller} controller in {}: {e}", control.display()))?;
        }
        level.push(component);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use libcontainer::oci_spec::runtime::{LinuxHugepageLimitBuilder, LinuxResourcesBuilder};

    use super::*;

    #[test]
    fn the_scope_is_named_as_libcgroups_names_it() {
        assert_eq!(
            scope_name("kubepods-besteffort-pod1.slice:scute:c1").as_deref(),
            Some("scute-c1.scope")
        );
        assert_eq!(scope_name(":scute:c1").as_deref(), Some("scute-c1.scope"));
        assert_eq!(scope_name("scute:c1").as_deref(), Some("scute-c1.scope"));
        assert_eq!(scope_name("system.slice:scute:x.slice"), None);
        assert_eq!(scope_name("/kubepods/c1"), None);
    }

    #[test]
    fn only_what_no_property_carries_is_written() {
        let unified: HashMap<String, String> = [
            ("io.weight", "default 300"),
            ("memory.max", "1000000"),
            ("cpu.weight", "5"),
            ("memory.swap.max", "0"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let r = LinuxResourcesBuilder::default()
            .hugepage_limits(vec![LinuxHugepageLimitBuilder::default()
                .page_size("2MB")
                .limit(4i64 << 20)
                .build()
                .unwrap()])
            .unified(unified)
            .build()
            .unwrap();
        assert_eq!(
            files_beyond_properties(&r).unwrap(),
            [
                ("hugetlb.2MB.max", "4194304"),
                ("io.weight", "default 300"),
                ("memory.swap.max", "0")
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
        );
        assert!(files_beyond_properties(&LinuxResources::default()).unwrap().is_empty());
        let bad = LinuxResourcesBuilder::default()
            .unified(HashMap::from([("../cgroup.procs".to_string(), "1".to_string())]))
            .build()
            .unwrap();
        assert!(files_beyond_properties(&bad).is_err());
    }
}
