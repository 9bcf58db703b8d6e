//! ExecSync: runs a command in a running container and returns its output and exit code. A
//! timeout kills the command; like containerd, that is reported as a DeadlineExceeded error so
//! the kubelet's probe sees a timeout.

use std::time::Duration;

use super::{Cri, RpcError};
use crate::api::{ExecSyncRequest, ExecSyncResponse};

impl Cri {
    pub(super) async fn exec_sync(&self, request: ExecSyncRequest) -> Result<ExecSyncResponse, RpcError> {
        super::required("ExecSync", "container_id", &request.container_id)?;
        tracing::Span::current().record("id", request.container_id.as_str());
        super::check_cmd("ExecSync", &request.cmd)?;
        if request.timeout < 0 {
            return Err(RpcError::InvalidArgument(format!(
                "ExecSync: timeout {} is negative (0: none)",
                request.timeout
            )));
        }
        let timeout = (request.timeout > 0).then(|| Duration::from_secs(request.timeout as u64));
        let result = self
            .containers
            .exec_sync(&request.container_id, request.cmd, timeout)
            .await?;
        if result.timed_out {
            return Err(RpcError::DeadlineExceeded(format!(
                "command timed out after {}s and was killed",
                request.timeout
            )));
        }
        Ok(ExecSyncResponse {
            stdout: result.stdout,
            stderr: result.stderr,
            exit_code: result.exit_code,
        })
    }
}
