//! The image store's part of `scute doctor`: blobs read back against their digests, partial
//! downloads, snapshot records against their directories and parents, snapshots' files against
//! what was unpacked, and images whose layers are gone or damaged. Repair deletes corrupt and unreferenced blobs, idle partial downloads and
//! directories nothing records, and drops the records of missing snapshots and of the images
//! that used them (the kubelet pulls those again); what a pull in flight or a container holds
//! is never touched.

use std::collections::{HashMap, HashSet};
use std::io::Read;

use sha2::{Digest as _, Sha256};

use super::record::ImageRecord;
use super::{ImageError, ImageManager};
use crate::distribution::digest::Digest;
use crate::doctor::{Depth, Finding, Kind};
use crate::snapshot::SnapshotRecord;

/// Blobs up to this size are documents (manifests, indexes, configs): read back even at
/// Depth::Quick.
const DOCUMENT_MAX: u64 = 4 << 20;

impl ImageManager {
    /// Examines the image store (blocking: call off the async workers).
    pub fn doctor(&self, depth: Depth, repair: bool) -> Result<Vec<Finding>, ImageError> {
        let mut findings = self.check_blobs(depth, repair)?;
        let mut to_drop = Vec::new();
        // Liveness is decided under the lock GC and pulls' leases use.
        {
            let in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
            let images = self.store.list::<ImageRecord>()?;
            let held: HashSet<Digest> = (self.held_snapshots)()?.into_iter().collect();
            let live_blobs: HashSet<&Digest> = images.iter().flat_map(|i| i.blobs()).chain(in_flight.iter()).collect();
            for blob in self.content.list()? {
                if live_blobs.contains(&blob) {
                    continue;
                }
                let size = self.content.size(&blob).unwrap_or(0);
                let mut f = Finding::new(Kind::OrphanBlob, blob.to_string(), size, "no image references it");
                if repair {
                    self.content.delete(&blob)?;
                    f.repaired = true;
                }
                findings.push(f);
            }
            // Kept by the daemon's start: a retry resumes them.
            let drop_ingests = repair && !matches!(depth, Depth::Cheap | Depth::Records);
            for path in self.content.list_ingests()? {
                if let Some(size) = self.content.remove_idle_ingest(&path, drop_ingests)? {
                    let mut f = Finding::new(
                        Kind::PartialDownload,
                        path.display().to_string(),
                        size,
                        "a download cut short; a retry would resume it",
                    );
                    f.repaired = drop_ingests;
                    findings.push(f);
                }
            }
            let base = findings.len();
            let snapshots = self.check_snapshots(&images, &held, &in_flight, depth, repair, &mut to_drop)?;
            findings.extend(snapshots);
            for (at, _) in &mut to_drop {
                *at += base;
            }
        }
        // Damaged images go under the records lock (a concurrent claim cannot write one back),
        // taken after the in_flight lock is released: commit_record takes them the other way.
        if !to_drop.is_empty() {
            let _records = self.records.blocking_lock();
            for (at, id) in to_drop {
                self.store.delete::<ImageRecord>(id.as_str(), None)?;
                findings[at].repaired = true;
            }
        }
        if repair {
            // What the dropped images held is now unreferenced.
            self.collect_garbage()?;
        }
        Ok(findings)
    }

    /// Every blob's bytes against its digest (Full), the documents' and the layers' sizes
    /// (Quick), or nothing (Cheap, Records).
    fn check_blobs(&self, depth: Depth, repair: bool) -> Result<Vec<Finding>, ImageError> {
        if matches!(depth, Depth::Cheap | Depth::Records) {
            return Ok(Vec::new());
        }
        // An artifact's layer record names its manifest with the files' total size: not a blob
        // size to hold it to.
        let declared: HashMap<Digest, u64> = self
            .store
            .list::<ImageRecord>()?
            .into_iter()
            .filter(|i| i.artifact.is_none())
            .flat_map(|i| i.layers.into_iter().map(|l| (l.digest, l.size)))
            .collect();
        let mut findings = Vec::new();
        for blob in self.content.list()? {
            let size = self.content.size(&blob).unwrap_or(0);
            let problem = match declared.get(&blob) {
                Some(want) if *want != size => Some(format!("{size} bytes, its image declares {want}")),
                _ if depth == Depth::Full || size <= DOCUMENT_MAX => {
                    let actual = hash_file(&self.content.blob_path(&blob))?;
                    (actual != blob).then(|| format!("its bytes hash to {actual}"))
                }
                _ => None,
            };
            if let Some(detail) = problem {
                let mut f = Finding::new(Kind::CorruptBlob, blob.to_string(), size, detail);
                if repair {
                    self.content.delete(&blob)?;
                    f.repaired = true;
                }
                findings.push(f);
            }
        }
        Ok(findings)
    }

    fn check_snapshots(
        &self,
        images: &[ImageRecord],
        held: &HashSet<Digest>,
        in_flight: &[Digest],
        depth: Depth,
        repair: bool,
        to_drop: &mut Vec<(usize, Digest)>,
    ) -> Result<Vec<Finding>, ImageError> {
        let mut findings = Vec::new();
        let records = self.store.list::<SnapshotRecord>()?;
        let recorded: HashSet<&Digest> = records.iter().map(|r| &r.chain_id).collect();
        let mut damaged = HashSet::new();
        for record in &records {
            // A pull in flight records its layers in any order: a child before its parent.
            if in_flight.contains(&record.chain_id) {
                continue;
            }
            let problem = if !self.snapshots.exists(&record.chain_id) {
                Some((Kind::MissingSnapshot, "its directory is gone".to_string()))
            } else if let Some(p) = record.parent.as_ref().filter(|p| !recorded.contains(p)) {
                Some((Kind::BrokenChain, format!("its parent {p} has no record")))
            } else {
                record
                    .tally
                    .filter(|_| depth != Depth::Records)
                    .and_then(|want| match self.snapshots.tally(&record.chain_id) {
                        Ok(got) if got == want => None,
                        Ok(got) => Some(format!("it holds {got}; {want} were unpacked")),
                        Err(e) => Some(format!("its files cannot be read: {e}")),
                    })
                    .map(|detail| (Kind::DamagedSnapshot, detail))
            };
            let Some((kind, detail)) = problem else { continue };
            damaged.insert(record.chain_id.clone());
            let mut f = Finding::new(kind, record.chain_id.to_string(), 0, detail);
            if held.contains(&record.chain_id) {
                f.detail.push_str("; a container uses it: remove that container first");
            } else if repair {
                self.store.delete::<SnapshotRecord>(record.chain_id.as_str(), None)?;
                self.snapshots.remove(&record.chain_id)?;
                f.repaired = true;
            }
            findings.push(f);
        }
        for chain in self.snapshots.list_dirs()? {
            if recorded.contains(&chain) || held.contains(&chain) || in_flight.contains(&chain) {
                continue;
            }
            let (bytes, _) = scute_sys::files::dir_usage(&self.snapshots.fs_path(&chain));
            let mut f = Finding::new(Kind::OrphanSnapshot, chain.to_string(), bytes, "no record");
            if repair {
                self.snapshots.remove(&chain)?;
                f.repaired = true;
            }
            findings.push(f);
        }
        for image in images {
            let broken: Vec<&Digest> = image
                .layers
                .iter()
                .map(|l| &l.chain_id)
                .filter(|c| damaged.contains(*c) || !recorded.contains(c))
                .collect();
            if broken.is_empty() {
                continue;
            }
            let name = image.repo_tags.first().cloned().unwrap_or_else(|| image.id.to_string());
            let mut f = Finding::new(
                Kind::DamagedImage,
                name,
                0,
                format!("{} of its layers are gone or damaged", broken.len()),
            );
            if image.repo_tags.iter().any(|t| t == super::pause::EMBEDDED_PAUSE_IMAGE) {
                // Pods need it now, and only a start imports it.
                f.detail
                    .push_str("; the embedded pause image: restart scute to import it again");
            } else if repair {
                to_drop.push((findings.len(), image.id.clone()));
            }
            findings.push(f);
        }
        Ok(findings)
    }
}

fn hash_file(path: &std::path::Path) -> Result<Digest, ImageError> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(Digest::from_hasher(hasher))
}
