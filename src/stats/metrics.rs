//! cAdvisor-named metrics for ListMetricDescriptors / ListPodSandboxMetrics: what the kubelet
//! serves on `/metrics/cadvisor` when PodAndContainerStatsFromCRI is on (it turns each
//! descriptor into a Prometheus description and each metric into a sample, so a metric's
//! `label_values` must line up with its descriptor's `label_keys`).
//!
//! The metrics are a view of the CRI stats (`PodSandboxStats` with its containers' stats) that
//! the stats RPCs already read: nothing here touches the kernel.
//!
//! Labels: CRI-O's `id`, `name`, `image`, then cAdvisor's Kubernetes labels `container`, `pod`,
//! `namespace` (which dashboards select on), then the metric's own (`cpu`, `interface`). Pod-level
//! metrics carry the sandbox ID, name `POD`, no image and an empty `container`, as cAdvisor's pod
//! cgroup does. Values are CRI's unsigned integers: CPU seconds are whole seconds (as CRI-O sends).

use std::collections::HashMap;

use crate::api;

/// Labels every metric carries, in this order.
pub const BASE_LABEL_KEYS: [&str; 6] = ["id", "name", "image", "container", "pod", "namespace"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Extra {
    None,
    /// `cpu="total"` (cAdvisor's per-CPU split is not available from a cgroup's total).
    Cpu,
    /// The network interface.
    Interface,
}

struct Descriptor {
    name: &'static str,
    help: &'static str,
    metric_type: api::MetricType,
    extra: Extra,
}

const fn d(name: &'static str, help: &'static str, metric_type: api::MetricType, extra: Extra) -> Descriptor {
    Descriptor {
        name,
        help,
        metric_type,
        extra,
    }
}

use api::MetricType::{Counter, Gauge};

const CPU_USAGE: &str = "container_cpu_usage_seconds_total";
const MEMORY_USAGE: &str = "container_memory_usage_bytes";
const MEMORY_WORKING_SET: &str = "container_memory_working_set_bytes";
const MEMORY_RSS: &str = "container_memory_rss";
const MEMORY_SWAP: &str = "container_memory_swap";
const PROCESSES: &str = "container_processes";
const FS_USAGE: &str = "container_fs_usage_bytes";
const FS_INODES_USED: &str = "container_fs_inodes_used";
const NET_RX_BYTES: &str = "container_network_receive_bytes_total";
const NET_RX_ERRORS: &str = "container_network_receive_errors_total";
const NET_TX_BYTES: &str = "container_network_transmit_bytes_total";
const NET_TX_ERRORS: &str = "container_network_transmit_errors_total";

const DESCRIPTORS: &[Descriptor] = &[
    d(
        CPU_USAGE,
        "Cumulative cpu time consumed in seconds.",
        Counter,
        Extra::Cpu,
    ),
    d(
        MEMORY_USAGE,
        "Current memory usage in bytes, including all memory regardless of when it was accessed.",
        Gauge,
        Extra::None,
    ),
    d(MEMORY_WORKING_SET, "Current working set in bytes.", Gauge, Extra::None),
    d(MEMORY_RSS, "Size of RSS in bytes.", Gauge, Extra::None),
    d(MEMORY_SWAP, "Container swap usage in bytes.", Gauge, Extra::None),
    d(
        PROCESSES,
        "Number of processes running inside the container.",
        Gauge,
        Extra::None,
    ),
    d(
        FS_USAGE,
        "Number of bytes that are consumed by the container on this filesystem.",
        Gauge,
        Extra::None,
    ),
    d(
        FS_INODES_USED,
        "Number of inodes used by the container on this filesystem.",
        Gauge,
        Extra::None,
    ),
    d(
        NET_RX_BYTES,
        "Cumulative count of bytes received.",
        Counter,
        Extra::Interface,
    ),
    d(
        NET_RX_ERRORS,
        "Cumulative count of errors encountered while receiving.",
        Counter,
        Extra::Interface,
    ),
    d(
        NET_TX_BYTES,
        "Cumulative count of bytes transmitted.",
        Counter,
        Extra::Interface,
    ),
    d(
        NET_TX_ERRORS,
        "Cumulative count of errors encountered while transmitting.",
        Counter,
        Extra::Interface,
    ),
];

fn descriptor(name: &str) -> &'static Descriptor {
    DESCRIPTORS
        .iter()
        .find(|d| d.name == name)
        .expect("every metric scute emits has a descriptor")
}

/// Every metric ListPodSandboxMetrics can send, with its label keys.
pub fn descriptors() -> Vec<api::MetricDescriptor> {
    DESCRIPTORS
        .iter()
        .map(|d| {
            let mut label_keys: Vec<String> = BASE_LABEL_KEYS.iter().map(|k| k.to_string()).collect();
            match d.extra {
                Extra::None => {}
                Extra::Cpu => label_keys.push("cpu".into()),
                Extra::Interface => label_keys.push("interface".into()),
            }
            api::MetricDescriptor {
                name: d.name.into(),
                help: d.help.into(),
                label_keys,
            }
        })
        .collect()
}

/// Collects metrics sharing one set of base label values.
struct Builder {
    base: Vec<String>,
    metrics: Vec<api::Metric>,
}

impl Builder {
    fn push(&mut self, name: &str, timestamp: i64, extra: Option<&str>, value: Option<u64>) {
        let Some(value) = value else { return };
        let d = descriptor(name);
        let mut label_values = self.base.clone();
        match (d.extra, extra) {
            (Extra::None, None) => {}
            (Extra::Cpu | Extra::Interface, Some(v)) => label_values.push(v.to_string()),
            _ => unreachable!("metric {name} built with the wrong labels"),
        }
        self.metrics.push(api::Metric {
            name: name.into(),
            timestamp,
            metric_type: d.metric_type as i32,
            label_values,
            value: Some(api::UInt64Value { value }),
        });
    }

    fn cpu(&mut self, cpu: Option<&api::CpuUsage>) {
        if let Some(cpu) = cpu {
            let seconds = cpu.usage_core_nano_seconds.as_ref().map(|v| v.value / 1_000_000_000);
            self.push(CPU_USAGE, cpu.timestamp, Some("total"), seconds);
        }
    }

    fn memory(&mut self, memory: Option<&api::MemoryUsage>, swap: Option<&api::SwapUsage>) {
        let v = |x: &Option<api::UInt64Value>| x.as_ref().map(|v| v.value);
        if let Some(m) = memory {
            self.push(MEMORY_USAGE, m.timestamp, None, v(&m.usage_bytes));
            self.push(MEMORY_WORKING_SET, m.timestamp, None, v(&m.working_set_bytes));
            self.push(MEMORY_RSS, m.timestamp, None, v(&m.rss_bytes));
        }
        if let Some(s) = swap {
            self.push(MEMORY_SWAP, s.timestamp, None, v(&s.swap_usage_bytes));
        }
    }
}

/// The metrics of one pod: pod-level cpu, memory, processes and network (from its cgroup and
/// namespace), and each container's cpu, memory, swap and writable layer. `images` maps a
/// container ID to its image reference.
pub fn pod_metrics(stats: &api::PodSandboxStats, images: &HashMap<String, String>) -> api::PodSandboxMetrics {
    let attributes = stats.attributes.clone().unwrap_or_default();
    let pod_meta = attributes.metadata.unwrap_or_default();
    let label = |id: &str, name: &str, image: &str, container: &str| -> Vec<String> {
        vec![
            id.to_string(),
            name.to_string(),
            image.to_string(),
            container.to_string(),
            pod_meta.name.clone(),
            pod_meta.namespace.clone(),
        ]
    };
    let linux = stats.linux.clone().unwrap_or_default();

    let mut pod = Builder {
        base: label(&attributes.id, "POD", "", ""),
        metrics: Vec::new(),
    };
    pod.cpu(linux.cpu.as_ref());
    pod.memory(linux.memory.as_ref(), None);
    if let Some(p) = &linux.process {
        pod.push(PROCESSES, p.timestamp, None, p.process_count.as_ref().map(|v| v.value));
    }
    if let Some(net) = &linux.network {
        let v = |x: &Option<api::UInt64Value>| x.as_ref().map(|v| v.value);
        for i in &net.interfaces {
            let name = Some(i.name.as_str());
            pod.push(NET_RX_BYTES, net.timestamp, name, v(&i.rx_bytes));
            pod.push(NET_RX_ERRORS, net.timestamp, name, v(&i.rx_errors));
            pod.push(NET_TX_BYTES, net.timestamp, name, v(&i.tx_bytes));
            pod.push(NET_TX_ERRORS, net.timestamp, name, v(&i.tx_errors));
        }
    }

    let container_metrics = linux
        .containers
        .iter()
        .map(|c| {
            let attributes = c.attributes.clone().unwrap_or_default();
            let name = attributes.metadata.map(|m| m.name).unwrap_or_default();
            let image = images.get(&attributes.id).map(String::as_str).unwrap_or_default();
            let mut b = Builder {
                base: label(&attributes.id, &name, image, &name),
                metrics: Vec::new(),
            };
            b.cpu(c.cpu.as_ref());
            b.memory(c.memory.as_ref(), c.swap.as_ref());
            if let Some(fs) = &c.writable_layer {
                b.push(FS_USAGE, fs.timestamp, None, fs.used_bytes.as_ref().map(|v| v.value));
                b.push(
                    FS_INODES_USED,
                    fs.timestamp,
                    None,
                    fs.inodes_used.as_ref().map(|v| v.value),
                );
            }
            api::ContainerMetrics {
                container_id: attributes.id,
                metrics: b.metrics,
            }
        })
        .collect();

    api::PodSandboxMetrics {
        pod_sandbox_id: attributes.id,
        metrics: pod.metrics,
        container_metrics,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(value: u64) -> Option<api::UInt64Value> {
        Some(api::UInt64Value { value })
    }

    #[test]
    fn every_metric_matches_its_descriptor() {
        let descriptors: HashMap<String, api::MetricDescriptor> =
            descriptors().into_iter().map(|d| (d.name.clone(), d)).collect();
        assert_eq!(descriptors.len(), DESCRIPTORS.len(), "names are unique");
        let stats = api::PodSandboxStats {
            attributes: Some(api::PodSandboxAttributes {
                id: "pod1".into(),
                metadata: Some(api::PodSandboxMetadata {
                    name: "web".into(),
                    namespace: "default".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            linux: Some(api::LinuxPodSandboxStats {
                cpu: Some(api::CpuUsage {
                    timestamp: 5,
                    usage_core_nano_seconds: u(3_500_000_000),
                    ..Default::default()
                }),
                memory: Some(api::MemoryUsage {
                    timestamp: 5,
                    working_set_bytes: u(10),
                    usage_bytes: u(20),
                    ..Default::default()
                }),
                network: Some(api::NetworkUsage {
                    timestamp: 6,
                    default_interface: None,
                    interfaces: vec![api::NetworkInterfaceUsage {
                        name: "eth0".into(),
                        rx_bytes: u(100),
                        rx_errors: u(0),
                        tx_bytes: u(200),
                        tx_errors: u(0),
                    }],
                }),
                process: Some(api::ProcessUsage {
                    timestamp: 5,
                    process_count: u(2),
                }),
                containers: vec![api::ContainerStats {
                    attributes: Some(api::ContainerAttributes {
                        id: "c1".into(),
                        metadata: Some(api::ContainerMetadata {
                            name: "app".into(),
                            attempt: 0,
                        }),
                        ..Default::default()
                    }),
                    memory: Some(api::MemoryUsage {
                        timestamp: 5,
                        working_set_bytes: u(7),
                        usage_bytes: u(8),
                        rss_bytes: u(6),
                        ..Default::default()
                    }),
                    writable_layer: Some(api::FilesystemUsage {
                        timestamp: 5,
                        used_bytes: u(4096),
                        inodes_used: u(3),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                io: None,
            }),
            windows: None,
        };
        let images = HashMap::from([("c1".to_string(), "docker.io/library/busybox:1.36".to_string())]);
        let m = pod_metrics(&stats, &images);
        assert_eq!(m.pod_sandbox_id, "pod1");
        let all = m
            .metrics
            .iter()
            .chain(m.container_metrics.iter().flat_map(|c| c.metrics.iter()));
        for metric in all {
            let d = &descriptors[&metric.name];
            assert_eq!(metric.label_values.len(), d.label_keys.len(), "{}", metric.name);
        }
        let cpu = m.metrics.iter().find(|x| x.name == CPU_USAGE).unwrap();
        assert_eq!(cpu.value.as_ref().unwrap().value, 3);
        assert_eq!(cpu.metric_type, api::MetricType::Counter as i32);
        assert_eq!(cpu.label_values, ["pod1", "POD", "", "", "web", "default", "total"]);
        let rx = m.metrics.iter().find(|x| x.name == NET_RX_BYTES).unwrap();
        assert_eq!(rx.label_values.last().unwrap(), "eth0");
        let c = &m.container_metrics[0];
        assert_eq!(c.container_id, "c1");
        let ws = c.metrics.iter().find(|x| x.name == MEMORY_WORKING_SET).unwrap();
        assert_eq!(ws.metric_type, api::MetricType::Gauge as i32);
        assert_eq!(
            ws.label_values,
            ["c1", "app", "docker.io/library/busybox:1.36", "app", "web", "default"]
        );
        assert!(
            c.metrics.iter().all(|x| x.name != CPU_USAGE),
            "no cpu stats, no cpu metric"
        );
    }
}
