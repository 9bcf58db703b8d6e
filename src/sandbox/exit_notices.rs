//! Exits as the shims push them, for the stops waiting on one: StopContainer and StopPodSandbox
//! wake when their container's exit arrives instead of asking the shim on a 10–20 ms tick (the
//! tick decided a stop's latency). `ContainerManager::watch_shim` feeds it; a shim that cannot
//! push is still asked on the tick. It also knows which pods' shims push their exits now: the
//! records of those are current, and listing them needs no round trip to each shim.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

use crate::shim_client::{ContainerStatus, ShimClient};

/// Exits arrive one by one and are looked at at once; a waiter that falls this far behind
/// just asks its shim again.
const BACKLOG: usize = 64;

#[derive(Clone, Debug)]
struct Notice {
    sandbox_id: String,
    container_id: String,
}

pub struct ExitNotices {
    notices: broadcast::Sender<Notice>,
    /// Pods whose shim's exit subscription is live and caught up.
    pushing: Mutex<HashSet<String>>,
}

impl Default for ExitNotices {
    fn default() -> Self {
        ExitNotices {
            notices: broadcast::channel(BACKLOG).0,
            pushing: Mutex::default(),
        }
    }
}

impl ExitNotices {
    /// The shim of `sandbox_id` pushes its exits from now on (subscribed, and the exits from
    /// before the subscription caught up on), or no longer (`false`: the subscription ended).
    pub fn set_pushing(&self, sandbox_id: &str, pushing: bool) {
        let mut set = self.pushing.lock().unwrap_or_else(|e| e.into_inner());
        if pushing {
            set.insert(sandbox_id.to_string());
        } else {
            set.remove(sandbox_id);
        }
    }

    /// Whether the records of `sandbox_id`'s containers follow their exits as they happen.
    pub fn is_pushing(&self, sandbox_id: &str) -> bool {
        self.pushing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(sandbox_id)
    }

    /// A shim pushed the exit of `container_id` (pause's too) in pod `sandbox_id`.
    pub fn seen(&self, sandbox_id: &str, container_id: &str) {
        // No waiter is the common case: nothing to do.
        let _ = self.notices.send(Notice {
            sandbox_id: sandbox_id.to_string(),
            container_id: container_id.to_string(),
        });
    }

    /// Asks `shim` for `container_id`'s state until it no longer runs (true) or `timeout` passed
    /// (false), waking when its exit is pushed and at least every `tick` (a shim that cannot
    /// push). StopContainer's and StopPodSandbox's wait.
    pub async fn until_not_running(
        &self,
        shim: &ShimClient,
        container_id: &str,
        timeout: Duration,
        tick: Duration,
    ) -> bool {
        let deadline = Instant::now() + timeout;
        // Watched before the first question: an exit between answer and wait is not missed.
        let mut exit = self.watch(shim.sandbox_id(), container_id);
        loop {
            match shim.state(container_id).await {
                Ok(s) if s.status == ContainerStatus::Running => {}
                _ => return true,
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            exit.next(tick.min(deadline - now)).await;
        }
    }

    /// Watches for one container's exit from now on.
    fn watch(&self, sandbox_id: &str, container_id: &str) -> ExitWatch {
        ExitWatch {
            notices: self.notices.subscribe(),
            sandbox_id: sandbox_id.to_string(),
            container_id: container_id.to_string(),
        }
    }
}

struct ExitWatch {
    notices: broadcast::Receiver<Notice>,
    sandbox_id: String,
    container_id: String,
}

impl ExitWatch {
    /// Returns when the container's exit is pushed, when pushes were missed (fallen behind), or
    /// after `tick`, whichever comes first: the caller then asks the shim.
    async fn next(&mut self, tick: Duration) {
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
