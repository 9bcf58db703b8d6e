//! The files a pod's containers share: hostname, /etc/hosts and /etc/resolv.conf (from the
//! DNSConfig the kubelet sends, or the host's), written into the sandbox directory and bind-mounted
//! into every container of the pod (the containers issue), plus the pod's /dev/shm tmpfs; the
//! bundle (config.json) of pause and of each container; and the modes that keep other host users
//! out of pods' and containers' directories.

use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};

use crate::api::DnsConfig;

/// The size of a pod's /dev/shm when nothing says otherwise (Docker's and containerd's default).
pub const DEFAULT_SHM_SIZE: u64 = 64 << 20;

pub fn hosts_file(hostname: &str, ips: &[std::net::IpAddr]) -> String {
    let mut out = String::from(
        "# Kubernetes-managed hosts file (written by scute).\n\
         127.0.0.1\tlocalhost\n\
         ::1\tlocalhost ip6-localhost ip6-loopback\n\
         fe00::0\tip6-localnet\n\
         fe00::0\tip6-mcastprefix\n\
         fe00::1\tip6-allnodes\n\
         fe00::2\tip6-allrouters\n",
    );
    for ip in ips {
        let _ = writeln!(out, "{ip}\t{hostname}");
    }
    out
}

/// resolv.conf from the pod's DNSConfig; with none, the host's file as it is.
pub fn resolv_conf(dns: Option<&DnsConfig>, host_resolv: &str) -> String {
    let Some(dns) = dns.filter(|d| !d.servers.is_empty() || !d.searches.is_empty() || !d.options.is_empty()) else {
        return host_resolv.to_string();
    };
    let mut out = String::new();
    if !dns.searches.is_empty() {
        let _ = writeln!(out, "search {}", dns.searches.join(" "));
    }
    for server in &dns.servers {
        let _ = writeln!(out, "nameserver {server}");
    }
    if !dns.options.is_empty() {
        let _ = writeln!(out, "options {}", dns.options.join(" "));
    }
    out
}

/// Checks DNSConfig values before they land in a file other processes parse.
pub fn validate_dns(dns: &DnsConfig) -> Result<(), String> {
    for server in &dns.servers {
        if server.parse::<std::net::IpAddr>().is_err() {
            return Err(format!("DNS server {server:?} is not an IP address"));
        }
    }
    for item in dns.searches.iter().chain(&dns.options) {
        if item.is_empty() || item.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!("DNS search/option {item:?} must be one word"));
        }
    }
    Ok(())
}

/// A hostname as the kernel and resolvers accept it (RFC 1123 labels, at most 64 bytes for uname).
pub fn validate_hostname(hostname: &str) -> Result<(), String> {
    let ok = !hostname.is_empty()
        && hostname.len() <= 64
        && hostname.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "hostname {hostname:?} is not a valid RFC 1123 host name of at most 64 bytes"
        ))
    }
}

/// A directory holding per-object directories (`sandboxes/`, `containers/`): searchable, not
/// listable, so that a pod user namespace's root can pass to its own directory.
pub const SHARED_DIR_MODE: u32 = 0o711;
/// A pod's or container's own directory: the host's root only.
pub const PRIVATE_DIR_MODE: u32 = 0o700;
/// The same for a pod with its own user namespace, group-owned by the pod root's host gid: that
/// root must reach its rootfs and pod files while its containers are set up; nobody else may.
pub const USERNS_DIR_MODE: u32 = 0o710;
/// Files only the daemon and shims read (bundle specs).
pub const PRIVATE_FILE_MODE: u32 = 0o600;

/// Creates a pod's or container's own directory closed to other users (see `restrict_dir`),
/// with no moment where it is open. Missing parents are made `SHARED_DIR_MODE`.
pub fn create_private_dir(dir: &Path, pod_gid: Option<u32>) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if let Some(parent) = dir.parent().filter(|p| !p.is_dir()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(SHARED_DIR_MODE)
            .create(parent)
            .map_err(|e| with_path(e, "creating", parent))?;
    }
    match std::fs::DirBuilder::new().mode(PRIVATE_DIR_MODE).create(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(with_path(e, "creating", dir)),
        _ => {}
    }
    restrict_dir(dir, pod_gid)
}

/// Closes an existing pod or container directory: 0700, or with `pod_gid` (the host gid of the
/// pod's root, for a pod with its own user namespace) 0710 group-owned by it. An older scute
/// made these 0755: this is also how a start tightens them.
pub fn restrict_dir(dir: &Path, pod_gid: Option<u32>) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let chmod = |mode: u32| {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
            .map_err(|e| with_path(e, &format!("setting mode {mode:o} on"), dir))
    };
    // Closed first, then opened to the pod's group only once that group owns it.
    chmod(PRIVATE_DIR_MODE)?;
    if let Some(gid) = pod_gid {
        std::os::unix::fs::chown(dir, None, Some(gid))
            .map_err(|e| with_path(e, &format!("giving group {gid}"), dir))?;
        chmod(USERNS_DIR_MODE)?;
    }
    Ok(())
}

/// Writes `spec` to `<dir>/bundle/config.json` (a private dir, a private file replaced atomically;
/// not synced: a spec matters only while the container it made lives) and returns the bundle dir.
pub fn write_bundle(dir: &Path, spec: &oci_spec::runtime::Spec) -> io::Result<PathBuf> {
    let bundle = dir.join("bundle");
    create_private_dir(&bundle, None)?;
    let json = serde_json::to_vec_pretty(spec).map_err(io::Error::other)?;
    let config = bundle.join("config.json");
    scute_sys::files::write_replace_mode(&config, &json, PRIVATE_FILE_MODE)
        .map_err(|e| with_path(e, "writing", &config))?;
    Ok(bundle)
}

fn with_path(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

/// Writes `contents` to `path` atomically (temp + rename; not synced: they live as long as the
/// pod's processes), mode 0644: the pod's hostname, hosts and resolv.conf, which every user
/// inside its containers reads (a bind mount keeps the file's mode). The pod's directory is what
/// keeps host users out.
pub fn write_atomic(path: &Path, contents: &str) -> io::Result<()> {
    scute_sys::files::write_replace_mode(path, contents.as_bytes(), 0o644)
}

/// Mounts the pod's /dev/shm: a tmpfs of `size` bytes at `target` (created if needed).
pub fn mount_shm(target: &Path, size: u64) -> io::Result<()> {
    use nix::mount::{mount, MsFlags};
    std::fs::create_dir_all(target)?;
    if scute_sys::mountinfo::is_mountpoint(target) {
        return Ok(());
    }
    let data = format!("mode=1777,size={size}");
    mount(
        Some("shm"),
        target,
        Some("tmpfs"),
        MsFlags::MS_NOEXEC | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(data.as_str()),
    )
    .map_err(io::Error::from)
}

/// Unmounts the pod's /dev/shm; a path that is not mounted (or is gone) is fine.
pub fn unmount_shm(target: &Path) -> io::Result<()> {
    use nix::mount::{umount2, MntFlags};
    if scute_sys::mountinfo::is_mountpoint(target) {
        umount2(target, MntFlags::MNT_DETACH).map_err(io::Error::from)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_from_dns_config_or_host() {
        let dns = DnsConfig {
            servers: vec!["10.96.0.10".into()],
            searches: vec!["default.svc.cluster.local".into(), "svc.cluster.local".into()],
            options: vec!["ndots:5".into()],
        };
        assert_eq!(
            resolv_conf(Some(&dns), "nameserver 1.1.1.1\n"),
            "search default.svc.cluster.local svc.cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n"
        );
        assert_eq!(resolv_conf(None, "nameserver 1.1.1.1\n"), "nameserver 1.1.1.1\n");
        assert_eq!(resolv_conf(Some(&DnsConfig::default()), "host\n"), "host\n");
    }

    #[test]
    fn dns_and_hostname_validation() {
        assert!(validate_dns(&DnsConfig {
            servers: vec!["not-an-ip".into()],
            ..Default::default()
        })
        .is_err());
        assert!(validate_dns(&DnsConfig {
            options: vec!["ndots:5\nnameserver 6.6.6.6".into()],
            ..Default::default()
        })
        .is_err());
        assert!(validate_hostname("web-0.example").is_ok());
        for bad in ["", "-x", "a b", "a..b", &"x".repeat(65)] {
            assert!(validate_hostname(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn hosts_file_names_the_pod() {
        let hosts = hosts_file("web-0", &["10.88.0.5".parse().unwrap()]);
        assert!(hosts.contains("127.0.0.1\tlocalhost\n"));
        assert!(hosts.ends_with("10.88.0.5\tweb-0\n"));
    }

    #[test]
    fn atomic_write_and_mount_points() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("hostname");
        write_atomic(&p, "a\n").unwrap();
        write_atomic(&p, "b\n").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "b\n");
        assert!(scute_sys::mountinfo::is_mountpoint(Path::new("/proc")));
        assert!(!scute_sys::mountinfo::is_mountpoint(dir.path()));
    }

    #[test]
    fn private_dirs_are_closed_and_open_only_to_the_pods_group() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let object = dir.path().join("sandboxes/abc");
        create_private_dir(&object, None).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&object), PRIVATE_DIR_MODE);
        assert_eq!(mode(object.parent().unwrap()), SHARED_DIR_MODE);
        std::fs::set_permissions(&object, std::fs::Permissions::from_mode(0o755)).unwrap();
        create_private_dir(&object, None).unwrap();
        assert_eq!(mode(&object), PRIVATE_DIR_MODE);
        if nix::unistd::Uid::effective().is_root() {
            restrict_dir(&object, Some(200_000)).unwrap();
            assert_eq!(mode(&object), USERNS_DIR_MODE);
            assert_eq!(std::fs::metadata(&object).unwrap().gid(), 200_000);
        }
        let spec = oci_spec::runtime::Spec::default();
        let bundle = write_bundle(&object, &spec).unwrap();
        assert_eq!(bundle, object.join("bundle"));
        assert_eq!(mode(&bundle), PRIVATE_DIR_MODE);
        let file = bundle.join("config.json");
        assert_eq!(mode(&file), PRIVATE_FILE_MODE);
        let written: oci_spec::runtime::Spec = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        assert_eq!(written, spec);
    }

    #[test]
    fn shm_mount_and_unmount() {
        let dir = tempfile::tempdir().unwrap();
        let shm = dir.path().join("shm");
        mount_shm(&shm, 1 << 20).unwrap();
        assert!(scute_sys::mountinfo::is_mountpoint(&shm));
        mount_shm(&shm, 1 << 20).unwrap();
        unmount_shm(&shm).unwrap();
        unmount_shm(&shm).unwrap();
        assert!(!scute_sys::mountinfo::is_mountpoint(&shm));
    }
}
