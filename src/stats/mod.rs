//! Container and pod statistics for the CRI stats RPCs: cgroup v1 and v2 readers
//! ([`cgroup`]), CPU rates between samples ([`rate`]), network counters from a pod's namespace
//! ([`net`]), and disk usage of writable layers. Everything here reads the kernel's files as
//! they are now; a missing file leaves its field absent.
//!
//! All functions block (file reads, a thread per network namespace): call them from
//! `spawn_blocking`.

pub mod cgroup;
pub mod metrics;
pub mod net;
pub mod rate;

use std::path::Path;

use crate::api;
use cgroup::{Layout, Psi, Sample};

/// The node's cgroup layout and the previous CPU samples. One per daemon.
#[derive(Debug)]
pub struct Stats {
    layout: Layout,
    rates: rate::CpuRates,
}

impl Default for Stats {
    fn default() -> Self {
        Stats::new(Layout::detect())
    }
}

/// Keys of pod samples in the rate cache (container keys are bare IDs).
const POD_KEY: &str = "pod/";

impl Stats {
    pub fn new(layout: Layout) -> Stats {
        Stats {
            layout,
            rates: rate::CpuRates::default(),
        }
    }

    /// Reads the cgroup of an OCI spec's linux.cgroupsPath (either driver's form) or a cgroupfs
    /// path.
    pub fn sample(&self, cgroups_path: &str) -> Sample {
        self.layout.sample(&crate::cgroups::dir(cgroups_path))
    }

    /// CpuUsage of a container's sample; the rate is against the container's previous sample.
    pub fn container_cpu(&self, id: &str, sample: &Sample) -> Option<api::CpuUsage> {
        self.cpu(id, sample)
    }

    /// CpuUsage of a pod's sample (its cgroup's, or the sum of its members').
    pub fn pod_cpu(&self, id: &str, sample: &Sample) -> Option<api::CpuUsage> {
        self.cpu(&format!("{POD_KEY}{id}"), sample)
    }

    fn cpu(&self, key: &str, sample: &Sample) -> Option<api::CpuUsage> {
        let usage = sample.cpu_usage_ns?;
        Some(api::CpuUsage {
            timestamp: sample.timestamp,
            usage_core_nano_seconds: Some(api::UInt64Value { value: usage }),
            usage_nano_cores: self
                .rates
                .rate(key, usage, sample.at)
                .map(|value| api::UInt64Value { value }),
            psi: sample.cpu_psi.as_ref().map(psi),
        })
    }

    /// Forgets the CPU samples of containers not in `live` (removed ones).
    pub fn keep_containers<'a>(&self, live: impl IntoIterator<Item = &'a str>) {
        let live: std::collections::HashSet<&str> = live.into_iter().collect();
        self.rates.retain(|k| k.starts_with(POD_KEY) || live.contains(k));
    }

    /// Forgets the CPU samples of pods not in `live`.
    pub fn keep_pods<'a>(&self, live: impl IntoIterator<Item = &'a str>) {
        let live: std::collections::HashSet<&str> = live.into_iter().collect();
        self.rates
            .retain(|k| k.strip_prefix(POD_KEY).is_none_or(|id| live.contains(id)));
    }
}

pub fn memory(sample: &Sample) -> Option<api::MemoryUsage> {
    let m = sample.memory.as_ref()?;
    let value = |v: u64| Some(api::UInt64Value { value: v });
    Some(api::MemoryUsage {
        timestamp: sample.timestamp,
        working_set_bytes: value(m.working_set),
        available_bytes: m.limit.and_then(|l| value(l.saturating_sub(m.working_set))),
        usage_bytes: value(m.usage),
        rss_bytes: m.rss.and_then(value),
        page_faults: m.page_faults.and_then(value),
        major_page_faults: m.major_page_faults.and_then(value),
        psi: sample.memory_psi.as_ref().map(psi),
    })
}

pub fn swap(sample: &Sample) -> Option<api::SwapUsage> {
    let m = sample.memory.as_ref()?;
    let usage = m.swap_usage?;
    Some(api::SwapUsage {
        timestamp: sample.timestamp,
        swap_available_bytes: m.swap_limit.map(|l| api::UInt64Value {
            value: l.saturating_sub(usage),
        }),
        swap_usage_bytes: Some(api::UInt64Value { value: usage }),
    })
}

/// Only pressure: CRI's IoUsage has nothing else.
pub fn io(sample: &Sample) -> Option<api::IoUsage> {
    Some(api::IoUsage {
        timestamp: sample.timestamp,
        psi: Some(psi(sample.io_psi.as_ref()?)),
    })
}

pub fn process(sample: &Sample) -> Option<api::ProcessUsage> {
    Some(api::ProcessUsage {
        timestamp: sample.timestamp,
        process_count: Some(api::UInt64Value { value: sample.pids? }),
    })
}

/// CRI's PSI totals are nanoseconds; the kernel's are microseconds.
fn psi(p: &Psi) -> api::PsiStats {
    let data = |l: &cgroup::PsiLine| api::PsiData {
        total: l.total_us.saturating_mul(1000),
        avg10: l.avg10,
        avg60: l.avg60,
        avg300: l.avg300,
    };
    api::PsiStats {
        full: p.full.as_ref().map(data),
        some: p.some.as_ref().map(data),
    }
}

/// Bytes and inodes a writable layer (`upper`) uses, reported on the filesystem `mountpoint`.
pub fn writable_layer(upper: &Path, mountpoint: &Path) -> api::FilesystemUsage {
    let (bytes, inodes) = scute_sys::files::dir_usage(upper);
    api::FilesystemUsage {
        timestamp: scute_sys::clock::now_nanos(),
        fs_id: Some(api::FilesystemIdentifier {
            mountpoint: mountpoint.display().to_string(),
        }),
        used_bytes: Some(api::UInt64Value { value: bytes }),
        inodes_used: Some(api::UInt64Value { value: inodes }),
    }
}

/// The pod's interfaces (eth0 as the default, as the kubelet expects), or None when its network
/// namespace cannot be read (stopped pod).
pub fn network(netns: &Path) -> Option<api::NetworkUsage> {
    let interfaces = match net::interfaces_in(netns) {
        Ok(interfaces) => interfaces,
        Err(e) => {
            tracing::debug!(netns = %netns.display(), error = %e, "no network stats");
            return None;
        }
    };
    let usage = |i: &net::Interface| api::NetworkInterfaceUsage {
        name: i.name.clone(),
        rx_bytes: Some(api::UInt64Value { value: i.rx_bytes }),
        rx_errors: Some(api::UInt64Value { value: i.rx_errors }),
        tx_bytes: Some(api::UInt64Value { value: i.tx_bytes }),
        tx_errors: Some(api::UInt64Value { value: i.tx_errors }),
    };
    let default = interfaces
        .iter()
        .find(|i| i.name == "eth0")
        .or(interfaces.first())
        .map(usage);
    Some(api::NetworkUsage {
        timestamp: scute_sys::clock::now_nanos(),
        default_interface: default,
        interfaces: interfaces.iter().map(usage).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cri_views_of_a_sample() {
        let stats = Stats::new(Layout::default());
        let mut s = stats.sample("/none");
        assert_eq!(stats.container_cpu("c", &s), None);
        assert_eq!(memory(&s), None);
        s.cpu_usage_ns = Some(7);
        s.cpu_psi = cgroup::parse_psi("some avg10=1.00 avg60=0.00 avg300=0.00 total=3\n");
        s.memory = Some(cgroup::Memory {
            usage: 100,
            working_set: 60,
            limit: Some(1000),
            swap_usage: Some(5),
            ..Default::default()
        });
        let cpu = stats.container_cpu("c", &s).unwrap();
        assert_eq!(cpu.usage_core_nano_seconds.unwrap().value, 7);
        assert_eq!(cpu.usage_nano_cores, None, "no rate from one sample");
        let psi = cpu.psi.unwrap();
        assert_eq!((psi.some.unwrap().total, psi.full), (3000, None));
        let m = memory(&s).unwrap();
        assert_eq!(m.available_bytes.unwrap().value, 940);
        assert_eq!(m.rss_bytes, None);
        let sw = swap(&s).unwrap();
        assert_eq!((sw.swap_usage_bytes.unwrap().value, sw.swap_available_bytes), (5, None));
        assert_eq!(io(&s), None);

        stats.pod_cpu("p", &s);
        stats.keep_containers([]);
        stats.keep_pods(["p"]);
        assert_eq!(stats.rates.len(), 1);
        stats.keep_pods([]);
        assert!(stats.rates.is_empty());
    }
}
