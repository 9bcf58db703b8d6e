//! Where a cgroup's files are (cgroup v1, v2 or hybrid, from this process's mountinfo) and what
//! they say: cpu time, memory, process count, pressure (PSI). Missing or odd files leave a field
//! absent; nothing here fails.

use std::path::{Path, PathBuf};

use scute_sys::cgroupfs::Hierarchies;
use std::time::Instant;

/// On v1 an unlimited memory.limit_in_bytes reads as PAGE_COUNTER_MAX pages (~2^63): anything this
/// large is "no limit".
const V1_UNLIMITED: u64 = 1 << 62;

/// The cgroup hierarchies mounted on this node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Layout {
    hierarchies: Hierarchies,
}

impl Layout {
    pub fn detect() -> Layout {
        Layout {
            hierarchies: Hierarchies::read(),
        }
    }

    /// From /proc/self/mountinfo text; the first mount of each hierarchy wins.
    pub fn parse(mountinfo: &str) -> Layout {
        Layout {
            hierarchies: Hierarchies::from_mounts(&scute_sys::mountinfo::parse(mountinfo)),
        }
    }

    /// The directory of cgroup `path` in the v1 hierarchy of `controller`, if mounted.
    fn v1_dir(&self, controller: &str, path: &str) -> Option<PathBuf> {
        self.hierarchies.v1_of(controller)?.dir(path)
    }

    /// The directory of cgroup `path` in the cgroup2 mount (all controllers on pure v2; only PSI
    /// here on hybrid nodes).
    fn unified_dir(&self, path: &str) -> Option<PathBuf> {
        self.hierarchies.unified.as_ref()?.dir(path)
    }

    /// Reads cgroup `path` (a cgroupfs path such as the OCI spec's linux.cgroupsPath). Each
    /// controller is read from v1 where v1 has it mounted, else from cgroup2.
    pub fn sample(&self, path: &str) -> Sample {
        let unified = self.unified_dir(path).filter(|d| d.is_dir());
        let cpu_usage_ns = match self.v1_dir("cpuacct", path) {
            Some(dir) => read_u64(&dir.join("cpuacct.usage")),
            None => unified.as_deref().and_then(v2_cpu_usage),
        };
        let memory = match self.v1_dir("memory", path) {
            Some(dir) => v1_memory(&dir),
            None => unified.as_deref().and_then(v2_memory),
        };
        let pids = match self.v1_dir("pids", path) {
            Some(dir) => read_u64(&dir.join("pids.current")),
            None => unified.as_deref().and_then(|d| read_u64(&d.join("pids.current"))),
        };
        let psi = |file: &str| unified.as_deref().and_then(|d| read_psi(&d.join(file)));
        Sample {
            at: Instant::now(),
            timestamp: scute_sys::clock::now_nanos(),
            cpu_usage_ns,
            memory,
            pids,
            cpu_psi: psi("cpu.pressure"),
            memory_psi: psi("memory.pressure"),
            io_psi: psi("io.pressure"),
        }
    }
}

/// What one cgroup said at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// For rates.
    pub at: Instant,
    /// Wall clock, nanoseconds since the epoch (the CRI timestamps).
    pub timestamp: i64,
    pub cpu_usage_ns: Option<u64>,
    pub memory: Option<Memory>,
    pub pids: Option<u64>,
    pub cpu_psi: Option<Psi>,
    pub memory_psi: Option<Psi>,
    pub io_psi: Option<Psi>,
}

impl Sample {
    /// The sum of several cgroups (a pod without a cgroup of its own): counters add up; limits
    /// and pressure do not, so they are left out.
    pub fn sum(samples: &[Sample]) -> Sample {
        fn add(a: Option<u64>, b: Option<u64>) -> Option<u64> {
            match (a, b) {
                (Some(a), Some(b)) => Some(a.saturating_add(b)),
                (a, b) => a.or(b),
            }
        }
        let mut total = Sample {
            at: Instant::now(),
            timestamp: scute_sys::clock::now_nanos(),
            cpu_usage_ns: None,
            memory: None,
            pids: None,
            cpu_psi: None,
            memory_psi: None,
            io_psi: None,
        };
        for s in samples {
            total.cpu_usage_ns = add(total.cpu_usage_ns, s.cpu_usage_ns);
            total.pids = add(total.pids, s.pids);
            if let Some(m) = &s.memory {
                let t = total.memory.get_or_insert_with(Memory::default);
                t.usage = t.usage.saturating_add(m.usage);
                t.working_set = t.working_set.saturating_add(m.working_set);
                t.rss = add(t.rss, m.rss);
                t.page_faults = add(t.page_faults, m.page_faults);
                t.major_page_faults = add(t.major_page_faults, m.major_page_faults);
                t.swap_usage = add(t.swap_usage, m.swap_usage);
            }
        }
        total
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Memory {
    pub usage: u64,
    /// Usage minus inactive file pages: what the kubelet evicts on.
    pub working_set: u64,
    pub rss: Option<u64>,
    pub page_faults: Option<u64>,
    pub major_page_faults: Option<u64>,
    /// None when unlimited.
    pub limit: Option<u64>,
    pub swap_usage: Option<u64>,
    /// None when unlimited.
    pub swap_limit: Option<u64>,
}

/// One PSI file: `some` and (except cpu on old kernels) `full` lines.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Psi {
    pub some: Option<PsiLine>,
    pub full: Option<PsiLine>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct PsiLine {
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
    /// Microseconds, as the kernel counts.
    pub total_us: u64,
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// `memory.max`-style: a number, or "max" for no limit (None).
fn read_limit(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.trim().parse().ok()
}

/// `key value` lines (cpu.stat, memory.stat).
fn read_keyed(path: &Path) -> Option<std::collections::HashMap<String, u64>> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(
        text.lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k.to_string(), v.trim().parse().ok()?))
            })
            .collect(),
    )
}

fn v2_cpu_usage(dir: &Path) -> Option<u64> {
    read_keyed(&dir.join("cpu.stat"))?
        .get("usage_usec")
        .map(|us| us.saturating_mul(1000))
}

fn v2_memory(dir: &Path) -> Option<Memory> {
    let usage = read_u64(&dir.join("memory.current"))?;
    let stat = read_keyed(&dir.join("memory.stat")).unwrap_or_default();
    let inactive_file = stat.get("inactive_file").copied().unwrap_or(0);
    Some(Memory {
        usage,
        working_set: usage.saturating_sub(inactive_file),
        rss: stat.get("anon").copied(),
        page_faults: stat.get("pgfault").copied(),
        major_page_faults: stat.get("pgmajfault").copied(),
        limit: read_limit(&dir.join("memory.max")),
        swap_usage: read_u64(&dir.join("memory.swap.current")),
        swap_limit: read_limit(&dir.join("memory.swap.max")),
    })
}

fn v1_memory(dir: &Path) -> Option<Memory> {
    let usage = read_u64(&dir.join("memory.usage_in_bytes"))?;
    let stat = read_keyed(&dir.join("memory.stat")).unwrap_or_default();
    let inactive_file = stat.get("total_inactive_file").copied().unwrap_or(0);
    let limited = |v: Option<u64>| v.filter(|v| *v < V1_UNLIMITED);
    let limit = limited(read_u64(&dir.join("memory.limit_in_bytes")));
    // memsw counts memory + swap; swap alone is the difference.
    let memsw = read_u64(&dir.join("memory.memsw.usage_in_bytes"));
    let memsw_limit = limited(read_u64(&dir.join("memory.memsw.limit_in_bytes")));
    Some(Memory {
        usage,
        working_set: usage.saturating_sub(inactive_file),
        rss: stat.get("total_rss").copied(),
        page_faults: stat.get("total_pgfault").copied(),
        major_page_faults: stat.get("total_pgmajfault").copied(),
        limit,
        swap_usage: memsw.map(|m| m.saturating_sub(usage)),
        swap_limit: memsw_limit.map(|m| m.saturating_sub(limit.unwrap_or(0))),
    })
}

/// `some avg10=0.00 avg60=0.00 avg300=0.00 total=0` and the same for `full`.
pub fn parse_psi(text: &str) -> Option<Psi> {
    let mut psi = Psi::default();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let kind = words.next()?;
        let mut parsed = PsiLine::default();
        for word in words {
            let Some((k, v)) = word.split_once('=') else { continue };
            match k {
                "avg10" => parsed.avg10 = v.parse().ok()?,
                "avg60" => parsed.avg60 = v.parse().ok()?,
                "avg300" => parsed.avg300 = v.parse().ok()?,
                "total" => parsed.total_us = v.parse().ok()?,
                _ => {}
            }
        }
        match kind {
            "some" => psi.some = Some(parsed),
            "full" => psi.full = Some(parsed),
            _ => {}
        }
    }
    (psi.some.is_some() || psi.full.is_some()).then_some(psi)
}

fn read_psi(path: &Path) -> Option<Psi> {
    parse_psi(&std::fs::read_to_string(path).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
33 31 0:30 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
34 31 0:31 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
";

    #[test]
    fn hybrid_layout_reads_controllers_from_v1_and_pressure_from_cgroup2() {
        let layout = Layout::parse(HYBRID);
        assert_eq!(
            layout.v1_dir("memory", "/scute/scute-a"),
            Some(PathBuf::from("/sys/fs/cgroup/memory/scute/scute-a"))
        );
        assert_eq!(
            layout.v1_dir("cpuacct", "/scute/scute-a"),
            Some(PathBuf::from("/sys/fs/cgroup/cpuacct/scute/scute-a"))
        );
        assert_eq!(layout.v1_dir("systemd", "/x"), None);
        assert_eq!(
            layout.unified_dir("/scute/scute-a"),
            Some(PathBuf::from("/sys/fs/cgroup/unified/scute/scute-a"))
        );
        // A joint cpu,cpuacct mount and a mounted sub-tree with an escaped space.
        let layout = Layout::parse(
            "35 31 0:32 /kube /mnt/cg\\040x rw - cgroup cgroup rw,cpu,cpuacct\n\
             30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
        );
        assert_eq!(
            layout.v1_dir("cpuacct", "/kube/pod1/c"),
            Some(PathBuf::from("/mnt/cg x/pod1/c"))
        );
        assert_eq!(layout.unified_dir("/"), Some(PathBuf::from("/sys/fs/cgroup")));
    }

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    #[test]
    fn v2_files_become_a_sample() {
        let tmp = tempfile::tempdir().unwrap();
        let cg = tmp.path().join("kubepods/pod1/c1");
        std::fs::create_dir_all(&cg).unwrap();
        write(&cg, "cpu.stat", "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n");
        write(&cg, "memory.current", "10485760\n");
        write(
            &cg,
            "memory.stat",
            "anon 4194304\nfile 6291456\ninactive_file 2097152\nactive_file 4194304\npgfault 120\npgmajfault 3\n",
        );
        write(&cg, "memory.max", "67108864\n");
        write(&cg, "memory.swap.current", "4096\n");
        write(&cg, "memory.swap.max", "max\n");
        write(&cg, "pids.current", "4\n");
        write(
            &cg,
            "cpu.pressure",
            "some avg10=1.50 avg60=0.25 avg300=0.00 total=2500\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=7\n",
        );
        write(&cg, "memory.pressure", "garbage\n");
        let layout = Layout::parse(&format!(
            "30 23 0:26 / {} rw - cgroup2 cgroup2 rw\n",
            tmp.path().display()
        ));
        let s = layout.sample("/kubepods/pod1/c1");
        assert_eq!(s.cpu_usage_ns, Some(1_500_000));
        assert_eq!(
            s.memory,
            Some(Memory {
                usage: 10 << 20,
                working_set: 8 << 20,
                rss: Some(4 << 20),
                page_faults: Some(120),
                major_page_faults: Some(3),
                limit: Some(64 << 20),
                swap_usage: Some(4096),
                swap_limit: None,
            })
        );
        assert_eq!(s.pids, Some(4));
        let cpu_psi = s.cpu_psi.unwrap();
        assert_eq!(cpu_psi.some.as_ref().unwrap().avg10, 1.5);
        assert_eq!(cpu_psi.some.unwrap().total_us, 2500);
        assert_eq!(cpu_psi.full.unwrap().total_us, 7);
        assert_eq!(s.memory_psi, None);
        assert_eq!(s.io_psi, None);

        // A cgroup that is gone (container exited and removed): nothing, no error.
        let gone = layout.sample("/kubepods/pod1/gone");
        assert_eq!((gone.cpu_usage_ns, gone.memory, gone.pids), (None, None, None));
    }

    #[test]
    fn sums_add_counters_and_drop_limits() {
        let layout = Layout::default();
        let mut a = layout.sample("/x");
        a.cpu_usage_ns = Some(5);
        a.memory = Some(Memory {
            usage: 10,
            working_set: 8,
            limit: Some(100),
            rss: Some(1),
            ..Default::default()
        });
        let mut b = a.clone();
        b.pids = Some(2);
        let total = Sample::sum(&[a, b]);
        assert_eq!(total.cpu_usage_ns, Some(10));
        assert_eq!(total.pids, Some(2));
        let m = total.memory.unwrap();
        assert_eq!((m.usage, m.working_set, m.rss, m.limit), (20, 16, Some(2), None));
    }
}
