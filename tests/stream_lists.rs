//! The KEP-5825 Stream* list RPCs: StreamPodSandboxes, StreamContainers, StreamContainerStats,
//! StreamPodSandboxStats and StreamImages return exactly what their List* counterparts return for
//! the same filter, over several messages when the objects do not fit one page (4 MiB); over
//! nothing the stream just ends.

mod common;

use common::pod::{container, pod, Pod};
use futures_util::StreamExt as _;
use scute::api;
use scute::api::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

/// Annotations this big make a few objects more than one 4 MiB page.
const BIG: usize = 1536 << 10;

fn big_annotations() -> std::collections::HashMap<String, String> {
    [("big".to_string(), "x".repeat(BIG))].into()
}

/// A client that accepts answers up to the daemon's 16 MiB cap: List* ones, and a pod's stats
/// that carry its containers' big annotations (one object bigger than a page goes alone).
async fn runtime(pod: &Pod) -> RuntimeServiceClient<Channel> {
    pod.daemon.runtime().await.max_decoding_message_size(16 << 20)
}

/// Every message of a server stream, asserting it ends cleanly.
async fn drain<T>(response: Result<tonic::Response<tonic::Streaming<T>>, tonic::Status>) -> Vec<T> {
    let mut stream = response.unwrap().into_inner();
    let mut messages = Vec::new();
    while let Some(message) = stream.next().await {
        messages.push(message.unwrap());
    }
    messages
}

async fn stream_containers(pod: &Pod, filter: api::ContainerFilter) -> Vec<Vec<api::Container>> {
    drain(
        runtime(pod)
            .await
            .stream_containers(api::StreamContainersRequest { filter: Some(filter) })
            .await,
    )
    .await
    .into_iter()
    .map(|m| m.containers)
    .collect()
}

async fn list_containers(pod: &Pod, filter: api::ContainerFilter) -> Vec<api::Container> {
    runtime(pod)
        .await
        .list_containers(api::ListContainersRequest { filter: Some(filter) })
        .await
        .unwrap()
        .into_inner()
        .containers
}

async fn stream_pods(pod: &Pod, filter: api::PodSandboxFilter) -> Vec<Vec<api::PodSandbox>> {
    drain(
        runtime(pod)
            .await
            .stream_pod_sandboxes(api::StreamPodSandboxesRequest { filter: Some(filter) })
            .await,
    )
    .await
    .into_iter()
    .map(|m| m.pod_sandboxes)
    .collect()
}

async fn list_pods(pod: &Pod, filter: api::PodSandboxFilter) -> Vec<api::PodSandbox> {
    runtime(pod)
        .await
        .list_pod_sandbox(api::ListPodSandboxRequest { filter: Some(filter) })
        .await
        .unwrap()
        .into_inner()
        .items
}

async fn stream_container_stats(pod: &Pod, filter: api::ContainerStatsFilter) -> Vec<Vec<String>> {
    drain(
        runtime(pod)
            .await
            .stream_container_stats(api::StreamContainerStatsRequest { filter: Some(filter) })
            .await,
    )
    .await
    .into_iter()
    .map(|m| {
        m.container_stats
            .into_iter()
            .map(|s| s.attributes.unwrap().id)
            .collect()
    })
    .collect()
}

async fn list_container_stats(pod: &Pod, filter: api::ContainerStatsFilter) -> Vec<String> {
    let mut ids: Vec<String> = runtime(pod)
        .await
        .list_container_stats(api::ListContainerStatsRequest { filter: Some(filter) })
        .await
        .unwrap()
        .into_inner()
        .stats
        .into_iter()
        .map(|s| s.attributes.unwrap().id)
        .collect();
    ids.sort();
    ids
}

async fn stream_pod_stats(pod: &Pod, filter: api::PodSandboxStatsFilter) -> Vec<Vec<String>> {
    drain(
        runtime(pod)
            .await
            .stream_pod_sandbox_stats(api::StreamPodSandboxStatsRequest { filter: Some(filter) })
            .await,
    )
    .await
    .into_iter()
    .map(|m| {
        m.pod_sandbox_stats
            .into_iter()
            .map(|s| s.attributes.unwrap().id)
            .collect()
    })
    .collect()
}

async fn list_pod_stats(pod: &Pod, filter: api::PodSandboxStatsFilter) -> Vec<String> {
    let mut ids: Vec<String> = runtime(pod)
        .await
        .list_pod_sandbox_stats(api::ListPodSandboxStatsRequest { filter: Some(filter) })
        .await
        .unwrap()
        .into_inner()
        .stats
        .into_iter()
        .map(|s| s.attributes.unwrap().id)
        .collect();
    ids.sort();
    ids
}

fn sorted(mut ids: Vec<String>) -> Vec<String> {
    ids.sort();
    ids
}

fn labels(key: &str, value: &str) -> std::collections::HashMap<String, String> {
    [(key.to_string(), value.to_string())].into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_rpcs_page_what_list_rpcs_return() {
    let pod = pod("streamlists").await;

    // Over nothing (a filter no object passes), every Stream* ends cleanly without a message.
    let none = "0000000000000000000000000000000000000000000000000000000000000000";
    assert!(stream_containers(
        &pod,
        api::ContainerFilter {
            id: none.into(),
            ..Default::default()
        }
    )
    .await
    .is_empty());
    assert!(stream_pods(
        &pod,
        api::PodSandboxFilter {
            id: none.into(),
            ..Default::default()
        }
    )
    .await
    .is_empty());
    assert!(stream_container_stats(
        &pod,
        api::ContainerStatsFilter {
            id: none.into(),
            ..Default::default()
        }
    )
    .await
    .is_empty());
    assert!(stream_pod_stats(
        &pod,
        api::PodSandboxStatsFilter {
            id: none.into(),
            ..Default::default()
        }
    )
    .await
    .is_empty());
    let images = drain(
        pod.daemon
            .images()
            .await
            .stream_images(api::StreamImagesRequest {
                filter: Some(api::ImageFilter {
                    image: Some(api::ImageSpec {
                        image: "example.invalid/nothing:here".into(),
                        ..Default::default()
                    }),
                }),
            })
            .await,
    )
    .await;
    assert!(images.is_empty(), "{images:?}");

    // Four containers of 1.5 MiB (two to a 4 MiB page) and two small ones.
    let mut big = Vec::new();
    for i in 0..4 {
        let mut config = container(&format!("big{i}"), "exec sleep 3600");
        config.labels = labels("size", "big");
        config.annotations = big_annotations();
        big.push(pod.run(config).await);
    }
    let mut small = Vec::new();
    for i in 0..2 {
        let mut config = container(&format!("small{i}"), "exec sleep 3600");
        config.labels = labels("size", "small");
        small.push(pod.run(config).await);
    }
    // Three more pods of 1.5 MiB each.
    let mut pods = vec![pod.id.clone()];
    for i in 0..3 {
        let mut config = pod.sibling(&format!("streamlists{i}"));
        config.labels = labels("size", "big");
        config.annotations = big_annotations();
        pods.push(pod.run_sandbox(config).await);
    }

    // Containers: every one, over several pages, exactly the List answer in the same order.
    let pages = stream_containers(&pod, Default::default()).await;
    assert!(pages.len() > 1, "6 MiB of containers in {} message(s)", pages.len());
    for page in &pages {
        let message = api::StreamContainersResponse {
            containers: page.clone(),
        };
        let size = prost::Message::encoded_len(&message);
        assert!(!page.is_empty() && size <= 4 << 20, "a page of {size} bytes");
    }
    let streamed: Vec<api::Container> = pages.into_iter().flatten().collect();
    assert_eq!(streamed, list_containers(&pod, Default::default()).await);
    assert_eq!(
        sorted(streamed.iter().map(|c| c.id.clone()).collect()),
        sorted(big.iter().chain(&small).cloned().collect())
    );
    // With filters: labels, then one ID.
    let filter = api::ContainerFilter {
        label_selector: labels("size", "small"),
        ..Default::default()
    };
    let pages = stream_containers(&pod, filter.clone()).await;
    assert_eq!(pages.len(), 1);
    let streamed: Vec<api::Container> = pages.into_iter().flatten().collect();
    assert_eq!(streamed, list_containers(&pod, filter).await);
    assert_eq!(
        sorted(streamed.into_iter().map(|c| c.id).collect()),
        sorted(small.clone())
    );
    let filter = api::ContainerFilter {
        id: big[1].clone(),
        ..Default::default()
    };
    let streamed: Vec<api::Container> = stream_containers(&pod, filter.clone()).await.concat();
    assert_eq!(streamed, list_containers(&pod, filter).await);
    assert_eq!(streamed.len(), 1);

    // Container stats: the same containers, paged too (their attributes carry the annotations).
    let pages = stream_container_stats(&pod, Default::default()).await;
    assert!(
        pages.len() > 1,
        "stats of 6 MiB of containers in {} message(s)",
        pages.len()
    );
    assert_eq!(
        sorted(pages.concat()),
        list_container_stats(&pod, Default::default()).await
    );
    assert_eq!(
        sorted(pages.concat()),
        sorted(big.iter().chain(&small).cloned().collect())
    );
    let filter = api::ContainerStatsFilter {
        label_selector: labels("size", "big"),
        ..Default::default()
    };
    let streamed = sorted(stream_container_stats(&pod, filter.clone()).await.concat());
    assert_eq!(streamed, list_container_stats(&pod, filter).await);
    assert_eq!(streamed, sorted(big.clone()));

    // Pods: four, over several pages.
    let pages = stream_pods(&pod, Default::default()).await;
    assert!(pages.len() > 1, "4.5 MiB of pods in {} message(s)", pages.len());
    let streamed: Vec<api::PodSandbox> = pages.concat();
    assert_eq!(streamed, list_pods(&pod, Default::default()).await);
    assert_eq!(
        sorted(streamed.iter().map(|p| p.id.clone()).collect()),
        sorted(pods.clone())
    );
    let filter = api::PodSandboxFilter {
        label_selector: labels("size", "big"),
        ..Default::default()
    };
    let streamed: Vec<api::PodSandbox> = stream_pods(&pod, filter.clone()).await.concat();
    assert_eq!(streamed, list_pods(&pod, filter).await);
    assert_eq!(
        sorted(streamed.into_iter().map(|p| p.id).collect()),
        sorted(pods[1..].to_vec())
    );

    // Pod stats: the four ready pods, paged.
    let pages = stream_pod_stats(&pod, Default::default()).await;
    assert!(
        pages.len() > 1,
        "stats of 4.5 MiB of pods in {} message(s)",
        pages.len()
    );
    assert_eq!(sorted(pages.concat()), list_pod_stats(&pod, Default::default()).await);
    assert_eq!(sorted(pages.concat()), sorted(pods.clone()));
    let filter = api::PodSandboxStatsFilter {
        id: pod.id.clone(),
        ..Default::default()
    };
    let streamed = sorted(stream_pod_stats(&pod, filter.clone()).await.concat());
    assert_eq!(streamed, list_pod_stats(&pod, filter).await);
    assert_eq!(streamed, vec![pod.id.clone()]);

    // Images: few and small, one message; the same as ListImages, whole and filtered.
    let mut images = pod.daemon.images().await;
    let pages: Vec<Vec<api::Image>> = drain(images.stream_images(api::StreamImagesRequest::default()).await)
        .await
        .into_iter()
        .map(|m| m.images)
        .collect();
    assert_eq!(pages.len(), 1);
    let listed = images
        .list_images(api::ListImagesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .images;
    assert!(listed.len() >= 2, "pause and busybox: {listed:?}");
    assert_eq!(pages.concat(), listed);
    let filter = api::ImageFilter {
        image: Some(api::ImageSpec {
            image: common::pod::BUSYBOX.into(),
            ..Default::default()
        }),
    };
    let streamed: Vec<api::Image> = drain(
        images
            .stream_images(api::StreamImagesRequest {
                filter: Some(filter.clone()),
            })
            .await,
    )
    .await
    .into_iter()
    .flat_map(|m| m.images)
    .collect();
    let listed = images
        .list_images(api::ListImagesRequest { filter: Some(filter) })
        .await
        .unwrap()
        .into_inner()
        .images;
    assert_eq!(streamed.len(), 1);
    assert_eq!(streamed, listed);

    let mut runtime = pod.daemon.runtime().await;
    for id in &pods[1..] {
        runtime
            .stop_pod_sandbox(api::StopPodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })
            .await
            .unwrap();
        runtime
            .remove_pod_sandbox(api::RemovePodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })
            .await
            .unwrap();
    }
    pod.remove_all().await;
}
