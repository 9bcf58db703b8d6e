//! OOM kills of a container: its memory cgroup counts them (`oom_kill N` in memory.oom_control on
//! cgroup v1, in memory.events on v2). The shim finds the file when the container is created (from
//! its init's /proc/<pid>/cgroup and the shim's mountinfo), remembers the count then, and on an exit
//! by SIGKILL reads it again.
//!
//! On v2 the file is also kept open and polled: the kernel wakes pollers of memory.events
//! (POLLPRI) at each change, so the kill is counted when it happens. That matters with systemd's
//! cgroup driver, where systemd removes a container's scope, counter and all, as soon as its last
//! process is gone — often before the shim has reaped the exit.
//!
//! Polling still loses that race at times (on a slow node systemd can remove the scope between
//! the kernel's wake-up and the shim's read: containerd and CRI-O lose it too and skip critest's
//! OOM spec with systemd's driver). So the watch also remembers the parent's count (the pod's
//! slice, which outlives its containers): memory.events is hierarchical, and when the container's
//! own cgroup is gone unread, a kill counted in the parent since the container's creation, for a
//! container that died of a SIGKILL nobody asked the shim for, was the OOM killer's.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

use scute_sys::cgroupfs::Hierarchies;

/// A container's OOM kill counter: its file, the count at creation and the highest seen since.
#[derive(Debug)]
pub struct OomWatch {
    path: PathBuf,
    /// memory.events, open for polling (v2 only); dropped once the cgroup is gone.
    file: Option<File>,
    base: u64,
    seen: u64,
    /// The parent's memory.events (v2) and its count at creation.
    parent: Option<(PathBuf, u64)>,
}

impl OomWatch {
    /// The watch of the memory cgroup `pid` is in, if it has a counter.
    pub fn new(pid: i32) -> Option<OomWatch> {
        let path = counter_path(pid)?;
        let file = path
            .ends_with("memory.events")
            .then(|| File::open(&path).ok())
            .flatten();
        let base = kills(&path).unwrap_or(0);
        let parent = file
            .is_some()
            .then(|| path.parent()?.parent().map(|d| d.join("memory.events")))
            .flatten()
            .and_then(|p| kills(&p).map(|n| (p, n)));
        Some(OomWatch {
            path,
            file,
            base,
            seen: base,
            parent,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The descriptor to poll for POLLPRI, while the cgroup exists.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.file.as_ref().map(|f| f.as_fd())
    }

    /// The counter changed (or the cgroup went): read it through the open file, which also
    /// re-arms the poll.
    pub fn refresh(&mut self) {
        let Some(file) = self.file.as_mut() else { return };
        let mut text = String::new();
        match file
            .seek(SeekFrom::Start(0))
            .and_then(|_| file.read_to_string(&mut text))
        {
            Ok(_) => {
                if let Some(n) = parse_kills(&text) {
                    self.seen = self.seen.max(n);
                }
            }
            // Removed with its cgroup (ENODEV): nothing more to watch.
            Err(_) => self.file = None,
        }
    }

    /// Whether the OOM killer killed a process of the cgroup since its creation. `sigkill_sent`:
    /// the shim itself SIGKILLed the container (a stop), so a kill in the parent was not its own.
    pub fn killed(&mut self, sigkill_sent: bool) -> bool {
        self.refresh();
        match kills(&self.path) {
            Some(n) => self.seen = self.seen.max(n),
            // Removed before the shim could count the kill (systemd's driver): the parent's count.
            None if self.seen == self.base && !sigkill_sent => {
                if let Some((parent, base)) = &self.parent {
                    if kills(parent).is_some_and(|n| n > *base) {
                        tracing::info!(cgroup = %self.path.display(), parent = %parent.display(), "cgroup gone before its OOM counter was read; the parent's counter rose");
                        return true;
                    }
                }
            }
            None => {}
        }
        self.seen > self.base
    }
}

/// The counter file of the memory cgroup `pid` is in, if it has one.
fn counter_path(pid: i32) -> Option<PathBuf> {
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    find_counter(&cgroup, host_hierarchies()?)
        .into_iter()
        .find(|p| p.is_file())
}

/// The host's cgroup hierarchies, read once (the shim's move into its own cgroup reads them first):
/// the mount table grows with every container's mounts, and each create read and parsed all of
/// it for this. Hierarchies are not remounted under a running node (the daemon's host facts
/// assume the same). An unreadable mount table is read again at the next use.
pub(crate) fn host_hierarchies() -> Option<&'static Hierarchies> {
    static READ: std::sync::OnceLock<Hierarchies> = std::sync::OnceLock::new();
    if READ.get().is_none() {
        let read = Hierarchies::read();
        if read == Hierarchies::default() {
            return None;
        }
        let _ = READ.set(read);
    }
    READ.get()
}

/// Candidate counter files: the v1 memory controller's, then the unified hierarchy's.
fn find_counter(proc_cgroup: &str, hierarchies: &Hierarchies) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for line in proc_cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if controllers.split(',').any(|c| c == "memory") {
            if let Some(dir) = hierarchies.v1_of("memory").and_then(|h| h.dir(path)) {
                out.push(dir.join("memory.oom_control"));
            }
        }
    }
    for line in proc_cgroup.lines() {
        if let Some(path) = line.strip_prefix("0::") {
            if let Some(dir) = hierarchies.unified.as_ref().and_then(|h| h.dir(path)) {
                out.push(dir.join("memory.events"));
            }
        }
    }
    out
}

/// The `oom_kill` count in a memory.oom_control or memory.events file.
fn kills(path: &Path) -> Option<u64> {
    parse_kills(&std::fs::read_to_string(path).ok()?)
}

fn parse_kills(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(mountinfo: &str) -> Hierarchies {
        Hierarchies::from_mounts(&scute_sys::mountinfo::parse(mountinfo))
    }

    const MOUNTINFO: &str = "\
22 1 0:21 / /sys rw - sysfs sysfs rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
";

    #[test]
    fn v1_memory_controller() {
        let cg = "9:name=systemd:/\n4:memory:/scute/c1\n1:cpu:/\n0::/\n";
        assert_eq!(
            find_counter(cg, &of(MOUNTINFO)),
            vec![PathBuf::from("/sys/fs/cgroup/memory/scute/c1/memory.oom_control")]
        );
    }

    #[test]
    fn v2_unified() {
        let mi = "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(
            find_counter("0::/kubepods/c 1\n", &of(mi)),
            vec![PathBuf::from("/sys/fs/cgroup/kubepods/c 1/memory.events")]
        );
        // A mount of a sub-tree (in a cgroup namespace, or a bind mount).
        let mi = "30 23 0:26 /kube /mnt/cg\\040x rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            find_counter("0::/kube/c\n", &of(mi)),
            vec![PathBuf::from("/mnt/cg x/c/memory.events")]
        );
        assert!(find_counter("0::/other/c\n", &of(mi)).is_empty());
    }

    #[test]
    fn parent_counts_when_the_cgroup_is_gone() {
        let tmp = tempfile::tempdir().unwrap();
        let own = tmp.path().join("c/memory.events");
        let parent = tmp.path().join("memory.events");
        std::fs::create_dir(tmp.path().join("c")).unwrap();
        std::fs::write(&own, "oom 0\noom_kill 0\n").unwrap();
        std::fs::write(&parent, "oom 2\noom_kill 2\n").unwrap();
        let watch = |own: &Path| OomWatch {
            path: own.to_owned(),
            file: None,
            base: 0,
            seen: 0,
            parent: Some((parent.clone(), 2)),
        };
        // Its own counter, while it exists, decides (a sibling's kill is not its own).
        std::fs::write(&parent, "oom 3\noom_kill 3\n").unwrap();
        assert!(!watch(&own).killed(false));
        std::fs::write(&own, "oom 1\noom_kill 1\n").unwrap();
        assert!(watch(&own).killed(true));
        // Gone unread: the parent's rise, unless the shim sent the SIGKILL itself.
        std::fs::remove_dir_all(tmp.path().join("c")).unwrap();
        assert!(watch(&own).killed(false));
        assert!(!watch(&own).killed(true));
        std::fs::write(&parent, "oom 2\noom_kill 2\n").unwrap();
        assert!(!watch(&own).killed(false));
    }

    #[test]
    fn counts() {
        assert_eq!(parse_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"), Some(3));
        assert_eq!(
            parse_kills("low 0\nhigh 0\nmax 2\noom 1\noom_kill 1\noom_group_kill 0\n"),
            Some(1)
        );
        assert_eq!(parse_kills("oom_kill_disable 0\nunder_oom 0\n"), None);
        // This process's own memory cgroup has a counter (v1 or v2).
        if let Some(p) = counter_path(std::process::id() as i32) {
            assert!(kills(&p).is_some(), "{p:?}");
        }
    }
}
