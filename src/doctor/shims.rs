//! Ready pods whose shim is gone or whose pause exited. The running daemon learns of a shim's
//! death from its exit subscription and marks the pod NotReady itself; this finds what that
//! missed (a shim that hangs), and with the daemon stopped, the pods its next start will mark
//! NotReady (it can do that, and send the event the kubelet waits for; doctor cannot).

use std::os::unix::net::UnixStream;
use std::path::Path;

use super::{Finding, Kind};
use crate::sandbox::manager::{shim_dir, SandboxManager, ShimHealth};
use crate::sandbox::record::{SandboxRecord, SandboxState};
use crate::shim_client::SOCKET_FILE;
use crate::store::{self, Store};

/// Through the running daemon: each Ready pod's shim is asked for its pause; with `repair`, a
/// pod whose shim is gone or whose pause exited becomes NotReady (and its STOPPED event goes
/// out); a shim that did not answer is only reported.
pub async fn examine(sandboxes: &SandboxManager, store: &Store, repair: bool) -> Result<Vec<Finding>, store::Error> {
    let mut findings = Vec::new();
    for record in ready(store)? {
        let health = sandboxes.shim_health(&record.id).await;
        let (detail, act) = match health {
            ShimHealth::Running => continue,
            ShimHealth::Gone => ("recorded ready, but its shim is gone", true),
            ShimHealth::PauseExited => ("recorded ready, but its pause exited", true),
            // A loaded node's shim may answer late: reported, not acted on, as the kubelet
            // would kill and recreate a pod that may be healthy.
            ShimHealth::Silent => ("recorded ready, but its shim did not answer in time", false),
        };
        let mut finding = Finding::new(Kind::DeadShim, record.id.clone(), 0, detail);
        if repair && act {
            // A dead shim's pause may still run: it goes too, once the socket confirms the
            // death (a connection that ended is no proof).
            let marked = match health {
                ShimHealth::Gone if sandboxes.shim_gone(&record.id).await => sandboxes.shim_died(&record.id).await,
                _ => sandboxes.pause_exited(&record.id).await,
            };
            match marked {
                Ok(()) => finding.repaired = true,
                Err(e) => finding.detail.push_str(&format!("; not marked NotReady: {e}")),
            }
        }
        findings.push(finding);
    }
    Ok(findings)
}

/// With the daemon stopped: each Ready pod's shim socket must accept a connection.
pub fn examine_stopped(store: &Store, state: &Path) -> Result<Vec<Finding>, store::Error> {
    Ok(ready(store)?
        .into_iter()
        .filter(|record| UnixStream::connect(shim_dir(state, &record.id).join(SOCKET_FILE)).is_err())
        .map(|record| {
            Finding::new(
                Kind::DeadShim,
                record.id,
                0,
                "recorded ready, but no shim answers; the daemon marks it NotReady when it starts",
            )
        })
        .collect())
}

fn ready(store: &Store) -> Result<Vec<SandboxRecord>, store::Error> {
    Ok(store
        .list::<SandboxRecord>()?
        .into_iter()
        .filter(|r| r.state == SandboxState::Ready)
        .collect())
}
