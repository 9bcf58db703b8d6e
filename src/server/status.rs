//! Status: the RuntimeReady and NetworkReady conditions the kubelet gates pods on, the runtime
//! handlers and their features, and (verbose) the effective config and CNI state as JSON.

use std::collections::HashMap;

use super::update_runtime_config::POD_CIDR_SETTING;
use super::{Cri, RpcError};
use crate::api::{
    RuntimeCondition, RuntimeFeatures, RuntimeHandler, RuntimeHandlerFeatures, RuntimeStatus, StatusRequest,
    StatusResponse,
};
use crate::sandbox::cni;

const RUNTIME_READY: &str = "RuntimeReady";
const NETWORK_READY: &str = "NetworkReady";
const REASON_RUNTIME_NOT_READY: &str = "RuntimeNotReady";

impl Cri {
    pub(super) async fn status(&self, request: StatusRequest) -> Result<StatusResponse, RpcError> {
        let runtime = match self.runtime_readiness.not_ready() {
            None => condition(RUNTIME_READY, true, "", ""),
            Some(problem) => condition(RUNTIME_READY, false, REASON_RUNTIME_NOT_READY, &problem.detail),
        };
        let network_probe = self.sandboxes.cni().network();
        let network = match &network_probe {
            Ok(_) => condition(NETWORK_READY, true, "", ""),
            Err(e) => condition(NETWORK_READY, false, cni::REASON_NOT_READY, &e.to_string()),
        };

        // The kubelet relies on these: it runs `hostUsers: false` pods and recursive read-only
        // volumes only on a handler that advertises them. Every handler runs through the same
        // libcontainer path: recursive read-only is mount_setattr(AT_RECURSIVE) there, and a
        // pod user namespace is made by pause and joined by its containers.
        let runtime_handlers = self
            .config
            .handler_names()
            .map(|name| RuntimeHandler {
                name: name.to_string(),
                features: Some(RuntimeHandlerFeatures {
                    recursive_read_only_mounts: true,
                    user_namespaces: true,
                }),
            })
            .collect();

        let mut info = HashMap::new();
        if request.verbose {
            let config = serde_json::to_string(&*self.config).map_err(|e| RpcError::Internal(e.to_string()))?;
            info.insert("config".to_string(), config);
            let (cni_config, cni_status) = match &network_probe {
                Ok(net) => (serde_json::to_string(net).unwrap_or_default(), "OK".to_string()),
                Err(e) => ("{}".to_string(), e.to_string()),
            };
            info.insert("cniconfig".to_string(), cni_config);
            info.insert("lastCNILoadStatus".to_string(), cni_status);
            let store = self.store.clone();
            let pod_cidr: Option<String> =
                tokio::task::spawn_blocking(move || store.get_setting(POD_CIDR_SETTING)).await??;
            let runtime_config = serde_json::json!({ "podCIDR": pod_cidr.unwrap_or_default() });
            info.insert("runtimeConfig".to_string(), runtime_config.to_string());
            let started = self
                .started_at
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs();
            info.insert(
                "daemon".to_string(),
                serde_json::json!({
                    "version": crate::VERSION,
                    "commit": crate::COMMIT,
                    "commitDate": crate::COMMIT_DATE,
                    "pid": std::process::id(),
                    "startedAt": started,
                    "store": self.store.path(),
                    "storeSchemaVersion": crate::store::SCHEMA_VERSION,
                })
                .to_string(),
            );
        }

        Ok(StatusResponse {
            status: Some(RuntimeStatus {
                conditions: vec![runtime, network],
            }),
            info,
            runtime_handlers,
            features: Some(RuntimeFeatures {
                // Merge and Strict are both implemented by the container spec builder.
                supplemental_groups_policy: true,
                user_namespaces_host_network: false,
            }),
        })
    }
}

fn condition(kind: &str, status: bool, reason: &str, message: &str) -> RuntimeCondition {
    RuntimeCondition {
        r#type: kind.to_string(),
        status,
        reason: reason.to_string(),
        message: message.to_string(),
    }
}
