//! Node readiness checks, shared by `scute check` (all of them, verbose) and the Status RPC
//! (the cheap ones behind the RuntimeReady condition).

use std::fmt;
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::Config;
use crate::image::hosts;
use crate::sandbox::cni;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    Ok,
    /// Pods can run, but something an operator likely wants is missing.
    Warn,
    /// The node cannot run pods.
    Fail,
}

#[derive(Debug, Clone)]
pub struct Finding {
    pub check: &'static str,
    pub verdict: Verdict,
    pub detail: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tag = match self.verdict {
            Verdict::Ok => "ok  ",
            Verdict::Warn => "warn",
            Verdict::Fail => "FAIL",
        };
        write!(f, "{tag}  {:<10} {}", self.check, self.detail)
    }
}

fn finding(check: &'static str, verdict: Verdict, detail: impl Into<String>) -> Finding {
    Finding {
        check,
        verdict,
        detail: detail.into(),
    }
}

/// The cgroup layout of the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupMode {
    /// cgroup v1 controllers only.
    Legacy,
    /// v1 controllers plus cgroup2 at /sys/fs/cgroup/unified (this machine kind).
    Hybrid,
    /// Pure cgroup v2 at /sys/fs/cgroup.
    Unified,
}

impl CgroupMode {
    pub fn detect(root: &Path) -> Option<CgroupMode> {
        if root.join("cgroup.controllers").exists() {
            Some(CgroupMode::Unified)
        } else if root.join("memory").is_dir() {
            if root.join("unified/cgroup.controllers").exists() {
                Some(CgroupMode::Hybrid)
            } else {
                Some(CgroupMode::Legacy)
            }
        } else {
            None
        }
    }
}

const CGROUP_ROOT: &str = "/sys/fs/cgroup";
const V1_CONTROLLERS: &[&str] = &["cpu", "cpuacct", "cpuset", "memory", "pids", "devices", "freezer"];
const V2_CONTROLLERS: &[&str] = &["cpu", "cpuset", "memory", "pids"];

/// Checks that cgroups with the controllers pods need are mounted.
pub fn check_cgroups(root: &Path) -> Finding {
    match CgroupMode::detect(root) {
        None => finding(
            "cgroups",
            Verdict::Fail,
            format!("no cgroup hierarchy found under {}", root.display()),
        ),
        Some(mode @ (CgroupMode::Legacy | CgroupMode::Hybrid)) => {
            let missing: Vec<_> = V1_CONTROLLERS
                .iter()
                .filter(|c| !root.join(c).is_dir())
                .copied()
                .collect();
            if missing.is_empty() {
                finding(
                    "cgroups",
                    Verdict::Ok,
                    format!("{mode:?} (v1 controllers: {})", V1_CONTROLLERS.join(", ")),
                )
            } else {
                finding(
                    "cgroups",
                    Verdict::Fail,
                    format!("cgroup v1 controllers not mounted: {}", missing.join(", ")),
                )
            }
        }
        Some(CgroupMode::Unified) => {
            let controllers = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
            let have: Vec<&str> = controllers.split_whitespace().collect();
            let missing: Vec<_> = V2_CONTROLLERS.iter().filter(|c| !have.contains(c)).copied().collect();
            if missing.is_empty() {
                finding(
                    "cgroups",
                    Verdict::Ok,
                    format!("Unified (cgroup v2 controllers: {})", have.join(" ")),
                )
            } else {
                finding(
                    "cgroups",
                    Verdict::Fail,
                    format!("cgroup v2 controllers not available: {}", missing.join(", ")),
                )
            }
        }
    }
}

/// Cheap check that the kernel knows overlayfs (listed in /proc/filesystems).
pub fn check_overlay_listed() -> Finding {
    let fs = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if fs.lines().any(|l| l.split_whitespace().last() == Some("overlay")) {
        finding("overlay", Verdict::Ok, "overlayfs is available")
    } else {
        finding(
            "overlay",
            Verdict::Fail,
            "overlayfs is not in /proc/filesystems (modprobe overlay?)",
        )
    }
}

/// Thorough overlay check: mounts a real overlay in a scratch dir under `root` (the snapshots
/// live there, so that is the filesystem that must support it as an upper dir).
pub fn check_overlay_mount(root: &Path) -> Finding {
    use nix::mount::{mount, umount2, MntFlags, MsFlags};
    let listed = check_overlay_listed();
    if listed.verdict == Verdict::Fail {
        return listed;
    }
    if let Err(e) = std::fs::create_dir_all(root) {
        return finding(
            "overlay",
            Verdict::Fail,
            format!("cannot create root {}: {e}", root.display()),
        );
    }
    let scratch = match tempfile::Builder::new().prefix(".check-overlay-").tempdir_in(root) {
        Ok(dir) => dir,
        Err(e) => {
            return finding(
                "overlay",
                Verdict::Fail,
                format!("cannot create a scratch dir in {}: {e}", root.display()),
            )
        }
    };
    let dir = |name: &str| -> std::io::Result<PathBuf> {
        let p = scratch.path().join(name);
        std::fs::create_dir(&p)?;
        Ok(p)
    };
    let (lower, upper, work, merged) = match (dir("lower"), dir("upper"), dir("work"), dir("merged")) {
        (Ok(l), Ok(u), Ok(w), Ok(m)) => (l, u, w, m),
        _ => return finding("overlay", Verdict::Fail, "cannot create overlay scratch dirs"),
    };
    let data = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        work.display()
    );
    match mount(
        Some("overlay"),
        &merged,
        Some("overlay"),
        MsFlags::empty(),
        Some(data.as_str()),
    ) {
        Ok(()) => {
            let _ = umount2(&merged, MntFlags::MNT_DETACH);
            finding(
                "overlay",
                Verdict::Ok,
                format!("overlay mounts work on {}", root.display()),
            )
        }
        Err(e) => finding(
            "overlay",
            Verdict::Fail,
            format!("overlay mount with upper dir on {} failed: {e}", root.display()),
        ),
    }
}

pub fn check_namespaces() -> Finding {
    let missing: Vec<_> = ["mnt", "uts", "ipc", "net", "pid", "user", "cgroup"]
        .into_iter()
        .filter(|ns| !Path::new("/proc/self/ns").join(ns).exists())
        .collect();
    if missing.is_empty() {
        finding("namespaces", Verdict::Ok, "mnt uts ipc net pid user cgroup")
    } else {
        finding(
            "namespaces",
            Verdict::Fail,
            format!("kernel lacks namespaces: {}", missing.join(" ")),
        )
    }
}

pub fn check_root_user() -> Finding {
    if nix::unistd::geteuid().is_root() {
        finding("privilege", Verdict::Ok, "running as root")
    } else {
        finding(
            "privilege",
            Verdict::Fail,
            "scute must run as root to create namespaces, mounts and cgroups",
        )
    }
}

pub fn check_seccomp() -> Finding {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    if status.lines().any(|l| l.starts_with("Seccomp:")) {
        finding("seccomp", Verdict::Ok, "kernel supports seccomp filters")
    } else {
        finding(
            "seccomp",
            Verdict::Warn,
            "kernel has no seccomp: RuntimeDefault profiles cannot be enforced",
        )
    }
}

pub fn check_kernel() -> Finding {
    match nix::sys::utsname::uname() {
        Ok(u) => finding(
            "kernel",
            Verdict::Ok,
            format!("{} {}", u.sysname().to_string_lossy(), u.release().to_string_lossy()),
        ),
        Err(e) => finding("kernel", Verdict::Warn, format!("uname failed: {e}")),
    }
}

pub fn check_cni(config: &Config) -> Finding {
    match cni::CniManager::new(&config.cni, &config.state).network() {
        Ok(net) => finding(
            "cni",
            Verdict::Ok,
            format!(
                "network {:?} from {} (plugins: {})",
                net.name,
                net.conf_file.display(),
                net.plugins
                    .iter()
                    .map(|(t, _)| t.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
        // Host-network pods still run, so this is a warning, as NetworkReady=false is for the kubelet.
        Err(e) => finding("cni", Verdict::Warn, format!("{e}: only host-network pods can run")),
    }
}

/// Checks that every registry endpoint configured under `registry.config_path` (containerd's
/// `<host>/hosts.toml` layout, parsed by the same code pulls use) accepts TCP connections.
pub fn check_registries(config: &Config) -> Vec<Finding> {
    let roots = config.registry.config_path.to_string_lossy().to_string();
    let mut registries: Vec<String> = Vec::new();
    for root in roots.split(':').filter(|r| !r.is_empty()) {
        let Ok(entries) = std::fs::read_dir(root) else { continue };
        for entry in entries.flatten().filter(|e| e.path().is_dir()) {
            let name = entry.file_name().to_string_lossy().to_string();
            // `host_port_` directories name `host:port`.
            let registry = match name.strip_suffix('_').and_then(|n| n.rsplit_once('_')) {
                Some((host, port)) if port.parse::<u16>().is_ok() => format!("{host}:{port}"),
                _ => name,
            };
            if !registries.contains(&registry) {
                registries.push(registry);
            }
        }
    }
    registries.sort();
    if registries.is_empty() {
        return vec![finding(
            "registry",
            Verdict::Warn,
            format!("no registry host config under {roots}: images come from their upstream registries"),
        )];
    }
    let mut out = Vec::new();
    for registry in registries {
        let endpoints = match hosts::endpoints_for(&config.registry.config_path, &registry) {
            Ok(e) => e,
            Err(e) => {
                out.push(finding("registry", Verdict::Fail, e.to_string()));
                continue;
            }
        };
        for endpoint in endpoints {
            let url = format!("{}://{}", endpoint.scheme.as_str(), endpoint.host);
            out.push(match tcp_reachable(&url) {
                Ok(()) => finding("registry", Verdict::Ok, format!("{url} reachable (for {registry})")),
                Err(e) => finding(
                    "registry",
                    Verdict::Warn,
                    format!("{url} unreachable: {e} (for {registry})"),
                ),
            });
        }
    }
    out
}

/// The CDI spec files `[cdi] spec_dirs` hold and the devices they define; a broken file or an
/// ambiguous device is a warning (containers asking for those devices fail, others run).
pub fn check_cdi(config: &Config) -> Vec<Finding> {
    let registry = crate::cdi::CdiRegistry::new(&config.cdi);
    let dirs = registry
        .dirs()
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if !registry.enabled() {
        return vec![finding(
            "cdi",
            Verdict::Ok,
            "disabled: containers asking for CDI devices fail",
        )];
    }
    let files = registry.files();
    if files.is_empty() {
        return vec![finding("cdi", Verdict::Ok, format!("no CDI specs in {dirs}"))];
    }
    let mut out: Vec<Finding> = files
        .into_iter()
        .map(|f| match (f.error, f.kind) {
            (Some(error), _) => finding("cdi", Verdict::Warn, format!("{} skipped: {error}", f.path.display())),
            (None, kind) => finding(
                "cdi",
                Verdict::Ok,
                format!(
                    "{} ({}): {}",
                    f.path.display(),
                    kind.unwrap_or_default(),
                    f.devices.join(", ")
                ),
            ),
        })
        .collect();
    for (name, files) in registry.ambiguous() {
        out.push(finding(
            "cdi",
            Verdict::Warn,
            format!(
                "{name} is defined twice at the same priority ({}): refused",
                files.join(", ")
            ),
        ));
    }
    out
}

fn tcp_reachable(url: &str) -> Result<(), String> {
    let (scheme, rest) = url.split_once("://").unwrap_or(("https", url));
    let authority = rest.split('/').next().unwrap_or(rest);
    let with_port = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        authority.to_string()
    } else {
        format!("{authority}:{}", if scheme == "http" { 80 } else { 443 })
    };
    let addr = with_port
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {with_port}: {e}"))?
        .next()
        .ok_or_else(|| format!("{with_port} resolves to nothing"))?;
    TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    Ok(())
}

/// Whether CheckpointContainer can work: CRIU installed and `criu check` passing.
pub fn check_checkpoint() -> Finding {
    match crate::criu::probe() {
        Ok(version) => finding(
            "checkpoint",
            Verdict::Ok,
            format!("CRIU {version}: `criu check` passes"),
        ),
        Err(why) => finding(
            "checkpoint",
            Verdict::Warn,
            format!("CheckpointContainer will fail: {why}"),
        ),
    }
}

/// Every check `scute check` runs, in order.
pub fn run_all(config: &Config) -> Vec<Finding> {
    let mut findings = vec![
        check_root_user(),
        check_kernel(),
        check_namespaces(),
        check_cgroups(Path::new(CGROUP_ROOT)),
        check_overlay_mount(&config.root),
        check_seccomp(),
        check_cni(config),
        check_checkpoint(),
    ];
    findings.extend(check_registries(config));
    findings.extend(check_cdi(config));
    findings
}

/// Why the runtime is not ready, if it is not: the cheap checks behind RuntimeReady.
pub fn runtime_not_ready() -> Option<Finding> {
    [
        check_cgroups(Path::new(CGROUP_ROOT)),
        check_overlay_listed(),
        check_namespaces(),
    ]
    .into_iter()
    .find(|f| f.verdict == Verdict::Fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_modes_from_fixture_trees() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        assert_eq!(CgroupMode::detect(root), None);
        assert_eq!(check_cgroups(root).verdict, Verdict::Fail);

        std::fs::write(root.join("cgroup.controllers"), "cpuset cpu io memory pids\n").unwrap();
        assert_eq!(CgroupMode::detect(root), Some(CgroupMode::Unified));
        assert_eq!(check_cgroups(root).verdict, Verdict::Ok);
        std::fs::write(root.join("cgroup.controllers"), "cpu io\n").unwrap();
        let f = check_cgroups(root);
        assert_eq!(f.verdict, Verdict::Fail);
        assert!(f.detail.contains("cpuset, memory, pids"), "{}", f.detail);
        std::fs::remove_file(root.join("cgroup.controllers")).unwrap();

        for c in V1_CONTROLLERS {
            std::fs::create_dir(root.join(c)).unwrap();
        }
        assert_eq!(CgroupMode::detect(root), Some(CgroupMode::Legacy));
        std::fs::create_dir(root.join("unified")).unwrap();
        std::fs::write(root.join("unified/cgroup.controllers"), "").unwrap();
        assert_eq!(CgroupMode::detect(root), Some(CgroupMode::Hybrid));
        assert_eq!(check_cgroups(root).verdict, Verdict::Ok);
        std::fs::remove_dir(root.join("pids")).unwrap();
        assert!(check_cgroups(root).detail.contains("pids"));
    }

    #[test]
    fn tcp_probe_reports_closed_ports() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert!(tcp_reachable(&format!("http://127.0.0.1:{port}/v2/")).is_ok());
        drop(listener);
        assert!(tcp_reachable(&format!("http://127.0.0.1:{port}")).is_err());
    }
}

/// RuntimeReady is polled by the kubelet every few seconds, but cgroup mounts, overlayfs and
/// namespaces do not come and go: re-check at most every [`RuntimeReadiness::RECHECK`].
#[derive(Default)]
pub struct RuntimeReadiness {
    last: std::sync::Mutex<Option<(std::time::Instant, Option<Finding>)>>,
}

impl RuntimeReadiness {
    pub const RECHECK: Duration = Duration::from_secs(10);

    pub fn not_ready(&self) -> Option<Finding> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        match last.as_ref() {
            Some((at, result)) if at.elapsed() < Self::RECHECK => result.clone(),
            _ => {
                let result = runtime_not_ready();
                *last = Some((std::time::Instant::now(), result.clone()));
                result
            }
        }
    }
}
