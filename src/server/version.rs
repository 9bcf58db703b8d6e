//! Version: runtime name and versions. The kubelet calls it first to learn the CRI version.

use super::{Cri, RpcError};
use crate::api::{VersionRequest, VersionResponse};

/// The version of the kubelet-runtime API (always "0.1.0" in CRI v1, as containerd reports).
const KUBE_RUNTIME_API_VERSION: &str = "0.1.0";

impl Cri {
    pub(super) async fn version(&self, _request: VersionRequest) -> Result<VersionResponse, RpcError> {
        Ok(VersionResponse {
            version: KUBE_RUNTIME_API_VERSION.to_string(),
            runtime_name: crate::RUNTIME_NAME.to_string(),
            runtime_version: crate::VERSION.to_string(),
            runtime_api_version: crate::CRI_API_VERSION.to_string(),
        })
    }
}
