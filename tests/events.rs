//! GetContainerEvents as the kubelet's Evented PLEG sees it: every subscriber gets every event of
//! a container's life in order, with the pod's status and its containers' statuses; exits nobody
//! asks about are reported; subscribing works again after a daemon restart.

mod common;

use std::time::Duration;

use api::ContainerEventType::*;
use common::pod::{container, pod, Pod};
use scute::api;
use tonic::Streaming;

const WAIT: Duration = Duration::from_secs(20);

async fn subscribe(pod: &Pod) -> Streaming<api::ContainerEventResponse> {
    pod.daemon
        .runtime()
        .await
        .get_container_events(api::GetEventsRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// The events about container `id`, up to and including the first of type `last`.
async fn events_until(
    stream: &mut Streaming<api::ContainerEventResponse>,
    id: &str,
    last: api::ContainerEventType,
) -> Vec<api::ContainerEventResponse> {
    let mut seen = Vec::new();
    loop {
        let event = tokio::time::timeout(WAIT, stream.message())
            .await
            .unwrap_or_else(|_| panic!("no {last:?} for {id} within {WAIT:?}; got {seen:?}"))
            .unwrap()
            .expect("the event stream ended");
        if event.container_id == id {
            let done = event.container_event_type() == last;
            seen.push(event);
            if done {
                return seen;
            }
        }
    }
}

fn status_of<'a>(event: &'a api::ContainerEventResponse, id: &str) -> Option<&'a api::ContainerStatus> {
    event.containers_statuses.iter().find(|s| s.id == id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_subscribers_see_create_start_stop_remove_in_order() {
    let pod = pod("events-order").await;
    let mut first = subscribe(&pod).await;
    let mut second = subscribe(&pod).await;

    let id = pod.run(container("sleeper", "sleep 1000")).await;
    let mut runtime = pod.daemon.runtime().await;
    runtime
        .stop_container(api::StopContainerRequest {
            container_id: id.clone(),
            timeout: 1,
        })
        .await
        .unwrap();
    runtime
        .remove_container(api::RemoveContainerRequest {
            container_id: id.clone(),
        })
        .await
        .unwrap();

    for stream in [&mut first, &mut second] {
        let events = events_until(stream, &id, ContainerDeletedEvent).await;
        let types: Vec<_> = events.iter().map(|e| e.container_event_type()).collect();
        assert_eq!(
            types,
            [
                ContainerCreatedEvent,
                ContainerStartedEvent,
                ContainerStoppedEvent,
                ContainerDeletedEvent
            ]
        );
        let mut last_time = 0;
        for event in &events {
            assert!(event.created_at >= last_time, "events out of order: {events:?}");
            last_time = event.created_at;
            let pod_status = event.pod_sandbox_status.as_ref().expect("pod_sandbox_status");
            assert_eq!(pod_status.id, pod.id);
            assert_eq!(pod_status.state(), api::PodSandboxState::SandboxReady);
            assert_eq!(pod_status.metadata.as_ref().unwrap().name, "events-order");
        }
        let states: Vec<_> = events[..3].iter().map(|e| status_of(e, &id).unwrap().state()).collect();
        assert_eq!(
            states,
            [
                api::ContainerState::ContainerCreated,
                api::ContainerState::ContainerRunning,
                api::ContainerState::ContainerExited
            ]
        );
        assert_eq!(
            status_of(&events[0], &id).unwrap().metadata.as_ref().unwrap().name,
            "sleeper"
        );
        // Ended by StopContainer's SIGTERM.
        assert_eq!(status_of(&events[2], &id).unwrap().exit_code, 128 + 15);
        assert!(status_of(&events[3], &id).is_none(), "a removed container still listed");
    }
    // The pod's own events carry its ID as the container's, as containerd sends them.
    pod.remove_all().await;
    let events = events_until(&mut first, &pod.id, ContainerDeletedEvent).await;
    let types: Vec<_> = events.iter().map(|e| e.container_event_type()).collect();
    assert_eq!(types, [ContainerStoppedEvent, ContainerDeletedEvent]);
    let deleted = events[1].pod_sandbox_status.as_ref().expect("the removed pod's status");
    assert_eq!(deleted.metadata.as_ref().unwrap().uid, "uid-events-order");
    assert_eq!(deleted.state(), api::PodSandboxState::SandboxNotready);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exit_nobody_asks_about_is_reported() {
    let pod = pod("events-exit").await;
    let mut events = subscribe(&pod).await;
    let id = pod.run(container("quitter", "sleep 1; exit 3")).await;
    // No RPC from here on: the daemon notices the exit by itself.
    let seen = tokio::time::timeout(
        Duration::from_secs(8),
        events_until(&mut events, &id, ContainerStoppedEvent),
    )
    .await
    .expect("no STOPPED event within a few seconds of the exit");
    let stopped = seen.last().unwrap();
    let status = status_of(stopped, &id).unwrap();
    assert_eq!(status.state(), api::ContainerState::ContainerExited);
    assert_eq!((status.exit_code, status.reason.as_str()), (3, "Error"));
    assert!(status.finished_at > status.started_at);
    // ListContainers asks no shim that pushes its exits: the record it reads is already EXITED.
    let listed = pod.containers().await;
    let listed = listed.iter().find(|c| c.id == id).expect("listed");
    assert_eq!(listed.state(), api::ContainerState::ContainerExited);
    // Reported once: ContainerStatus now sees the stored exit and sends nothing more.
    assert_eq!(pod.status(&id).await.exit_code, 3);
    let again = tokio::time::timeout(Duration::from_secs(2), events.message()).await;
    assert!(again.is_err(), "a second event came: {again:?}");
    pod.remove_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_after_a_daemon_restart_get_events() {
    let mut pod = pod("events-restart").await;
    let id = pod.run(container("late", "sleep 4; exit 7")).await;
    let mut before = subscribe(&pod).await;
    pod.daemon.restart();
    // The old subscription ended with the daemon, without holding up its shutdown.
    assert!(!matches!(before.message().await, Ok(Some(_))));
    assert!(!pod.daemon.log().contains("did not finish"), "{}", pod.daemon.log());
    let mut events = subscribe(&pod).await;
    let stopped = events_until(&mut events, &id, ContainerStoppedEvent).await;
    assert_eq!(stopped.len(), 1, "{stopped:?}");
    assert_eq!(status_of(&stopped[0], &id).unwrap().exit_code, 7);

    let fresh = pod.create(container("fresh", "true")).await.unwrap();
    let created = events_until(&mut events, &fresh, ContainerCreatedEvent).await;
    assert_eq!(created.len(), 1);
    assert_eq!(created[0].pod_sandbox_status.as_ref().unwrap().id, pod.id);
    pod.remove_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_that_exits_by_itself_stops_the_pod_once() {
    let pod = pod("events-pause").await;
    let mut events = subscribe(&pod).await;
    let status = pod
        .daemon
        .runtime()
        .await
        .pod_sandbox_status(api::PodSandboxStatusRequest {
            pod_sandbox_id: pod.id.clone(),
            verbose: true,
        })
        .await
        .unwrap()
        .into_inner();
    let info: serde_json::Value = serde_json::from_str(&status.info["info"]).unwrap();
    let pause = info["pid"].as_i64().unwrap() as i32;
    // Killed from outside (the OOM killer, an operator): no RPC tells the daemon.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pause), nix::sys::signal::Signal::SIGKILL).unwrap();
    let stopped = events_until(&mut events, &pod.id, ContainerStoppedEvent).await;
    assert_eq!(stopped.len(), 1, "{stopped:?}");
    let pod_status = stopped[0].pod_sandbox_status.as_ref().expect("pod_sandbox_status");
    assert_eq!(pod_status.state(), api::PodSandboxState::SandboxNotready);
    // ListPodSandbox reads the record, NotReady since pause's exit was pushed.
    let listed = pod
        .daemon
        .runtime()
        .await
        .list_pod_sandbox(api::ListPodSandboxRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .items;
    let listed = listed.iter().find(|p| p.id == pod.id).expect("listed");
    assert_eq!(listed.state(), api::PodSandboxState::SandboxNotready);
    // The kubelet then stops and removes it: no second STOPPED, one DELETED.
    pod.remove_all().await;
    let rest = events_until(&mut events, &pod.id, ContainerDeletedEvent).await;
    let types: Vec<_> = rest.iter().map(|e| e.container_event_type()).collect();
    assert_eq!(types, [ContainerDeletedEvent]);
}
