//! Debian's real plugins from /usr/lib/cni in real namespaces: needs root (skipped otherwise).
//! Every test uses its own bridge name, subnet and data dir and removes what it made.

use super::*;
use crate::sandbox::netns::NetNs;
use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::Arc;

const PLUGIN_DIR: &str = "/usr/lib/cni";

fn usable() -> bool {
    let ok = nix::unistd::geteuid().is_root() && Path::new(PLUGIN_DIR).join("bridge").exists();
    if !ok {
        eprintln!("skipped: needs root and {PLUGIN_DIR}");
    }
    ok
}

fn random() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    );
    h.finish()
}

/// A test network: unique bridge "sct" + 6 chars, unique /24, temp conf/data/state dirs, and
/// a guard that tears down, unpins and deletes the bridge even when the test fails.
struct Net {
    dir: tempfile::TempDir,
    bridge: String,
    /// e.g. "10.213.7." (a /24)
    prefix: String,
    mgr: Arc<CniManager>,
    pods: Vec<(String, PathBuf)>,
}

impl Net {
    /// `plugins` after bridge; `None` for an empty conf dir (the embedded default, moved to
    /// this test's bridge and subnet).
    fn new(extra: Option<Vec<Value>>) -> Net {
        let r = random();
        let alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789";
        let bridge: String = std::iter::once("sct".to_string())
            .chain((0..6).map(|i| (alphabet[((r >> (i * 6)) % 36) as usize] as char).to_string()))
            .collect();
        let prefix = format!("10.{}.{}.", 200 + (r >> 40) % 50, (r >> 48) % 256);
        let subnet = format!("{prefix}0/24");
        let dir = tempfile::tempdir().unwrap();
        let config = CniConfig {
            conf_dir: dir.path().join("net.d"),
            bin_dirs: vec![PathBuf::from(PLUGIN_DIR)],
        };
        fs::create_dir_all(&config.conf_dir).unwrap();
        let state = dir.path().join("state");
        let mut mgr = CniManager::new(&config, &state);
        match extra {
            Some(extra) => {
                let mut list = default_conflist(&bridge, &subnet, &dir.path().join("ipam"));
                list["name"] = json!("test-net");
                let plugins = list["plugins"].as_array_mut().unwrap();
                plugins.truncate(1);
                plugins.extend(extra);
                fs::write(config.conf_dir.join("10-test.conflist"), list.to_string()).unwrap();
            }
            None => mgr = mgr.with_default_network(&bridge, &subnet),
        }
        Net {
            dir,
            bridge,
            prefix,
            mgr: Arc::new(mgr),
            pods: Vec::new(),
        }
    }

    fn pod(&mut self, name: &str) -> (String, PathBuf) {
        let id = format!("{}{name}", self.bridge);
        let path = self.dir.path().join("netns").join(&id);
        NetNs::create(&path).unwrap();
        self.pods.push((id.clone(), path.clone()));
        (id, path)
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let mgr = self.mgr.clone();
        let pods = self.pods.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            for (id, path) in &pods {
                let _ = rt.block_on(mgr.teardown(&AttachRequest::new(id, path)));
                let _ = NetNs::remove(path);
            }
        })
        .join()
        .unwrap();
        let _ = Command::new("ip").args(["link", "del", &self.bridge]).output();
    }
}

fn portmap() -> Value {
    json!({"type": "portmap", "capabilities": {"portMappings": true}, "snat": true})
}

fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// `ip -o link show <ifname>` inside the pinned namespace.
fn link_in(netns: &Path, ifname: &str) -> String {
    let (ok, text) = run(Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args(["ip", "-o", "link", "show", ifname]));
    assert!(ok, "{text}");
    text
}

fn host_link_exists(name: &str) -> bool {
    run(Command::new("ip").args(["link", "show", name])).0
}

/// Runs `f` on a thread inside the network namespace (sockets it makes stay in there).
fn inside<T: Send + 'static>(netns: &Path, f: impl FnOnce() -> T + Send + 'static) -> T {
    let ns = fs::File::open(netns).unwrap();
    std::thread::spawn(move || {
        // SAFETY: setns on this thread only; the thread ends after `f`.
        assert_eq!(unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) }, 0);
        f()
    })
    .join()
    .unwrap()
}

fn mounted(path: &Path) -> bool {
    scute_sys::mountinfo::is_mountpoint(path)
}

/// Host-side interfaces of a result: no sandbox, not the bridge.
fn host_veths(result: &Value, bridge: &str) -> Vec<String> {
    result["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i.get("sandbox").is_none() && i["name"] != bridge)
        .map(|i| i["name"].as_str().unwrap().to_string())
        .collect()
}

fn echo_through(listener: TcpListener, mut stream: TcpStream) {
    let (mut served, _) = listener.accept().unwrap();
    stream.write_all(b"ping").unwrap();
    let mut buf = [0u8; 4];
    served.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping");
}

#[tokio::test]
async fn two_pods_get_addresses_talk_and_leave_nothing_behind() {
    if !usable() {
        return;
    }
    let mut net = Net::new(Some(vec![portmap()]));
    let (id_a, ns_a) = net.pod("a");
    let (id_b, ns_b) = net.pod("b");
    let req_a = AttachRequest {
        pod_name: "a",
        pod_namespace: "default",
        pod_uid: "uid-a",
        ..AttachRequest::new(&id_a, &ns_a)
    };
    let req_b = AttachRequest::new(&id_b, &ns_b);
    assert_eq!(net.mgr.network().unwrap().name, "test-net");

    let a = net.mgr.setup(&req_a).await.unwrap();
    let b = net.mgr.setup(&req_b).await.unwrap();
    for r in [&a, &b] {
        assert_eq!(r.ips.len(), 1, "{}", r.raw);
        assert!(
            r.ips[0].to_string().starts_with(&net.prefix),
            "{:?} not in {}0/24",
            r.ips,
            net.prefix
        );
    }
    assert_ne!(a.ips, b.ips);
    for ns in [&ns_a, &ns_b] {
        assert!(link_in(ns, "eth0").contains(",UP"), "{}", link_in(ns, "eth0"));
        assert!(link_in(ns, "lo").contains(",UP"), "{}", link_in(ns, "lo"));
    }
    let lease = |r: &AttachResult| net.dir.path().join("ipam/test-net").join(r.ips[0].to_string());
    assert!(lease(&a).exists() && lease(&b).exists());
    let veths: Vec<String> = [&a, &b].iter().flat_map(|r| host_veths(&r.raw, &net.bridge)).collect();
    assert_eq!(veths.len(), 2, "{}", a.raw);
    assert!(veths.iter().all(|v| host_link_exists(v)));

    // b connects to a over the bridge.
    let listener = inside(&ns_a, || TcpListener::bind("0.0.0.0:0").unwrap());
    let port = listener.local_addr().unwrap().port();
    let ip_a = a.ips[0];
    let stream = inside(&ns_b, move || {
        TcpStream::connect_timeout(&(ip_a, port).into(), Duration::from_secs(5)).unwrap()
    });
    echo_through(listener, stream);

    // CHECK agrees with what is there.
    net.mgr.check(&req_a, &a.raw).await.unwrap();

    for req in [&req_a, &req_b] {
        net.mgr.teardown(req).await.unwrap();
        net.mgr.teardown(req).await.unwrap();
    }
    assert!(veths.iter().all(|v| !host_link_exists(v)), "veths left: {veths:?}");
    assert!(!lease(&a).exists() && !lease(&b).exists(), "IPs not released");
    assert!(!net
        .dir
        .path()
        .join("state/cni/results")
        .join(format!("test-net-{id_a}-eth0"))
        .exists());
    for ns in [&ns_a, &ns_b] {
        NetNs::remove(ns).unwrap();
        assert!(!mounted(ns));
    }
    // Teardown after the netns is gone (empty CNI_NETNS) still succeeds.
    net.mgr.teardown(&req_a).await.unwrap();
}

#[tokio::test]
async fn host_ports_are_mapped_and_unmapped() {
    if !usable() {
        return;
    }
    let mut net = Net::new(Some(vec![portmap()]));
    let (id, ns) = net.pod("p");
    let req = AttachRequest {
        port_mappings: vec![PortMapping {
            host_port: 18080,
            container_port: 80,
            protocol: "tcp".into(),
            host_ip: String::new(),
        }],
        ..AttachRequest::new(&id, &ns)
    };
    let pod = net.mgr.setup(&req).await.unwrap();
    let rules = || {
        let (_, text) = run(Command::new("iptables").args(["-w", "-t", "nat", "-S", "CNI-HOSTPORT-DNAT"]));
        text.lines()
            .filter(|l| l.contains(&id) && l.contains("18080"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(rules().len(), 1, "{:?}", rules());

    // The host reaches the pod's port 80 through the host port on the gateway address.
    let listener = inside(&ns, || TcpListener::bind("0.0.0.0:80").unwrap());
    let gateway: IpAddr = format!("{}1", net.prefix).parse().unwrap();
    let stream = TcpStream::connect_timeout(&(gateway, 18080).into(), Duration::from_secs(5)).unwrap();
    echo_through(listener, stream);
    assert!(pod.ips[0].to_string().starts_with(&net.prefix));

    net.mgr.teardown(&req).await.unwrap();
    assert!(rules().is_empty(), "{:?}", rules());
}

#[tokio::test]
async fn the_embedded_default_network_works_with_debian_plugins() {
    if !usable() {
        return;
    }
    let mut net = Net::new(None);
    let network = net.mgr.network().unwrap();
    assert_eq!(network.conf_file, Path::new(EMBEDDED_CONF_FILE));
    net.mgr.status().await.unwrap();
    let (id, ns) = net.pod("d");
    let req = AttachRequest::new(&id, &ns);
    let pod = net.mgr.setup(&req).await.unwrap();
    assert!(pod.ips[0].to_string().starts_with(&net.prefix), "{}", pod.raw);
    let lease = net
        .dir
        .path()
        .join("state/cni/networks")
        .join(DEFAULT_NETWORK_NAME)
        .join(pod.ips[0].to_string());
    assert!(lease.exists());
    assert!(link_in(&ns, "eth0").contains(",UP"));
    let forward_rules = || {
        let (_, text) = run(Command::new("iptables").args(["-w", "-S", "CNI-FORWARD"]));
        let ip = format!("{}/32", pod.ips[0]);
        text.lines().filter(|l| l.contains(&ip)).count()
    };
    assert!(forward_rules() > 0, "firewall added no rule");
    net.mgr.teardown(&req).await.unwrap();
    assert!(!lease.exists());
    assert_eq!(forward_rules(), 0);
    NetNs::remove(&ns).unwrap();
    net.mgr.teardown(&req).await.unwrap();
}
