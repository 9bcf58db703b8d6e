//! usage_nano_cores: CPU usage is a counter; the kubelet wants a rate. Like containerd and CRI-O,
//! scute keeps the previous sample per container (and per pod) and reports Δusage / Δt.
//!
//! The first sample of an id has no rate: the field is left absent rather than 0, so the kubelet
//! computes one from its own samples instead of believing the container idle. Samples closer than
//! [`MIN_INTERVAL`] to the stored one (two clients asking at once, or a pod's stats reading its
//! containers again) get the last rate without replacing the sample, so Δt never becomes noise.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const MIN_INTERVAL: Duration = Duration::from_millis(100);
/// Bounds memory when ids are asked for one by one and never listed (lists drop removed ids).
const MAX_ENTRIES: usize = 8192;

#[derive(Debug, Default)]
pub struct CpuRates {
    entries: Mutex<HashMap<String, Entry>>,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    at: Instant,
    usage_ns: u64,
    rate: Option<u64>,
}

impl CpuRates {
    /// Records `usage_ns` at `at` for `key`; the rate in nanocores since the previous sample.
    pub fn rate(&self, key: &str, usage_ns: u64, at: Instant) -> Option<u64> {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(prev) = entries.get_mut(key) {
            let elapsed = at.saturating_duration_since(prev.at);
            if elapsed < MIN_INTERVAL {
                return prev.rate;
            }
            // A counter that went back is a new cgroup under the same id: start over.
            let rate = usage_ns
                .checked_sub(prev.usage_ns)
                .map(|delta| (delta as u128 * 1_000_000_000 / elapsed.as_nanos()) as u64);
            *prev = Entry { at, usage_ns, rate };
            return rate;
        }
        if entries.len() >= MAX_ENTRIES {
            if let Some(oldest) = entries.iter().min_by_key(|(_, e)| e.at).map(|(k, _)| k.clone()) {
                entries.remove(&oldest);
            }
        }
        entries.insert(
            key.to_string(),
            Entry {
                at,
                usage_ns,
                rate: None,
            },
        );
        None
    }

    /// Drops the samples `keep` refuses (ids of removed containers or pods).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.retain(|k, _| keep(k));
    }

    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_between_samples() {
        let rates = CpuRates::default();
        let t0 = Instant::now();
        assert_eq!(rates.rate("c", 1_000, t0), None);
        // Half a core over two seconds.
        let t1 = t0 + Duration::from_secs(2);
        assert_eq!(rates.rate("c", 1_000 + 1_000_000_000, t1), Some(500_000_000));
        // Asked again right away: the same rate, the sample kept.
        assert_eq!(
            rates.rate("c", 1_000 + 1_000_000_001, t1 + Duration::from_millis(5)),
            Some(500_000_000)
        );
        let t2 = t1 + Duration::from_secs(1);
        assert_eq!(rates.rate("c", 1_000 + 3_000_000_000, t2), Some(2_000_000_000));
        // Counter reset.
        assert_eq!(rates.rate("c", 10, t2 + Duration::from_secs(1)), None);
        assert_eq!(rates.rate("c", 10, t2 + Duration::from_secs(2)), Some(0));

        rates.rate("other", 1, t0);
        rates.retain(|k| k != "c");
        assert_eq!(rates.len(), 1);
    }

    #[test]
    fn bounded() {
        let rates = CpuRates::default();
        let t0 = Instant::now();
        for i in 0..MAX_ENTRIES + 10 {
            rates.rate(&i.to_string(), 1, t0 + Duration::from_millis(i as u64));
        }
        assert_eq!(rates.len(), MAX_ENTRIES);
    }
}
