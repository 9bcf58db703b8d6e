//! RuntimeConfig: tells the kubelet (1.36 requires the call) which cgroup driver scute uses, so
//! the kubelet's --cgroup-driver can follow the runtime instead of being set twice.

use super::{Cri, RpcError};
use crate::api::{CgroupDriver, LinuxRuntimeConfiguration, RuntimeConfigRequest, RuntimeConfigResponse};
use crate::config;

impl Cri {
    pub(super) async fn runtime_config(
        &self,
        _request: RuntimeConfigRequest,
    ) -> Result<RuntimeConfigResponse, RpcError> {
        let cgroup_driver = match self.config.runtime.cgroup_driver {
            config::CgroupDriver::Cgroupfs => CgroupDriver::Cgroupfs,
            config::CgroupDriver::Systemd => CgroupDriver::Systemd,
        };
        Ok(RuntimeConfigResponse {
            linux: Some(LinuxRuntimeConfiguration {
                cgroup_driver: cgroup_driver as i32,
            }),
        })
    }
}
