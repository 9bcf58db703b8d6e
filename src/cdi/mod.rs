//! CDI (Container Device Interface) devices: the spec files vendors (DRA drivers, device plugins,
//! their setup tools) put in `[cdi] spec_dirs`, and the edits a container asking for their
//! devices gets.
//!
//! Validating a spec (schema, versions, names) and applying edits to an OCI spec are the CDI
//! project's crate (`container-device-interface`). Written here, because the crate's do not fit
//! a daemon: the directory scan (the crate's stops at the first broken file, hiding every valid
//! spec after it, where the CDI spec and the Go library containerd and CRI-O use report the file
//! and go on; and it re-reads every file on every lookup), reading a file (bounded, never
//! blocking on a FIFO or device), and what is kept of a loaded spec (the crate's `Device` holds a
//! copy of its whole spec file, so a file of N devices would be held N times).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use container_device_interface as cdi;
use oci_spec::runtime::Spec;
use serde::Deserialize;

use crate::config::CdiConfig;

#[cfg(test)]
mod tests;

/// Older device plugins ask for CDI devices with annotations under this prefix, each value a
/// comma-separated list of fully-qualified names (the CDI project's convention).
pub const ANNOTATION_PREFIX: &str = "cdi.k8s.io/";

/// A spec file bigger than this is refused: vendors' specs are kilobytes, and a file this size
/// in a spec directory is a mistake, not a device.
const MAX_SPEC_FILE: u64 = 4 << 20;

/// The crate builds every device of a file with a copy of the whole file while validating it:
/// a file whose devices × bytes pass this is refused before that (a vendor's spec of 8 GPUs and
/// their MIG slices is well under a megabyte of copies).
const MAX_EXPANDED: u64 = 64 << 20;

/// A file changed this close to the last scan may have changed again within the same mtime
/// tick, unseen: it is re-read until it is older (git's "racily clean" rule).
const RACY: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error("CDI devices {0} requested, but CDI is disabled in scute's config ([cdi] enabled = false)")]
    Disabled(String),
    #[error(
        "unresolvable CDI devices {names}: no CDI spec in {dirs} defines them{skipped} (a CDI device is named vendor.com/class=name)"
    )]
    Unresolvable {
        names: String,
        dirs: String,
        skipped: String,
    },
    #[error("ambiguous CDI devices: {0} (each is defined twice at the same priority)")]
    Ambiguous(String),
    #[error(
        "annotation {key:?} does not name CDI devices: {value:?} (a comma-separated list of vendor.com/class=name)"
    )]
    Annotation { key: String, value: String },
    /// In a pod with a user namespace libcontainer cannot make device nodes: it bind-mounts the
    /// host's node at the container path, which for a node the spec renames is another device,
    /// or none.
    #[error(
        "CDI device {name} puts host device nodes at other paths ({paths}), which a pod with a user namespace cannot have: libcontainer binds the host's node at the container's path"
    )]
    UserNamespace { name: String, paths: String },
    /// The spec's edits cannot be made on this host (a device node whose host path is missing or
    /// is no device, an edit that conflicts with the container's spec).
    #[error("applying CDI devices {names}: {message}")]
    Apply { names: String, message: String },
}

/// One spec file as the last scan found it.
#[derive(Debug, Clone)]
pub struct SpecFile {
    pub path: PathBuf,
    /// `vendor.com/class`, or None when the file could not be loaded.
    pub kind: Option<String>,
    /// Fully-qualified names of its devices.
    pub devices: Vec<String>,
    /// Why the file was skipped.
    pub error: Option<String>,
}

/// A spec file's part every device of it shares.
struct LoadedFile {
    path: String,
    /// Spec-wide edits, applied once per container whichever of its devices it asks for.
    edits: Option<cdi::container_edits::ContainerEdits>,
    /// Container paths of spec-wide device nodes whose host path differs.
    renamed: Vec<String>,
}

/// What `inject` needs of one device.
struct Known {
    edits: cdi::container_edits::ContainerEdits,
    /// Container paths of its device nodes whose host path differs.
    renamed: Vec<String>,
    file: Arc<LoadedFile>,
}

/// The identity of a candidate file: changed when any of these does.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    path: PathBuf,
    size: u64,
    inode: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

/// What a scan of the spec directories found: every file (loaded or broken), the devices by
/// qualified name, and the names defined twice at one priority.
#[derive(Default)]
struct Scan {
    /// The candidate files and when they were read; None before the first scan.
    fingerprint: Option<(Vec<Stamp>, SystemTime)>,
    files: Vec<SpecFile>,
    devices: BTreeMap<String, Known>,
    /// Name → the files defining it at the same priority.
    ambiguous: BTreeMap<String, BTreeSet<String>>,
}

/// The node's CDI devices. One per daemon; shared by the container manager and `scute check`.
pub struct CdiRegistry {
    enabled: bool,
    dirs: Vec<PathBuf>,
    scan: Mutex<Scan>,
}

impl CdiRegistry {
    /// Reads the spec directories once (logging what is there and what is broken) when enabled.
    pub fn new(config: &CdiConfig) -> CdiRegistry {
        let registry = CdiRegistry {
            enabled: config.enabled,
            dirs: config.spec_dirs.clone(),
            scan: Mutex::new(Scan::default()),
        };
        if registry.enabled {
            registry.refresh(&mut registry.scan.lock().unwrap_or_else(|e| e.into_inner()));
        }
        registry
    }

    /// The spec files of the spec directories as they are now (re-read if anything changed).
    pub fn files(&self) -> Vec<SpecFile> {
        let mut scan = self.scan.lock().unwrap_or_else(|e| e.into_inner());
        self.refresh(&mut scan);
        scan.files.clone()
    }

    /// Devices defined twice at one priority (refused until one definition goes), with the
    /// files defining them.
    pub fn ambiguous(&self) -> Vec<(String, Vec<String>)> {
        let mut scan = self.scan.lock().unwrap_or_else(|e| e.into_inner());
        self.refresh(&mut scan);
        scan.ambiguous
            .iter()
            .map(|(name, files)| (name.clone(), files.iter().cloned().collect()))
            .collect()
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// The CDI device names a container asks for: `CDI_devices` then the `cdi.k8s.io/`
    /// annotations (by key), each once, in that order.
    pub fn requested(
        cdi_devices: &[crate::api::CdiDevice],
        annotations: &std::collections::HashMap<String, String>,
    ) -> Result<Vec<String>, CdiError> {
        let mut names: Vec<String> = cdi_devices.iter().map(|d| d.name.clone()).collect();
        let sorted: BTreeMap<&String, &String> = annotations.iter().collect();
        for (key, value) in sorted {
            if !key.starts_with(ANNOTATION_PREFIX) {
                continue;
            }
            // The crate's parser checks each name is fully qualified.
            let one = std::collections::HashMap::from([(key.clone(), value.clone())]);
            let (_, devices) = cdi::annotations::parse_annotations(&one).map_err(|_| CdiError::Annotation {
                key: key.clone(),
                value: value.clone(),
            })?;
            names.extend(devices);
        }
        let mut seen = HashSet::new();
        names.retain(|n| seen.insert(n.clone()));
        Ok(names)
    }

    /// Applies the edits of `names` (spec-wide edits once per spec, then each device's) to
    /// `spec`. Every name must resolve to exactly one device: nothing is ever dropped. `userns`:
    /// the pod has a user namespace.
    pub fn inject(&self, spec: &mut Spec, names: &[String], userns: bool) -> Result<(), CdiError> {
        if names.is_empty() {
            return Ok(());
        }
        if !self.enabled {
            return Err(CdiError::Disabled(names.join(", ")));
        }
        let mut scan = self.scan.lock().unwrap_or_else(|e| e.into_inner());
        self.refresh(&mut scan);
        let mut devices = Vec::new();
        let mut unresolved = Vec::new();
        let mut ambiguous = Vec::new();
        for name in names {
            if let Some(files) = scan.ambiguous.get(name) {
                let files: Vec<_> = files.iter().map(String::as_str).collect();
                ambiguous.push(format!("{name} (in {})", files.join(" and ")));
            } else {
                match scan.devices.get(name) {
                    Some(known) => devices.push((name, known)),
                    None => unresolved.push(format!("{name:?}")),
                }
            }
        }
        if !ambiguous.is_empty() {
            return Err(CdiError::Ambiguous(ambiguous.join(", ")));
        }
        if !unresolved.is_empty() {
            let broken = scan.files.iter().filter(|f| f.error.is_some()).count();
            return Err(CdiError::Unresolvable {
                names: unresolved.join(", "),
                dirs: self
                    .dirs
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                skipped: if broken > 0 {
                    format!(" ({broken} broken spec files were skipped: `scute check` lists them)")
                } else {
                    String::new()
                },
            });
        }
        if userns {
            for (name, known) in &devices {
                let paths: Vec<&str> = known
                    .renamed
                    .iter()
                    .chain(&known.file.renamed)
                    .map(String::as_str)
                    .collect();
                if !paths.is_empty() {
                    return Err(CdiError::UserNamespace {
                        name: name.to_string(),
                        paths: paths.join(", "),
                    });
                }
            }
        }
        let apply_failed = |message: String| CdiError::Apply {
            names: names.join(", "),
            message,
        };
        let mut edits = cdi::container_edits::ContainerEdits::new();
        let mut files_seen = HashSet::new();
        for (_, known) in devices {
            if files_seen.insert(known.file.path.clone()) {
                if let Some(file_edits) = &known.file.edits {
                    edits
                        .append(file_edits.clone())
                        .map_err(|e| apply_failed(format!("{e:#}")))?;
                }
            }
            edits
                .append(known.edits.clone())
                .map_err(|e| apply_failed(format!("{e:#}")))?;
        }
        edits.apply(spec).map_err(|e| apply_failed(format!("{e:#}")))?;
        // The crate appends a variable the spec already has; the first copy would win for
        // whoever reads the list in order (libcontainer's PATH lookup does): keep one, the last
        // value, where the first was.
        if let Some(process) = spec.process_mut() {
            let env = process.env().clone().unwrap_or_default();
            process.set_env(Some(collapse_env(env)));
        }
        Ok(())
    }

    /// Re-reads the spec directories when a file in them was added, removed or changed.
    fn refresh(&self, scan: &mut Scan) {
        let candidates = self.candidates();
        if let Some((stamps, at)) = &scan.fingerprint {
            let racy = candidates.iter().any(|c| {
                let changed = SystemTime::UNIX_EPOCH
                    + Duration::new(c.ctime.0.max(0) as u64, c.ctime.1.clamp(0, 999_999_999) as u32);
                changed + RACY > *at
            });
            if *stamps == candidates && !racy {
                return;
            }
        }
        let mut fresh = Scan {
            fingerprint: Some((candidates.clone(), SystemTime::now())),
            ..Scan::default()
        };
        // Name → (priority, path) of the definition in use.
        let mut owners: BTreeMap<String, (usize, String)> = BTreeMap::new();
        for (priority, stamp) in &candidates_with_priority(&self.dirs, &candidates) {
            let path = &stamp.path;
            let (kind, devices) = match load(path, *priority) {
                Ok(loaded) => loaded,
                Err(error) => {
                    tracing::warn!(file = %path.display(), %error, "CDI spec skipped");
                    fresh.files.push(SpecFile {
                        path: path.clone(),
                        kind: None,
                        devices: Vec::new(),
                        error: Some(error),
                    });
                    continue;
                }
            };
            let file = path.display().to_string();
            let mut names = Vec::new();
            for (name, known) in devices {
                names.push(name.clone());
                match owners.get(&name) {
                    Some((p, _)) if *p > *priority => continue,
                    Some((p, other)) if *p == *priority => {
                        let files = fresh.ambiguous.entry(name.clone()).or_default();
                        files.insert(other.clone());
                        files.insert(file.clone());
                        continue;
                    }
                    _ => {}
                }
                // A later directory overrides the same name, and clears an ambiguity below it.
                fresh.ambiguous.remove(&name);
                owners.insert(name.clone(), (*priority, file.clone()));
                fresh.devices.insert(name, known);
            }
            fresh.files.push(SpecFile {
                path: path.clone(),
                kind: Some(kind),
                devices: names,
                error: None,
            });
        }
        for (name, files) in &fresh.ambiguous {
            tracing::warn!(device = %name, files = ?files, "CDI device defined twice at the same priority: refused");
            fresh.devices.remove(name);
        }
        tracing::info!(
            files = fresh.files.len(),
            devices = fresh.devices.len(),
            broken = fresh.files.iter().filter(|f| f.error.is_some()).count(),
            "CDI spec directories read"
        );
        *scan = fresh;
    }

    /// The `.json` and `.yaml` regular files directly in the spec directories (as the CDI spec
    /// says: sub-directories are not scanned), in directory order then by name.
    fn candidates(&self) -> Vec<Stamp> {
        let mut out = Vec::new();
        for dir in &self.dirs {
            let Ok(entries) = std::fs::read_dir(dir) else { continue };
            let mut files: Vec<_> = entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| cdi::utils::is_cdi_spec(p))
                .filter_map(|path| {
                    let md = std::fs::metadata(&path).ok().filter(|m| m.is_file())?;
                    Some(Stamp {
                        size: md.len(),
                        inode: md.ino(),
                        mtime: (md.mtime(), md.mtime_nsec()),
                        ctime: (md.ctime(), md.ctime_nsec()),
                        path,
                    })
                })
                .collect();
            files.sort_by(|a, b| a.path.cmp(&b.path));
            out.extend(files);
        }
        out
    }
}

/// Each candidate with the index of its directory (later directories win).
fn candidates_with_priority(dirs: &[PathBuf], candidates: &[Stamp]) -> Vec<(usize, Stamp)> {
    candidates
        .iter()
        .map(|c| {
            let priority = dirs
                .iter()
                .rposition(|d| c.path.parent() == Some(d.as_path()))
                .unwrap_or(0);
            (priority, c.clone())
        })
        .collect()
}

/// The shape of a spec file, read before the crate builds it: how many devices, and which
/// device nodes have a host path of their own.
#[derive(Deserialize, Default)]
#[serde(default)]
struct Shape {
    devices: Vec<ShapeDevice>,
    #[serde(rename = "containerEdits")]
    container_edits: ShapeEdits,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ShapeDevice {
    name: String,
    #[serde(rename = "containerEdits")]
    container_edits: ShapeEdits,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ShapeEdits {
    #[serde(rename = "deviceNodes")]
    device_nodes: Vec<ShapeNode>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ShapeNode {
    path: String,
    #[serde(rename = "hostPath")]
    host_path: Option<String>,
}

impl ShapeEdits {
    fn renamed(&self) -> Vec<String> {
        self.device_nodes
            .iter()
            .filter(|n| n.host_path.as_ref().is_some_and(|h| *h != n.path))
            .map(|n| n.path.clone())
            .collect()
    }
}

/// Reads, validates (the crate) and keeps what `inject` needs of one spec file: its
/// `vendor/class` and its devices by qualified name.
/// How many devices the spec file at `path` defines, or why it is refused (for the fuzz target).
pub(crate) fn devices_in(path: &Path) -> Result<usize, String> {
    load(path, 0).map(|(_, devices)| devices.len())
}

fn load(path: &Path, priority: usize) -> Result<(String, Vec<(String, Known)>), String> {
    let bytes = read_bounded(path)?;
    // YAML is a superset of JSON: both kinds of file parse here, as in the crate.
    let shape: Shape = serde_yaml::from_slice(&bytes).map_err(|e| format!("not a CDI spec: {e}"))?;
    let expanded = (shape.devices.len() as u64).saturating_mul(bytes.len() as u64);
    if expanded > MAX_EXPANDED {
        return Err(format!(
            "{} devices in {} bytes: too large to load ({} devices × bytes at most)",
            shape.devices.len(),
            bytes.len(),
            MAX_EXPANDED
        ));
    }
    let raw: cdi::specs::config::Spec = serde_yaml::from_slice(&bytes).map_err(|e| format!("not a CDI spec: {e}"))?;
    let mut spec = cdi::spec::new_spec(&raw, &path.to_path_buf(), priority as i32).map_err(|e| format!("{e:#}"))?;
    let kind = format!("{}/{}", spec.get_vendor(), spec.get_class());
    let file = Arc::new(LoadedFile {
        path: path.display().to_string(),
        edits: spec.edits(),
        renamed: shape.container_edits.renamed(),
    });
    let renamed: BTreeMap<&str, Vec<String>> = shape
        .devices
        .iter()
        .map(|d| (d.name.as_str(), d.container_edits.renamed()))
        .collect();
    let devices = std::mem::take(&mut spec.devices)
        .into_iter()
        .map(|(name, device)| {
            let known = Known {
                edits: device.edits(),
                renamed: renamed.get(name.as_str()).cloned().unwrap_or_default(),
                file: file.clone(),
            };
            (device.get_qualified_name(), known)
        })
        .collect();
    Ok((kind, devices))
}

/// The file's bytes, at most `MAX_SPEC_FILE`: opened without blocking (a FIFO named *.json
/// must not hang the daemon) and checked to be a regular file once open.
fn read_bounded(path: &Path) -> Result<Vec<u8>, String> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| format!("cannot open: {e}"))?;
    let md = file.metadata().map_err(|e| format!("cannot stat: {e}"))?;
    if !md.is_file() {
        return Err("not a regular file".into());
    }
    let mut bytes = Vec::new();
    file.take(MAX_SPEC_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read: {e}"))?;
    if bytes.len() as u64 > MAX_SPEC_FILE {
        return Err(format!("larger than any CDI spec ({MAX_SPEC_FILE} bytes at most)"));
    }
    Ok(bytes)
}

/// One entry per variable, the last value at the first one's place; entries without `=` kept.
fn collapse_env(env: Vec<String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(env.len());
    let mut index: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for entry in env {
        match entry.split_once('=').map(|(k, _)| k.to_string()) {
            Some(key) => match index.get(&key) {
                Some(&i) => out[i] = entry,
                None => {
                    index.insert(key, out.len());
                    out.push(entry);
                }
            },
            None => out.push(entry),
        }
    }
    out
}
