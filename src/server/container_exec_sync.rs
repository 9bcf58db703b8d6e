//! ExecSync: runs a command in a running container and returns its output and exit code. A
//! timeout kills the command; like containerd, that is reported as a DeadlineExceeded error so
//! the kubelet's probe sees a timeout.
//!
//! The reply always fits the caller's message cap: a probe that prints gigabytes still gets its
//! exit code and the start of its output, never a transport error (containerd 1.6 answers
//! "encoded message length too large" there, and the kubelet's probe fails for the wrong reason).

use std::time::Duration;

use super::{Cri, RpcError};
use crate::api::{ExecSyncRequest, ExecSyncResponse};

/// The kubelet receives at most 16 MiB per message (its `maxMsgSize`), whatever we may send.
const KUBELET_MAX_MESSAGE: usize = 16 << 20;
/// Room for the reply's framing: two length-delimited fields (tag + up to 5-byte varint each),
/// the exit code, and gRPC's own 5-byte prefix, with plenty to spare.
const REPLY_OVERHEAD: usize = 1024;

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
        let mut result = self
            .containers
            .exec_sync(&request.container_id, request.cmd, timeout)
            .await?;
        if result.timed_out {
            return Err(RpcError::DeadlineExceeded(format!(
                "command timed out after {}s and was killed",
                request.timeout
            )));
        }
        let budget = self
            .config
            .grpc
            .max_send_message_size
            .min(KUBELET_MAX_MESSAGE)
            .saturating_sub(REPLY_OVERHEAD);
        let (out_cut, err_cut) = fit_output(&mut result.stdout, &mut result.stderr, budget);
        let (out_dropped, err_dropped) = (
            result.stdout_dropped + out_cut as u64,
            result.stderr_dropped + err_cut as u64,
        );
        if out_dropped + err_dropped > 0 {
            tracing::warn!(
                stdout_dropped = out_dropped,
                stderr_dropped = err_dropped,
                "ExecSync output truncated to fit the reply"
            );
        }
        Ok(ExecSyncResponse {
            stdout: result.stdout,
            stderr: result.stderr,
            exit_code: result.exit_code,
        })
    }
}

/// Truncates stdout and stderr (keeping their starts) so together they hold at most `budget`
/// bytes: each gets half, and what one does not use goes to the other. Returns the bytes cut.
fn fit_output(stdout: &mut Vec<u8>, stderr: &mut Vec<u8>, budget: usize) -> (usize, usize) {
    if stdout.len() + stderr.len() <= budget {
        return (0, 0);
    }
    let half = budget / 2;
    let (keep_out, keep_err) = if stdout.len() <= half {
        (stdout.len(), budget - stdout.len())
    } else if stderr.len() <= half {
        (budget - stderr.len(), stderr.len())
    } else {
        (half, budget - half)
    };
    let cut = (stdout.len() - keep_out, stderr.len() - keep_err);
    stdout.truncate(keep_out);
    stderr.truncate(keep_err);
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_fits_the_budget_and_shares_it() {
        let cases = [
            // (stdout, stderr, budget) → kept
            ((10, 10, 100), (10, 10)),
            ((100, 0, 60), (60, 0)),
            ((0, 100, 60), (0, 60)),
            ((100, 100, 60), (30, 30)),
            ((10, 100, 60), (10, 50)),
            ((100, 10, 60), (50, 10)),
        ];
        for ((o, e, budget), want) in cases {
            let (mut out, mut err) = (vec![1u8; o], vec![2u8; e]);
            let cut = fit_output(&mut out, &mut err, budget);
            assert_eq!((out.len(), err.len()), want, "{o}/{e} in {budget}");
            assert_eq!(cut, (o - want.0, e - want.1));
            assert!(out.iter().all(|&b| b == 1) && err.iter().all(|&b| b == 2));
        }
    }

    #[test]
    fn a_full_reply_encodes_under_the_kubelets_cap() {
        use prost::Message;
        let budget = KUBELET_MAX_MESSAGE - REPLY_OVERHEAD;
        let (mut out, mut err) = (vec![b'x'; 16 << 20], vec![b'y'; 16 << 20]);
        fit_output(&mut out, &mut err, budget);
        let reply = ExecSyncResponse {
            stdout: out,
            stderr: err,
            exit_code: -1,
        };
        // gRPC adds a 5-byte prefix to the encoded message.
        assert!(
            reply.encoded_len() + 5 <= KUBELET_MAX_MESSAGE,
            "{}",
            reply.encoded_len()
        );
    }
}
