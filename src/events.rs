//! Container events (GetContainerEvents, the kubelet's Evented PLEG): one broadcast channel,
//! every subscriber gets every event. Events are built once, when the state changes, so every
//! subscriber sees the same statuses. Below both managers: the sandbox manager sends its pod's
//! events, the container manager its containers'.

use tokio::sync::{broadcast, watch};

use crate::api;

/// Events a subscriber may fall behind by. One that falls further is told (its stream ends with
/// an error, see `server/container_events.rs`) rather than silently missing events: the kubelet
/// then relists and subscribes again. containerd drops them with only a log line.
pub const BACKLOG: usize = 1024;

/// The statuses of a pod's containers as stored, which every event carries. The sandbox side
/// cannot read container records (containers sit above it): the daemon gives it this reader.
pub type PodContainers = Box<dyn Fn(&str) -> Vec<api::ContainerStatus> + Send + Sync>;

/// An event about `container_id` (the sandbox's own events use its ID, as containerd's do),
/// with its pod's status (None once removed) and the pod's containers' statuses.
pub fn event(
    container_id: &str,
    kind: api::ContainerEventType,
    pod_sandbox_status: Option<api::PodSandboxStatus>,
    containers_statuses: Vec<api::ContainerStatus>,
) -> api::ContainerEventResponse {
    api::ContainerEventResponse {
        container_id: container_id.to_string(),
        container_event_type: kind as i32,
        created_at: scute_sys::clock::now_nanos(),
        pod_sandbox_status,
        containers_statuses,
    }
}

pub struct Events {
    tx: broadcast::Sender<api::ContainerEventResponse>,
    /// Set at daemon shutdown: subscriptions end, so they do not hold up the gRPC server's drain.
    closed: watch::Sender<bool>,
}

impl Default for Events {
    fn default() -> Self {
        Events {
            tx: broadcast::channel(BACKLOG).0,
            closed: watch::channel(false).0,
        }
    }
}

/// Why a subscription yields no more events.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// The daemon shuts down.
    Closed,
    /// The subscriber fell this many events behind.
    Lagged(u64),
}

pub struct Subscription {
    rx: broadcast::Receiver<api::ContainerEventResponse>,
    closed: watch::Receiver<bool>,
}

impl Subscription {
    pub async fn next(&mut self) -> Result<api::ContainerEventResponse, Ended> {
        // Shutdown wins over events still queued.
        tokio::select! {
            biased;
            _ = self.closed.wait_for(|closed| *closed) => Err(Ended::Closed),
            event = self.rx.recv() => match event {
                Ok(event) => Ok(event),
                Err(broadcast::error::RecvError::Lagged(n)) => Err(Ended::Lagged(n)),
                Err(broadcast::error::RecvError::Closed) => Err(Ended::Closed),
            },
        }
    }
}

impl Events {
    pub fn subscribe(&self) -> Subscription {
        Subscription {
            rx: self.tx.subscribe(),
            closed: self.closed.subscribe(),
        }
    }

    /// Nobody to tell: callers skip building the statuses.
    pub fn has_subscribers(&self) -> bool {
        self.tx.receiver_count() > 0
    }

    pub fn send(&self, event: api::ContainerEventResponse) {
        // Err only means nobody subscribes right now.
        let _ = self.tx.send(event);
    }

    /// Ends every subscription (daemon shutdown).
    pub fn close(&self) {
        self.closed.send_replace(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: &str) -> api::ContainerEventResponse {
        api::ContainerEventResponse {
            container_id: id.into(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn every_subscriber_gets_every_event_and_laggards_are_told() {
        let events = Events::default();
        assert!(!events.has_subscribers());
        let (mut a, mut b) = (events.subscribe(), events.subscribe());
        events.send(event("one"));
        assert_eq!(a.next().await.unwrap().container_id, "one");
        assert_eq!(b.next().await.unwrap().container_id, "one");
        for i in 0..BACKLOG + 5 {
            events.send(event(&i.to_string()));
        }
        assert_eq!(a.next().await, Err(Ended::Lagged(5)));
        events.close();
        assert_eq!(b.next().await, Err(Ended::Closed));
    }
}
