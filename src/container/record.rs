//! The container record kept in the store, and its state machine.
//!
//! ```text
//!   CreateContainer ──▶ Created ──StartContainer──▶ Running ──(exit, StopContainer)──▶ Exited ──RemoveContainer──▶ (gone)
//!                          └───────────── RemoveContainer (never started) ─────────────────────────────▶ (gone)
//!   daemon restart: the shim is asked; a Running container that exited meanwhile becomes Exited
//!   with the exit code and time its shim recorded.
//! ```
//!
//! A Created container is its record, its writable layer and its bundle: no mount, no process.
//! StartContainer mounts its rootfs and has the shim make and start its process (as containerd
//! makes its task at StartContainer), so a node holding created containers pays nothing for
//! them. (Records from before kept the process made at CreateContainer: `deferred` is false.)

use std::collections::HashMap;

use prost::Message as _;
use serde::{Deserialize, Serialize};

use crate::api;
use crate::distribution::digest::Digest;
use crate::store::{Kind, Record, Store};

/// The daemon's stored view of a container, in the CRI's words: `Exited` is what the shim
/// protocol calls STOPPED (`shim_client::ContainerStatus`, the one enum the shim and the daemon
/// share). Stored by name, so the names stay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ContainerState {
    Created,
    Running,
    Exited,
}

impl ContainerState {
    pub fn can_start(self) -> bool {
        self == ContainerState::Created
    }

    pub fn to_cri(self) -> api::ContainerState {
        match self {
            ContainerState::Created => api::ContainerState::ContainerCreated,
            ContainerState::Running => api::ContainerState::ContainerRunning,
            ContainerState::Exited => api::ContainerState::ContainerExited,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContainerRecord {
    pub id: String,
    /// `<container>_<pod>_<namespace>_<pod uid>_<attempt>`, the reservation key.
    pub name: String,
    pub sandbox_id: String,
    /// The ContainerConfig as the kubelet sent it (prost bytes, base64).
    #[serde(with = "crate::sandbox::record::b64")]
    pub config: Vec<u8>,
    /// The image as the kubelet named it, and the image ID it resolved to.
    pub image_ref: String,
    pub image_id: Digest,
    /// The name ContainerStatus.image reports (issue 22): what the user asked for, never a bare
    /// ID when a name is known. Empty in records older than the field (the config's is used).
    #[serde(default)]
    pub image_name: String,
    /// The layer snapshots under the container's rootfs: garbage collection keeps them even
    /// if the image itself is removed while the container exists.
    #[serde(default)]
    pub chain_ids: Vec<Digest>,
    /// The images mounted as volumes (KEP-4639), held like the rootfs layers.
    #[serde(default)]
    pub image_volumes: Vec<ImageVolume>,
    pub state: ContainerState,
    pub pid: u32,
    pub created_at: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub exit_code: i32,
    pub reason: String,
    pub message: String,
    /// Full path of the CRI log file, or empty.
    pub log_path: String,
    pub cgroups_path: String,
    /// The identity the process runs as (uid, gid, every group), for ContainerStatus.user.
    #[serde(default)]
    pub user: Option<(u32, u32, Vec<u32>)>,
    /// Set when the create finished after the kubelet stopped waiting: its retry gets this
    /// container instead of a "name reserved" error (see `handover`).
    #[serde(default)]
    pub unclaimed: bool,
    /// Made from this checkpoint ("checkpoint archive PATH" or "checkpoint image NAME": CRI's
    /// restore): its processes are restored by CRIU at StartContainer, so until then it has none
    /// (pid 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_from: Option<String>,
    /// The create finished with its process left to StartContainer (the bundle is written, the
    /// rootfs unmounted). False while a create runs, and in records from before (whose process
    /// was made at CreateContainer).
    #[serde(default)]
    pub deferred: bool,
}

/// An image mounted as a volume: which CRI mount, the image it resolved to, its layers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageVolume {
    /// Index into the config's mounts.
    pub mount: usize,
    pub image_id: Digest,
    pub chain_ids: Vec<Digest>,
}

impl crate::handover::Claimable for ContainerRecord {
    fn unclaimed_mut(&mut self) -> &mut bool {
        &mut self.unclaimed
    }
}

impl Record for ContainerRecord {
    const KIND: Kind = Kind::Container;
    fn id(&self) -> &str {
        &self.id
    }
}

/// The stored statuses of a pod's containers, which every event about the pod carries (an
/// unreadable store gives none, with a warning: an event is not worth failing a transition).
pub fn pod_statuses(store: &Store, sandbox_id: &str) -> Vec<api::ContainerStatus> {
    match store.list::<ContainerRecord>() {
        Ok(records) => records
            .iter()
            .filter(|c| c.sandbox_id == sandbox_id)
            .map(ContainerRecord::to_cri_status)
            .collect(),
        Err(e) => {
            tracing::warn!(sandbox = %sandbox_id, error = %e, "listing containers for an event");
            Vec::new()
        }
    }
}

impl ContainerRecord {
    pub fn config(&self) -> api::ContainerConfig {
        api::ContainerConfig::decode(self.config.as_slice()).unwrap_or_default()
    }

    pub fn encode_config(config: &api::ContainerConfig) -> Vec<u8> {
        config.encode_to_vec()
    }

    /// The ImageSpec ContainerStatus and ListContainers report: the request's, with `image` the
    /// name the kubelet copies into `containerStatuses[].image` (its ID stays in image_ref/image_id).
    fn reported_image(&self, requested: Option<api::ImageSpec>) -> Option<api::ImageSpec> {
        let mut spec = requested?;
        if !self.image_name.is_empty() {
            spec.image = self.image_name.clone();
        }
        Some(spec)
    }

    /// The mounts as the kubelet sent them, an image volume's ImageSpec with the image it
    /// resolved to in `image_ref` (when the kubelet did not say).
    fn reported_mounts(&self, mut mounts: Vec<api::Mount>) -> Vec<api::Mount> {
        for volume in &self.image_volumes {
            if let Some(spec) = mounts.get_mut(volume.mount).and_then(|m| m.image.as_mut()) {
                if spec.image_ref.is_empty() {
                    spec.image_ref = volume.image_id.to_string();
                }
            }
        }
        mounts
    }

    /// Every layer snapshot the container holds: its rootfs's and its image volumes'.
    pub fn held_chains(&self) -> impl Iterator<Item = &Digest> {
        self.chain_ids
            .iter()
            .chain(self.image_volumes.iter().flat_map(|v| v.chain_ids.iter()))
    }

    /// The CRI view of the record in ListContainers. Decodes only the config's fields it
    /// reports: a listing of every container does this once per container.
    pub fn to_cri_container(&self) -> api::Container {
        let config = ListedConfig::decode(self.config.as_slice()).unwrap_or_default();
        api::Container {
            id: self.id.clone(),
            pod_sandbox_id: self.sandbox_id.clone(),
            metadata: config.metadata,
            image: self.reported_image(config.image),
            image_ref: self.image_id.to_string(),
            state: self.state.to_cri() as i32,
            created_at: self.created_at,
            labels: config.labels,
            annotations: config.annotations,
            image_id: self.image_id.to_string(),
        }
    }

    /// The labels ListContainers and ListContainerStats filter on, decoded alone.
    fn labels(&self) -> HashMap<String, String> {
        ConfigLabels::decode(self.config.as_slice()).unwrap_or_default().labels
    }

    /// Whether the container carries every label of a CRI label selector (an empty one selects
    /// every container, without decoding anything).
    pub fn matches_labels(&self, selector: &HashMap<String, String>) -> bool {
        selector.is_empty() || {
            let labels = self.labels();
            selector.iter().all(|(k, v)| labels.get(k) == Some(v))
        }
    }

    /// The CRI view of the record (ContainerStatus, PodSandboxStatus, container events).
    pub fn to_cri_status(&self) -> api::ContainerStatus {
        // Owned, so its fields move into the status.
        let config = self.config();
        api::ContainerStatus {
            id: self.id.clone(),
            metadata: config.metadata,
            state: self.state.to_cri() as i32,
            created_at: self.created_at,
            started_at: self.started_at,
            finished_at: if self.state == ContainerState::Exited {
                self.finished_at
            } else {
                0
            },
            exit_code: self.exit_code,
            image: self.reported_image(config.image),
            image_ref: self.image_id.to_string(),
            image_id: self.image_id.to_string(),
            reason: self.reason.clone(),
            message: self.message.clone(),
            labels: config.labels,
            annotations: config.annotations,
            mounts: self.reported_mounts(config.mounts),
            log_path: self.log_path.clone(),
            resources: config
                .linux
                .and_then(|l| l.resources)
                .map(|linux| api::ContainerResources {
                    linux: Some(linux),
                    ..Default::default()
                }),
            user: self.user.as_ref().map(|(uid, gid, groups)| api::ContainerUser {
                linux: Some(api::LinuxContainerUser {
                    uid: *uid as i64,
                    gid: *gid as i64,
                    supplemental_groups: groups.iter().map(|g| *g as i64).collect(),
                }),
            }),
            stop_signal: config.stop_signal,
        }
    }

    /// Records an exit: reason as the kubelet expects (Completed, Error, OOMKilled).
    /// Created → Running, at `started_at`; refused from any other state.
    pub fn started(&mut self, started_at: i64) -> Result<(), String> {
        if !self.state.can_start() {
            return Err(format!(
                "container {} is {:?}, only a created container can be started",
                self.id, self.state
            ));
        }
        self.state = ContainerState::Running;
        self.started_at = started_at;
        Ok(())
    }

    pub fn exited(&mut self, exit_code: i32, finished_at: i64, oom_killed: bool) {
        self.state = ContainerState::Exited;
        self.exit_code = exit_code;
        self.finished_at = finished_at;
        self.reason = if oom_killed {
            "OOMKilled"
        } else if exit_code == 0 {
            "Completed"
        } else {
            "Error"
        }
        .to_string();
    }
}

/// The kubelet's container name: unique per container attempt in a pod.
pub fn container_name(container: &api::ContainerMetadata, pod: &api::PodSandboxMetadata) -> String {
    format!(
        "{}_{}_{}_{}_{}",
        container.name, pod.name, pod.namespace, pod.uid, container.attempt
    )
}

/// The fields of a stored ContainerConfig (api.proto's tags) that ListContainers reports. prost
/// skips the others (command, envs, mounts, linux, …) without building them, nor checking them:
/// a config corrupt only there still lists, where ContainerStatus reports an empty config.
/// Written by hand: prost-build makes whole messages only.
#[derive(prost::Message)]
struct ListedConfig {
    #[prost(message, optional, tag = "1")]
    metadata: Option<api::ContainerMetadata>,
    #[prost(message, optional, tag = "2")]
    image: Option<api::ImageSpec>,
    #[prost(map = "string, string", tag = "9")]
    labels: HashMap<String, String>,
    #[prost(map = "string, string", tag = "10")]
    annotations: HashMap<String, String>,
}

/// A stored ContainerConfig's labels (tag 9) alone, for label selectors.
#[derive(prost::Message)]
struct ConfigLabels {
    #[prost(map = "string, string", tag = "9")]
    labels: HashMap<String, String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listed_view_reports_what_the_whole_config_says() {
        let kv = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        let config = api::ContainerConfig {
            metadata: Some(api::ContainerMetadata {
                name: "web".into(),
                attempt: 2,
            }),
            image: Some(api::ImageSpec {
                image: "sha256:aaaa".into(),
                annotations: kv(&[("a", "b")]),
                ..Default::default()
            }),
            command: vec!["sleep".into()],
            envs: vec![api::KeyValue {
                key: "K".into(),
                value: "V".into(),
            }],
            mounts: vec![api::Mount {
                container_path: "/data".into(),
                ..Default::default()
            }],
            labels: kv(&[("io.kubernetes.container.name", "web"), ("tier", "front")]),
            annotations: kv(&[("io.kubernetes.container.hash", "1234")]),
            log_path: "web.log".into(),
            linux: Some(Default::default()),
            ..Default::default()
        };
        let digest = Digest::parse(&format!("sha256:{}", "b".repeat(64))).unwrap();
        let record = ContainerRecord {
            id: "c1".into(),
            name: "web_pod_ns_uid_2".into(),
            sandbox_id: "p1".into(),
            config: ContainerRecord::encode_config(&config),
            image_ref: "busybox".into(),
            image_id: digest.clone(),
            image_name: "docker.io/library/busybox:latest".into(),
            chain_ids: Vec::new(),
            image_volumes: Vec::new(),
            state: ContainerState::Running,
            pid: 42,
            created_at: 7,
            started_at: 8,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            log_path: String::new(),
            cgroups_path: String::new(),
            user: None,
            unclaimed: false,
            restored_from: None,
            deferred: true,
        };
        let listed = record.to_cri_container();
        let status = record.to_cri_status();
        assert_eq!(listed.metadata, config.metadata);
        assert_eq!(listed.labels, config.labels);
        assert_eq!(record.labels(), config.labels);
        let selector = |pairs: &[(&str, &str)]| kv(pairs);
        assert!(record.matches_labels(&selector(&[])));
        assert!(record.matches_labels(&selector(&[("tier", "front")])));
        assert!(!record.matches_labels(&selector(&[("tier", "front"), ("app", "x")])));
        assert!(!record.matches_labels(&selector(&[("tier", "back")])));
        assert_eq!(listed.annotations, config.annotations);
        assert_eq!(listed.image, status.image);
        assert_eq!(listed.image.as_ref().unwrap().image, "docker.io/library/busybox:latest");
        assert_eq!(listed.image.unwrap().annotations, kv(&[("a", "b")]));
        assert_eq!(
            (listed.image_id, listed.image_ref),
            (digest.to_string(), digest.to_string())
        );
        assert_eq!(listed.state, api::ContainerState::ContainerRunning as i32);
        assert_eq!(
            (listed.id.as_str(), listed.pod_sandbox_id.as_str(), listed.created_at),
            ("c1", "p1", 7)
        );
    }
}
