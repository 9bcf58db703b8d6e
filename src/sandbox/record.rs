//! The sandbox record kept in the store, and its state machine.
//!
//! ```text
//!   RunPodSandbox ──▶ Ready ──(StopPodSandbox, or pause exited)──▶ NotReady ──RemovePodSandbox──▶ (gone)
//!                      ▲                                               │
//!                      └─────── never: a stopped sandbox is not restarted; the kubelet makes a new one
//!   daemon restart: every sandbox is Unknown (in memory) until its shim answers.
//! ```

use std::collections::HashMap;
use std::path::PathBuf;

use base64::Engine as _;
use prost::Message as _;
use serde::{Deserialize, Serialize};

use crate::api;
use crate::store::{Kind, Record};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SandboxState {
    Ready,
    NotReady,
    /// Only in memory, after a daemon restart, until the shim has been asked.
    Unknown,
}

impl SandboxState {
    /// Ready → NotReady is the only transition a stored sandbox makes.
    pub fn stop(self) -> SandboxState {
        SandboxState::NotReady
    }

    pub fn is_ready(self) -> bool {
        self == SandboxState::Ready
    }

    pub fn to_cri(self) -> api::PodSandboxState {
        match self {
            SandboxState::Ready => api::PodSandboxState::SandboxReady,
            SandboxState::NotReady | SandboxState::Unknown => api::PodSandboxState::SandboxNotready,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxRecord {
    pub id: String,
    /// `<name>_<namespace>_<uid>_<attempt>`, the reservation key.
    pub name: String,
    /// The PodSandboxConfig as the kubelet sent it (prost bytes, base64), so status can give back
    /// every field without a schema change here.
    #[serde(with = "b64")]
    pub config: Vec<u8>,
    pub runtime_handler: String,
    pub created_at: i64,
    pub state: SandboxState,
    pub ips: Vec<String>,
    /// The pinned network namespace; None for host-network pods.
    pub netns: Option<PathBuf>,
    pub pause_pid: u32,
    /// The CNI result of the setup, for CHECK/DEL and verbose status.
    #[serde(default)]
    pub cni_result: Option<serde_json::Value>,
    pub cgroups_path: String,
    /// Set when the create finished after the kubelet stopped waiting: its retry gets this
    /// sandbox instead of a "name reserved" error (CRI-O's resourcestore).
    #[serde(default)]
    pub unclaimed: bool,
    /// The pod network was detached (CNI DEL done, netns removed) by a StopPodSandbox: its
    /// retries and RemovePodSandbox do not run the plugins again, as containerd's do not. Kept
    /// on disk, so a pod whose node rebooted under it (not stopped) still gets its DEL.
    #[serde(default)]
    pub network_released: bool,
}

impl crate::handover::Claimable for SandboxRecord {
    fn unclaimed_mut(&mut self) -> &mut bool {
        &mut self.unclaimed
    }
}

impl Record for SandboxRecord {
    const KIND: Kind = Kind::Sandbox;
    fn id(&self) -> &str {
        &self.id
    }
}

impl SandboxRecord {
    /// Its creation finished: Ready. Only a sandbox being made (NotReady, never stored Ready
    /// before) becomes Ready; a stopped one never comes back.
    pub fn made_ready(&mut self) {
        debug_assert_eq!(self.state, SandboxState::NotReady);
        self.state = SandboxState::Ready;
    }

    /// Ready → NotReady (StopPodSandbox, pause exiting, a pod lost while the daemon was down).
    /// True when this call made the move: the caller reports the sandbox STOPPED, once.
    pub fn stopped(&mut self) -> bool {
        let was_ready = self.state.is_ready();
        self.state = self.state.stop();
        was_ready
    }

    /// The CRI view of the record in `state` (PodSandboxStatus, container events).
    pub fn to_cri_status(&self, state: SandboxState) -> api::PodSandboxStatus {
        let config = self.config();
        let namespace_options = config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.clone());
        let mut ips = self.ips.iter();
        api::PodSandboxStatus {
            id: self.id.clone(),
            metadata: config.metadata.clone(),
            state: state.to_cri() as i32,
            created_at: self.created_at,
            network: Some(api::PodSandboxNetworkStatus {
                ip: ips.next().cloned().unwrap_or_default(),
                additional_ips: ips.map(|ip| api::PodIp { ip: ip.clone() }).collect(),
            }),
            linux: Some(api::LinuxPodSandboxStatus {
                namespaces: Some(api::Namespace {
                    options: namespace_options,
                }),
            }),
            labels: config.labels,
            annotations: config.annotations,
            runtime_handler: self.runtime_handler.clone(),
        }
    }

    pub fn config(&self) -> api::PodSandboxConfig {
        api::PodSandboxConfig::decode(self.config.as_slice()).unwrap_or_default()
    }

    /// The pod's own user namespace, if it has one. Its options were checked when the pod was
    /// made (RunPodSandbox refuses any the runtime cannot give).
    pub fn user_namespace(&self) -> Option<crate::oci::userns::PodUserNs> {
        let ns = self
            .config()
            .linux
            .and_then(|l| l.security_context)
            .and_then(|s| s.namespace_options)
            .unwrap_or_default();
        crate::oci::userns::pod_user_namespace(&ns).ok().flatten()
    }

    pub fn encode_config(config: &api::PodSandboxConfig) -> Vec<u8> {
        config.encode_to_vec()
    }

    /// The CRI view of the record in ListPodSandbox, in `state`. Decodes only the config's
    /// fields it reports: a listing of every pod does this once per pod.
    pub fn to_cri_pod(&self, state: api::PodSandboxState) -> api::PodSandbox {
        let config = ListedPodConfig::decode(self.config.as_slice()).unwrap_or_default();
        api::PodSandbox {
            id: self.id.clone(),
            metadata: config.metadata,
            state: state as i32,
            created_at: self.created_at,
            labels: config.labels,
            annotations: config.annotations,
            runtime_handler: self.runtime_handler.clone(),
        }
    }

    /// The labels ListPodSandbox and ListPodSandboxStats filter on, decoded alone.
    fn labels(&self) -> HashMap<String, String> {
        PodConfigLabels::decode(self.config.as_slice())
            .unwrap_or_default()
            .labels
    }

    /// Whether the pod carries every label of a CRI label selector (an empty one selects every
    /// pod, without decoding anything).
    pub fn matches_labels(&self, selector: &HashMap<String, String>) -> bool {
        selector.is_empty() || {
            let labels = self.labels();
            selector.iter().all(|(k, v)| labels.get(k) == Some(v))
        }
    }
}

pub(crate) mod b64 {
    use super::*;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)
    }
}

/// The kubelet's sandbox name: unique per pod attempt.
pub fn sandbox_name(m: &api::PodSandboxMetadata) -> String {
    format!("{}_{}_{}_{}", m.name, m.namespace, m.uid, m.attempt)
}

/// The fields of a stored PodSandboxConfig (api.proto's tags) that ListPodSandbox reports. prost
/// skips the others (DNS, port mappings, linux, …) without building them, nor checking them: a
/// config corrupt only there still lists, where PodSandboxStatus reports an empty config.
/// Written by hand: prost-build makes whole messages only.
#[derive(prost::Message)]
struct ListedPodConfig {
    #[prost(message, optional, tag = "1")]
    metadata: Option<api::PodSandboxMetadata>,
    #[prost(map = "string, string", tag = "6")]
    labels: HashMap<String, String>,
    #[prost(map = "string, string", tag = "7")]
    annotations: HashMap<String, String>,
}

/// A stored PodSandboxConfig's labels (tag 6) alone, for label selectors.
#[derive(prost::Message)]
struct PodConfigLabels {
    #[prost(map = "string, string", tag = "6")]
    labels: HashMap<String, String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_round_trips_through_json() {
        let config = api::PodSandboxConfig {
            hostname: "web-0".into(),
            metadata: Some(api::PodSandboxMetadata {
                name: "web".into(),
                uid: "u1".into(),
                namespace: "default".into(),
                attempt: 2,
            }),
            labels: HashMap::from([("app".to_string(), "web".to_string())]),
            annotations: HashMap::from([("seen".to_string(), "api".to_string())]),
            port_mappings: vec![api::PortMapping {
                host_port: 8080,
                ..Default::default()
            }],
            linux: Some(Default::default()),
            ..Default::default()
        };
        let record = SandboxRecord {
            id: "abc".into(),
            name: sandbox_name(config.metadata.as_ref().unwrap()),
            config: SandboxRecord::encode_config(&config),
            runtime_handler: String::new(),
            created_at: 1,
            state: SandboxState::Ready,
            ips: vec!["10.88.0.2".into()],
            netns: None,
            pause_pid: 7,
            cni_result: None,
            cgroups_path: "/scute/abc".into(),
            unclaimed: false,
            network_released: false,
        };
        let json = serde_json::to_string(&record).unwrap();
        let back: SandboxRecord = serde_json::from_str(&json).unwrap();
        assert_eq!(back.config(), config);
        assert_eq!(back.name, "web_default_u1_2");
        let listed = back.to_cri_pod(api::PodSandboxState::SandboxReady);
        assert_eq!(
            (listed.metadata, &listed.labels, &listed.annotations),
            (config.metadata.clone(), &config.labels, &config.annotations)
        );
        assert_eq!(back.labels(), config.labels);
        assert!(back.matches_labels(&HashMap::new()));
        assert!(back.matches_labels(&config.labels));
        assert!(!back.matches_labels(&HashMap::from([("app".to_string(), "db".to_string())])));
        assert_eq!((listed.id.as_str(), listed.created_at), ("abc", 1));
        assert_eq!(listed.state, api::PodSandboxState::SandboxReady as i32);
        assert_eq!(SandboxState::Ready.stop(), SandboxState::NotReady);
        assert_eq!(SandboxState::Unknown.to_cri(), api::PodSandboxState::SandboxNotready);
    }

    #[test]
    fn stopped_reports_the_move_once() {
        let mut record: SandboxRecord = serde_json::from_value(serde_json::json!({
            "id": "abc", "name": "n", "config": "", "runtime_handler": "", "created_at": 1,
            "state": "NotReady", "ips": [], "netns": null, "pause_pid": 0, "cni_result": null,
            "cgroups_path": "", "unclaimed": false,
        }))
        .unwrap();
        record.made_ready();
        assert!(record.state.is_ready());
        assert!(record.stopped(), "Ready → NotReady is reported");
        assert!(
            !record.stopped(),
            "a second stop (a retry, or pause exiting too) is not"
        );
        assert_eq!(record.state, SandboxState::NotReady);
    }
}
