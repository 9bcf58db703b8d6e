//! The image record kept in the store, one per image ID (the config digest), with every name
//! (RepoTag, RepoDigest) that points at it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::distribution::digest::Digest;
use crate::store::{Kind, Record};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageRecord {
    /// The config digest, `sha256:…`: the image ID crictl shows.
    pub id: Digest,
    pub repo_tags: Vec<String>,
    pub repo_digests: Vec<String>,
    pub manifest_digest: Digest,
    pub manifest_media_type: String,
    /// The index (manifest list) the manifest was picked from, if any.
    #[serde(default)]
    pub index_digest: Option<Digest>,
    pub layers: Vec<LayerRecord>,
    /// Compressed layers + config, as containerd reports `size`.
    pub size: u64,
    pub config: ImageConfig,
    /// The full config JSON is in the content store under `id`; these are the fields runtime
    /// code needs without parsing it again.
    pub pinned: bool,
    /// Unix nanoseconds of the first pull.
    pub created_at: i64,
    /// The runtime handlers it was pulled for (KEP-4216, RuntimeClass-scoped images). scute has
    /// one snapshotter, so the content is shared; this says which runtime classes asked for it.
    /// Empty (a record from before) means the default handler only.
    #[serde(default)]
    pub runtime_handlers: Vec<String>,
    /// Set for an OCI artifact (not a runnable image): its files, in its one snapshot.
    #[serde(default)]
    pub artifact: Option<Artifact>,
}

/// What an OCI artifact holds (see `image::artifact`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Artifact {
    /// The manifest's artifactType (or its config's media type).
    pub artifact_type: String,
    pub files: Vec<ArtifactFile>,
}

/// One layer of an artifact: a file of its snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArtifactFile {
    pub name: String,
    pub digest: Digest,
    pub size: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerRecord {
    pub digest: Digest,
    pub diff_id: Digest,
    pub chain_id: Digest,
    pub size: u64,
    pub media_type: String,
}

/// The parts of the OCI image config that CRI and container creation use.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ImageConfig {
    pub user: String,
    pub env: Vec<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub working_dir: String,
    pub labels: BTreeMap<String, String>,
    pub stop_signal: String,
    pub exposed_ports: Vec<String>,
    pub volumes: Vec<String>,
    pub os: String,
    pub architecture: String,
}

impl Record for ImageRecord {
    const KIND: Kind = Kind::Image;
    fn id(&self) -> &str {
        self.id.as_str()
    }
}

impl ImageRecord {
    /// The runtime handlers it was pulled for, the default one ("") for an older record.
    pub fn handlers(&self) -> Vec<String> {
        if self.runtime_handlers.is_empty() {
            vec![String::new()]
        } else {
            self.runtime_handlers.clone()
        }
    }

    /// The chain ID of the top layer: the snapshot a container's rootfs is built on.
    pub fn top_chain_id(&self) -> Option<&Digest> {
        self.layers.last().map(|l| &l.chain_id)
    }

    /// Every content blob this image holds on to.
    pub fn blobs(&self) -> impl Iterator<Item = &Digest> {
        [&self.id, &self.manifest_digest]
            .into_iter()
            .chain(self.index_digest.iter())
            .chain(self.layers.iter().map(|l| &l.digest))
            .chain(self.artifact.iter().flat_map(|a| a.files.iter().map(|f| &f.digest)))
    }

    pub fn has_name(&self) -> bool {
        !self.repo_tags.is_empty() || !self.repo_digests.is_empty()
    }
}

/// The user an image runs as, split the way CRI reports it: a numeric user is `uid`, a name is
/// `username`; the group part is not reported (critest: USER 1003:1004 → uid 1003).
pub fn image_user(user: &str) -> (Option<i64>, String) {
    let user = user.split(':').next().unwrap_or("");
    if user.is_empty() {
        return (None, String::new());
    }
    match user.parse::<i64>() {
        Ok(uid) => (Some(uid), String::new()),
        Err(_) => (None, user.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::image_user;

    #[test]
    fn users_as_critest_expects() {
        assert_eq!(image_user("1002"), (Some(1002), String::new()));
        assert_eq!(image_user("www-data"), (None, "www-data".into()));
        assert_eq!(image_user("1003:1004"), (Some(1003), String::new()));
        assert_eq!(image_user("www-data:1004"), (None, "www-data".into()));
        assert_eq!(image_user(""), (None, String::new()));
    }
}
