//! Exits as the shims push them, for the stops waiting on one: StopContainer and StopPodSandbox
//! wake when their container's exit arrives instead of asking the shim on a 10–20 ms tick (the
//! tick decided a stop's latency). `ContainerManager::watch_shim` feeds it; a shim that cannot
//! push is still asked on the tick.

use std::time::Duration;

use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;

/// Exits arrive one by one and are looked at at once; a waiter that falls this far behind
/// just asks its shim again.
const BACKLOG: usize = 64;

#[derive(Clone, Debug)]
struct Notice {
    sandbox_id: String,
    container_id: String,
}

pub struct ExitNotices(broadcast::Sender<Notice>);

impl Default for ExitNotices {
    fn default() -> Self {
        ExitNotices(broadcast::channel(BACKLOG).0)
    }
}

impl ExitNotices {
    /// A shim pushed the exit of `container_id` (pause's too) in pod `sandbox_id`.
    pub fn seen(&self, sandbox_id: &str, container_id: &str) {
        // No waiter is the common case: nothing to do.
        let _ = self.0.send(Notice {
            sandbox_id: sandbox_id.to_string(),
            container_id: container_id.to_string(),
        });
    }

    /// Watches for one container's exit from now on: take it before asking the shim for the
    /// state, so an exit between the answer and the wait is not missed.
    pub fn watch(&self, sandbox_id: &str, container_id: &str) -> ExitWatch {
        ExitWatch {
            notices: self.0.subscribe(),
            sandbox_id: sandbox_id.to_string(),
            container_id: container_id.to_string(),
        }
    }
}

pub struct ExitWatch {
    notices: broadcast::Receiver<Notice>,
    sandbox_id: String,
    container_id: String,
}

impl ExitWatch {
    /// Returns when the container's exit is pushed, when pushes were missed (fallen behind), or
    /// after `tick`, whichever comes first: the caller then asks the shim.
    pub async fn next(&mut self, tick: Duration) {
        let wait = async {
            loop {
                match self.notices.recv().await {
                    Ok(n) if n.sandbox_id == self.sandbox_id && n.container_id == self.container_id => return,
                    Ok(_) => {}
                    Err(RecvError::Lagged(_)) => return,
                    Err(RecvError::Closed) => std::future::pending::<()>().await,
                }
            }
        };
        let _ = tokio::time::timeout(tick, wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_watch_wakes_on_its_own_exit_only() {
        let notices = ExitNotices::default();
        let mut watch = notices.watch("pod", "c1");
        notices.seen("pod", "c2");
        notices.seen("other", "c1");
        let started = tokio::time::Instant::now();
        watch.next(Duration::from_millis(200)).await;
        assert!(
            started.elapsed() >= Duration::from_millis(200),
            "woken by another's exit"
        );
        notices.seen("pod", "c1");
        let started = tokio::time::Instant::now();
        watch.next(Duration::from_secs(10)).await;
        assert!(started.elapsed() < Duration::from_secs(5), "not woken by its exit");
    }
}
