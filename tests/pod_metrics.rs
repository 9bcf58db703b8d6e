//! ListMetricDescriptors / ListPodSandboxMetrics / StreamPodSandboxMetrics as the kubelet's
//! `/metrics/cadvisor` (PodAndContainerStatsFromCRI) consumes them, and UpdatePodSandboxResources
//! (in-place pod resize) on a real pod.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::pod::{container, pod_with, Pod};
use futures_util::StreamExt as _;
use scute::api;
use tonic::Code;

async fn descriptors(pod: &Pod) -> HashMap<String, api::MetricDescriptor> {
    pod.daemon
        .runtime()
        .await
        .list_metric_descriptors(api::ListMetricDescriptorsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .descriptors
        .into_iter()
        .map(|d| (d.name.clone(), d))
        .collect()
}

async fn pod_metrics(pod: &Pod) -> api::PodSandboxMetrics {
    let all = pod
        .daemon
        .runtime()
        .await
        .list_pod_sandbox_metrics(api::ListPodSandboxMetricsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .pod_metrics;
    assert_eq!(all.len(), 1, "one ready pod");
    all.into_iter().next().unwrap()
}

fn find<'a>(metrics: &'a [api::Metric], name: &str) -> &'a api::Metric {
    metrics
        .iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("no {name} in {metrics:?}"))
}

fn value(m: &api::Metric) -> u64 {
    m.value.as_ref().unwrap().value
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cadvisor_metrics_of_a_pod_and_its_containers() {
    let pod = pod_with("podmetrics", Some(vec![])).await;
    let burner = pod.run(container("burner", "while :; do :; done")).await;

    let descriptors = descriptors(&pod).await;
    for name in [
        "container_cpu_usage_seconds_total",
        "container_memory_working_set_bytes",
        "container_memory_rss",
        "container_memory_usage_bytes",
        "container_fs_usage_bytes",
        "container_network_receive_bytes_total",
        "container_network_transmit_bytes_total",
        "container_processes",
    ] {
        let d = descriptors.get(name).unwrap_or_else(|| panic!("no descriptor {name}"));
        assert!(!d.help.is_empty());
        assert_eq!(&d.label_keys[..3], ["id", "name", "image"], "{name}");
    }

    let first = pod_metrics(&pod).await;
    assert_eq!(first.pod_sandbox_id, pod.id);
    // Every metric sent has a descriptor and as many label values as it has keys.
    let every = first
        .metrics
        .iter()
        .chain(first.container_metrics.iter().flat_map(|c| c.metrics.iter()));
    for m in every {
        let d = descriptors
            .get(&m.name)
            .unwrap_or_else(|| panic!("{} has no descriptor", m.name));
        assert_eq!(m.label_values.len(), d.label_keys.len(), "{m:?} vs {d:?}");
        assert!(m.timestamp > 0);
    }

    // Pod level: cpu, memory, processes, the bridge interface.
    let working_set = find(&first.metrics, "container_memory_working_set_bytes");
    assert_eq!(working_set.metric_type, api::MetricType::Gauge as i32);
    assert_eq!(working_set.label_values[0], pod.id);
    assert!(value(working_set) > 0);
    assert!(
        value(find(&first.metrics, "container_processes")) >= 2,
        "pause and the loop"
    );
    let rx = find(&first.metrics, "container_network_receive_bytes_total");
    assert_eq!(rx.metric_type, api::MetricType::Counter as i32);
    assert_eq!(rx.label_values.last().unwrap(), "eth0");

    // Container level: labels name the container, its image, pod and namespace.
    assert_eq!(first.container_metrics.len(), 1);
    let c = &first.container_metrics[0];
    assert_eq!(c.container_id, burner);
    let rss = find(&c.metrics, "container_memory_rss");
    let keys = &descriptors["container_memory_rss"].label_keys;
    let labels: HashMap<&str, &str> = keys
        .iter()
        .map(String::as_str)
        .zip(rss.label_values.iter().map(String::as_str))
        .collect();
    assert_eq!(labels["id"], burner);
    assert_eq!(labels["container"], "burner");
    assert_eq!(labels["pod"], "podmetrics");
    assert_eq!(labels["namespace"], "default");
    assert!(labels["image"].contains("busybox"), "{labels:?}");
    assert!(value(find(&c.metrics, "container_memory_usage_bytes")) > 0);
    find(&c.metrics, "container_fs_usage_bytes");

    // A busy loop's CPU counter (whole seconds) grows.
    let cpu = |m: &api::PodSandboxMetrics| {
        value(find(
            &m.container_metrics[0].metrics,
            "container_cpu_usage_seconds_total",
        ))
    };
    let before = cpu(&first);
    let mut after = before;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        after = cpu(&pod_metrics(&pod).await);
        if after >= before + 2 {
            break;
        }
    }
    assert!(after >= before + 2, "cpu seconds {before} → {after}");
    let pod_cpu = find(&pod_metrics(&pod).await.metrics, "container_cpu_usage_seconds_total").clone();
    assert_eq!(pod_cpu.label_values.last().unwrap(), "total");
    assert!(value(&pod_cpu) >= after, "the pod includes its container");

    // The streaming variant sends the same pods.
    let mut stream = pod
        .daemon
        .runtime()
        .await
        .stream_pod_sandbox_metrics(api::StreamPodSandboxMetricsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut streamed = Vec::new();
    while let Some(page) = stream.next().await {
        streamed.extend(page.unwrap().pod_sandbox_metrics.into_iter().map(|p| p.pod_sandbox_id));
    }
    assert_eq!(streamed, vec![pod.id.clone()]);

    pod.remove_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_pod_sandbox_resources_is_accepted_and_checked() {
    let pod = pod_with("podresize", None).await;
    let mut runtime = pod.daemon.runtime().await;
    let resources = api::LinuxContainerResources {
        cpu_period: 100_000,
        cpu_quota: 50_000,
        cpu_shares: 512,
        memory_limit_in_bytes: 256 << 20,
        ..Default::default()
    };
    runtime
        .update_pod_sandbox_resources(api::UpdatePodSandboxResourcesRequest {
            pod_sandbox_id: pod.id[..12].to_string(),
            overhead: Some(api::LinuxContainerResources {
                cpu_shares: 2,
                ..Default::default()
            }),
            resources: Some(resources.clone()),
        })
        .await
        .unwrap();

    let err = runtime
        .update_pod_sandbox_resources(api::UpdatePodSandboxResourcesRequest {
            pod_sandbox_id: "0123456789abcdef".into(),
            overhead: None,
            resources: Some(resources.clone()),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    let err = runtime
        .update_pod_sandbox_resources(api::UpdatePodSandboxResourcesRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    let err = runtime
        .update_pod_sandbox_resources(api::UpdatePodSandboxResourcesRequest {
            pod_sandbox_id: pod.id.clone(),
            overhead: None,
            resources: Some(api::LinuxContainerResources {
                memory_limit_in_bytes: -5,
                ..Default::default()
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("memory_limit_in_bytes"), "{err:?}");

    // The pod is untouched and still works.
    let status = runtime
        .pod_sandbox_status(api::PodSandboxStatusRequest {
            pod_sandbox_id: pod.id.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap();
    assert_eq!(status.state, api::PodSandboxState::SandboxReady as i32);
    drop(runtime);
    pod.remove_all().await;
}
