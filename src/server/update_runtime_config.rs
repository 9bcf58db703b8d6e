//! UpdateRuntimeConfig: the kubelet sends the node's pod CIDR. It is kept in the store (so it
//! survives restarts) for CNI plugins that take it from the runtime config, and shown in
//! verbose Status.

use super::{Cri, RpcError};
use crate::api::{UpdateRuntimeConfigRequest, UpdateRuntimeConfigResponse};

/// Store key of the pod CIDR the kubelet sent last.
pub(super) const POD_CIDR_SETTING: &str = "pod_cidr";

impl Cri {
    pub(super) async fn update_runtime_config(
        &self,
        request: UpdateRuntimeConfigRequest,
    ) -> Result<UpdateRuntimeConfigResponse, RpcError> {
        let pod_cidr = request
            .runtime_config
            .and_then(|c| c.network_config)
            .map(|n| n.pod_cidr)
            .unwrap_or_default();
        // The kubelet sends an empty CIDR when it has none to give; keep what we have.
        if pod_cidr.is_empty() {
            return Ok(UpdateRuntimeConfigResponse {});
        }
        for cidr in pod_cidr.split(',') {
            validate_cidr(cidr.trim())?;
        }
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.put_setting(POD_CIDR_SETTING, &pod_cidr)).await??;
        Ok(UpdateRuntimeConfigResponse {})
    }
}

/// Accepts `addr/len` for IPv4 and IPv6 (dual-stack CIDRs arrive comma-separated).
fn validate_cidr(cidr: &str) -> Result<(), RpcError> {
    let invalid = || {
        RpcError::InvalidArgument(format!(
            "pod CIDR {cidr:?} is not a valid CIDR (want e.g. 10.88.0.0/16)"
        ))
    };
    let (addr, len) = cidr.split_once('/').ok_or_else(invalid)?;
    let addr: std::net::IpAddr = addr.parse().map_err(|_| invalid())?;
    let len: u8 = len.parse().map_err(|_| invalid())?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    if len > max {
        return Err(invalid());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::validate_cidr;

    #[test]
    fn cidrs() {
        for ok in ["10.88.0.0/16", "fd00::/64", "0.0.0.0/0"] {
            assert!(validate_cidr(ok).is_ok(), "{ok}");
        }
        for bad in ["10.88.0.0", "10.88.0.0/33", "fd00::/129", "x/8", "", "10.0.0.0/-1"] {
            assert!(validate_cidr(bad).is_err(), "{bad}");
        }
    }
}
