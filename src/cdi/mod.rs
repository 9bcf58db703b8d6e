//! CDI (Container Device Interface) devices: the spec files vendors (DRA drivers, device plugins,
//! their setup tools) put in `[cdi] spec_dirs`, and the edits a container asking for their
//! devices gets.
//!
//! Parsing and validating a spec (schema, versions, names) and applying edits to an OCI spec are
//! the CDI project's crate (`container-device-interface`). The directory scan is written here:
//! the crate's own scan stops at the first broken file, which hides every valid spec after it,
//! where the CDI spec (and the Go library containerd and CRI-O use) reports the broken file and
//! goes on; the crate also re-reads every file on every lookup, where a fingerprint of names,
//! sizes and modification times tells us whether anything changed.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use container_device_interface as cdi;
use oci_spec::runtime::Spec;

use crate::config::CdiConfig;

#[cfg(test)]
mod tests;

/// Older device plugins ask for CDI devices with annotations under this prefix, each value a
/// comma-separated list of fully-qualified names (the CDI project's convention).
pub const ANNOTATION_PREFIX: &str = "cdi.k8s.io/";

/// A spec file bigger than this is refused: vendors' specs are kilobytes, and a file this size
/// in a spec directory is a mistake, not a device.
const MAX_SPEC_FILE: u64 = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error("CDI devices {0} requested, but CDI is disabled in scute's config ([cdi] enabled = false)")]
    Disabled(String),
    #[error(
        "unresolvable CDI devices {names}: no CDI spec in {dirs} defines them (a CDI device is named vendor.com/class=name)"
    )]
    Unresolvable { names: String, dirs: String },
    #[error("CDI device {name} is ambiguous: it is defined twice at the same priority, in {files}")]
    Ambiguous { name: String, files: String },
    #[error(
        "annotation {key:?} does not name CDI devices: {value:?} (a comma-separated list of vendor.com/class=name)"
    )]
    Annotation { key: String, value: String },
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

/// What a scan of the spec directories found: every file (loaded or broken), the devices by
/// qualified name, and the names defined twice at one priority.
#[derive(Default)]
struct Scan {
    /// (path, size, mtime) of every candidate file, in scan order, when scanned: unchanged
    /// means no re-read.
    fingerprint: Option<Vec<(PathBuf, u64, Option<SystemTime>)>>,
    files: Vec<SpecFile>,
    devices: BTreeMap<String, cdi::device::Device>,
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
    /// `spec`. Every name must resolve to exactly one device: nothing is ever dropped.
    pub fn inject(&self, spec: &mut Spec, names: &[String]) -> Result<(), CdiError> {
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
        for name in names {
            if let Some(files) = scan.ambiguous.get(name) {
                return Err(CdiError::Ambiguous {
                    name: name.clone(),
                    files: files.iter().cloned().collect::<Vec<_>>().join(" and "),
                });
            }
            match scan.devices.get(name) {
                Some(device) => devices.push(device),
                None => unresolved.push(format!("{name:?}")),
            }
        }
        if !unresolved.is_empty() {
            return Err(CdiError::Unresolvable {
                names: unresolved.join(", "),
                dirs: self
                    .dirs
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        let apply_failed = |message: String| CdiError::Apply {
            names: names.join(", "),
            message,
        };
        let mut edits = cdi::container_edits::ContainerEdits::new();
        let mut specs_seen = HashSet::new();
        for device in devices {
            let mut vendor_spec = device.get_spec();
            if specs_seen.insert(vendor_spec.get_path()) {
                if let Some(spec_edits) = vendor_spec.edits() {
                    edits.append(spec_edits).map_err(|e| apply_failed(format!("{e:#}")))?;
                }
            }
            edits
                .append(device.edits())
                .map_err(|e| apply_failed(format!("{e:#}")))?;
        }
        edits.apply(spec).map_err(|e| apply_failed(format!("{e:#}")))
    }

    /// Re-reads the spec directories when a file in them was added, removed or changed.
    fn refresh(&self, scan: &mut Scan) {
        let candidates = self.candidates();
        if scan.fingerprint.as_ref() == Some(&candidates) {
            return;
        }
        let mut fresh = Scan {
            fingerprint: Some(candidates.clone()),
            ..Scan::default()
        };
        // Name → (priority, path) of the definition in use.
        let mut owners: BTreeMap<String, (usize, String)> = BTreeMap::new();
        for (path, size, _) in &candidates {
            let priority = self.priority_of(path);
            let loaded = if *size > MAX_SPEC_FILE {
                Err(format!(
                    "{size} bytes: larger than any CDI spec ({MAX_SPEC_FILE} bytes at most)"
                ))
            } else {
                cdi::spec::read_spec(path, priority as i32).map_err(|e| format!("{e:#}"))
            };
            let vendor_spec = match loaded {
                Ok(s) => s,
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
            for device in vendor_spec.get_devices().into_values() {
                let name = device.get_qualified_name();
                names.push(name.clone());
                match owners.get(&name) {
                    Some((p, _)) if *p > priority => continue,
                    Some((p, other)) if *p == priority => {
                        let files = fresh.ambiguous.entry(name.clone()).or_default();
                        files.insert(other.clone());
                        files.insert(file.clone());
                        continue;
                    }
                    _ => {}
                }
                // A later directory overrides the same name, and clears an ambiguity below it.
                fresh.ambiguous.remove(&name);
                owners.insert(name.clone(), (priority, file.clone()));
                fresh.devices.insert(name, device);
            }
            fresh.files.push(SpecFile {
                path: path.clone(),
                kind: Some(format!("{}/{}", vendor_spec.get_vendor(), vendor_spec.get_class())),
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

    /// Index of the spec directory holding `path` (later directories win).
    fn priority_of(&self, path: &Path) -> usize {
        self.dirs
            .iter()
            .rposition(|d| path.parent() == Some(d.as_path()))
            .unwrap_or(0)
    }

    /// The `.json` and `.yaml` files directly in the spec directories (as the CDI spec says:
    /// sub-directories are not scanned), with their size and modification time.
    fn candidates(&self) -> Vec<(PathBuf, u64, Option<SystemTime>)> {
        let mut out = Vec::new();
        for dir in &self.dirs {
            let Ok(entries) = std::fs::read_dir(dir) else { continue };
            let mut files: Vec<_> = entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| cdi::utils::is_cdi_spec(p))
                .filter_map(|p| {
                    let md = std::fs::metadata(&p).ok().filter(|m| m.is_file())?;
                    Some((p, md.len(), md.modified().ok()))
                })
                .collect();
            files.sort();
            out.extend(files);
        }
        out
    }
}
