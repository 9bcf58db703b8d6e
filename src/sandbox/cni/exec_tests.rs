//! CNI execution with fake plugins (shell scripts recording what they get): no root needed.

use super::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;

struct Fake {
    dir: tempfile::TempDir,
    config: CniConfig,
}

impl Fake {
    /// A conf dir with `conflist` (if any) and fake plugins `types` in a bin dir.
    fn new(conflist: Option<Value>, types: &[&str]) -> Fake {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["net.d", "bin", "log", "state"] {
            fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        let config = CniConfig {
            conf_dir: dir.path().join("net.d"),
            bin_dirs: vec![dir.path().join("nope"), dir.path().join("bin")],
        };
        if let Some(list) = conflist {
            fs::write(config.conf_dir.join("10-test.conflist"), list.to_string()).unwrap();
        }
        let fake = Fake { dir, config };
        for (i, t) in types.iter().enumerate() {
            fake.plugin(t, i + 1);
        }
        fake
    }

    fn plugin(&self, name: &str, index: usize) {
        let d = self.dir.path().display();
        let script = format!(
            r#"#!/bin/sh
d={d}
n=$(printf %03d $(ls "$d/log" | grep -c json))
cat > "$d/log/$n-$CNI_COMMAND-{name}.json"
printf '%s\n' "$CNI_CONTAINERID" "$CNI_NETNS" "$CNI_IFNAME" "$CNI_ARGS" "$CNI_PATH" > "$d/log/$n-$CNI_COMMAND-{name}.env"
if [ -f "$d/{name}.$CNI_COMMAND.sleep" ]; then sleep 5; fi
if [ -f "$d/{name}.$CNI_COMMAND.fail" ]; then cat "$d/{name}.$CNI_COMMAND.fail"; exit 1; fi
if [ "$CNI_COMMAND" = ADD ]; then
  printf '{{"cniVersion":"1.0.0","interfaces":[{{"name":"{name}","sandbox":"/x"}}],"ips":[{{"address":"10.9.0.{index}/24","interface":0}}]}}'
fi
"#
        );
        let path = self.dir.path().join("bin").join(name);
        fs::write(&path, script).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn manager(&self) -> CniManager {
        CniManager::new(&self.config, &self.dir.path().join("state"))
    }

    fn netns(&self) -> PathBuf {
        let p = self.dir.path().join("netns");
        fs::write(&p, "").unwrap();
        p
    }

    fn touch(&self, name: &str, content: &str) {
        fs::write(self.dir.path().join(name), content).unwrap();
    }

    /// (command-plugin, stdin, env lines) of every call so far, in order.
    fn calls(&self) -> Vec<(String, Value, Vec<String>)> {
        let log = self.dir.path().join("log");
        let mut names: Vec<String> = fs::read_dir(&log)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .filter(|n| n.ends_with(".json"))
            .collect();
        names.sort();
        names
            .into_iter()
            .map(|n| {
                let stdin = serde_json::from_slice(&fs::read(log.join(&n)).unwrap()).unwrap();
                let env = fs::read_to_string(log.join(n.replace(".json", ".env")))
                    .unwrap()
                    .lines()
                    .map(str::to_string)
                    .collect();
                let label = n.trim_end_matches(".json")[4..].to_string();
                (label, stdin, env)
            })
            .collect()
    }

    fn clear_log(&self) {
        let log = self.dir.path().join("log");
        fs::remove_dir_all(&log).unwrap();
        fs::create_dir(&log).unwrap();
    }

    fn labels(&self) -> Vec<String> {
        self.calls().into_iter().map(|c| c.0).collect()
    }
}

fn three_plugins() -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "testnet",
        "plugins": [
            { "type": "a", "ipam": { "type": "ipam" } },
            { "type": "b", "capabilities": { "bandwidth": true, "portMappings": false } },
            { "type": "c", "capabilities": { "portMappings": true }, "cniVersion": "0.0.9", "name": "overridden" }
        ]
    })
}

fn request<'a>(netns: &'a Path) -> AttachRequest<'a> {
    AttachRequest {
        pod_name: "web",
        pod_namespace: "default",
        pod_uid: "uid-1",
        port_mappings: vec![
            PortMapping {
                host_port: 8080,
                container_port: 80,
                protocol: "TCP".into(),
                host_ip: String::new(),
            },
            // No host port: not mapped.
            PortMapping {
                host_port: 0,
                container_port: 81,
                protocol: "tcp".into(),
                host_ip: String::new(),
            },
        ],
        bandwidth: Some(Bandwidth {
            ingress_rate: 1_000_000,
            ..Default::default()
        }),
        ..AttachRequest::new("sandbox1", netns)
    }
}

#[test]
fn stdin_gets_name_version_prev_result_and_only_declared_capabilities() {
    let chain = Chain {
        list: three_plugins(),
        binaries: vec![PathBuf::new(); 3],
    };
    let netns = PathBuf::from("/x");
    let args = request(&netns).capability_args();
    let prev = json!({"cniVersion": "1.0.0", "ips": []});

    let a = plugin_stdin(&chain, 0, None, &args);
    assert_eq!(
        a,
        json!({"type": "a", "ipam": {"type": "ipam"}, "name": "testnet", "cniVersion": "1.0.0"})
    );

    let b = plugin_stdin(&chain, 1, Some(&prev), &args);
    assert_eq!(b["prevResult"], prev);
    assert_eq!(
        b["runtimeConfig"],
        json!({"bandwidth": {"ingressRate": 1_000_000, "ingressBurst": 0, "egressRate": 0, "egressBurst": 0}})
    );

    let c = plugin_stdin(&chain, 2, Some(&prev), &args);
    assert_eq!(c["name"], "testnet");
    assert_eq!(c["cniVersion"], "1.0.0");
    assert_eq!(
        c["runtimeConfig"],
        json!({"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]})
    );

    // Declared but not requested: no runtimeConfig at all.
    let c = plugin_stdin(&chain, 2, None, &Map::new());
    assert!(c.get("runtimeConfig").is_none());
    assert!(c.get("prevResult").is_none());
}

#[test]
fn cni_args_and_capability_args() {
    let netns = PathBuf::from("/x");
    let mut req = request(&netns);
    assert_eq!(
        req.cni_args(),
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;K8S_POD_INFRA_CONTAINER_ID=sandbox1;K8S_POD_UID=uid-1"
    );
    req.port_mappings[0].host_ip = "127.0.0.1".into();
    req.dns = Some(Dns {
        servers: vec!["10.96.0.10".into()],
        searches: vec!["svc.cluster.local".into()],
        options: vec!["ndots:5".into()],
    });
    let args = req.capability_args();
    assert_eq!(args["portMappings"][0]["hostIP"], "127.0.0.1");
    assert_eq!(args["dns"]["searches"][0], "svc.cluster.local");
    assert!(AttachRequest::new("x", &netns).capability_args().is_empty());
}

#[tokio::test]
async fn setup_chains_results_and_teardown_runs_in_reverse_with_the_cached_result() {
    let fake = Fake::new(Some(three_plugins()), &["a", "b", "c", "ipam"]);
    let netns = fake.netns();
    let mgr = fake.manager();
    let req = request(&netns);

    assert!(mgr.cached_attachments().is_empty());
    let result = mgr.setup(&req).await.unwrap();
    let cached: Vec<(String, String)> = mgr
        .cached_attachments()
        .into_iter()
        .map(|c| (c.container_id, c.ifname))
        .collect();
    assert_eq!(cached, [("sandbox1".to_string(), "eth0".to_string())]);
    assert_eq!(
        result.ips,
        vec!["10.9.0.3".parse::<IpAddr>().unwrap()],
        "{:?}",
        result.raw
    );
    assert_eq!(result.raw["interfaces"][0]["name"], "c");
    let calls = fake.calls();
    assert_eq!(
        calls.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(),
        ["ADD-a", "ADD-b", "ADD-c"],
        "no loopback plugin: the daemon brings lo up when it makes the netns"
    );
    // Each plugin gets the previous one's result.
    assert!(calls[0].1.get("prevResult").is_none());
    assert_eq!(calls[1].1["prevResult"]["interfaces"][0]["name"], "a");
    assert_eq!(calls[2].1["prevResult"]["interfaces"][0]["name"], "b");
    // Environment.
    let env = &calls[0].2;
    assert_eq!(env[0], "sandbox1");
    assert_eq!(env[1], netns.display().to_string());
    assert_eq!(env[2], "eth0");
    assert!(env[3].contains("K8S_POD_NAME=web"));
    assert_eq!(
        env[4],
        format!(
            "{}:{}",
            fake.dir.path().join("nope").display(),
            fake.dir.path().join("bin").display()
        )
    );

    // CHECK: in order, the given result as prevResult.
    fake.clear_log();
    mgr.check(&req, &result.raw).await.unwrap();
    let calls = fake.calls();
    assert_eq!(
        calls.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(),
        ["CHECK-a", "CHECK-b", "CHECK-c"]
    );
    assert!(calls.iter().all(|c| c.1["prevResult"] == result.raw));

    // The conf dir changes: teardown still uses the list the attachment was made with.
    fs::write(
        fake.config.conf_dir.join("10-test.conflist"),
        json!({"cniVersion": "1.0.0", "name": "other", "plugins": [{"type": "a"}]}).to_string(),
    )
    .unwrap();
    fake.clear_log();
    mgr.teardown(&req).await.unwrap();
    let calls = fake.calls();
    assert_eq!(
        calls.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(),
        ["DEL-c", "DEL-b", "DEL-a"]
    );
    assert!(calls
        .iter()
        .all(|c| c.1["prevResult"] == result.raw && c.1["name"] == "testnet"));
    assert_eq!(calls[0].1["runtimeConfig"]["portMappings"][0]["hostPort"], 8080);
    // The fake netns is a plain file, not a namespace: DEL gets an empty CNI_NETNS (the root
    // tests see a real path passed on).
    assert_eq!(calls[1].2[1], "");
    assert!(mgr.cached_attachments().is_empty());

    // Again, with the netns gone: current config, no prevResult, empty CNI_NETNS.
    fs::remove_file(&netns).unwrap();
    fake.clear_log();
    mgr.teardown(&req).await.unwrap();
    let calls = fake.calls();
    assert_eq!(calls.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(), ["DEL-a"]);
    assert!(calls[0].1.get("prevResult").is_none());
    assert_eq!(calls[0].1["name"], "other");
    assert_eq!(calls[0].2[1], "");
}

#[tokio::test]
async fn a_failing_add_is_reported_and_rolled_back() {
    let fake = Fake::new(Some(three_plugins()), &["a", "b", "c", "ipam"]);
    fake.touch(
        "b.ADD.fail",
        r#"{"cniVersion":"1.0.0","code":11,"msg":"try again later","details":"busy"}"#,
    );
    let netns = fake.netns();
    let mgr = fake.manager();
    let err = mgr.setup(&request(&netns)).await.unwrap_err();
    match &err {
        CniError::Plugin {
            plugin,
            command,
            code,
            msg,
            details,
        } => {
            assert_eq!((plugin.as_str(), *command, *code), ("b", "ADD", 11));
            assert_eq!((msg.as_str(), details.as_str()), ("try again later", "busy"));
        }
        other => panic!("{other:?}"),
    }
    assert!(
        err.to_string()
            .contains("CNI plugin b ADD failed (code 11): try again later: busy"),
        "{err}"
    );
    let calls = fake.calls();
    assert_eq!(
        calls.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(),
        ["ADD-a", "ADD-b", "DEL-b", "DEL-a"]
    );
    // The rollback DEL gets the last good result.
    assert_eq!(calls[2].1["prevResult"]["interfaces"][0]["name"], "a");
    assert!(!fake
        .dir
        .path()
        .join("state/cni/results")
        .join("testnet-sandbox1-eth0")
        .exists());

    // Unstructured failure: stderr/stdout text.
    fs::remove_file(fake.dir.path().join("b.ADD.fail")).unwrap();
    fake.touch("a.ADD.fail", "plain words");
    fake.clear_log();
    let err = mgr.setup(&request(&netns)).await.unwrap_err();
    assert!(
        matches!(&err, CniError::Failed { plugin, message, .. } if plugin == "a" && message.contains("plain words")),
        "{err:?}"
    );
    assert_eq!(fake.labels(), ["ADD-a", "DEL-a"]);
}

#[tokio::test]
async fn a_hanging_plugin_times_out() {
    let fake = Fake::new(Some(three_plugins()), &["a", "b", "c", "ipam"]);
    fake.touch("a.ADD.sleep", "");
    let netns = fake.netns();
    let mgr = fake.manager().with_timeout(Duration::from_millis(300));
    let started = std::time::Instant::now();
    let err = mgr.setup(&request(&netns)).await.unwrap_err();
    assert!(
        matches!(&err, CniError::Timeout { plugin, command: "ADD", .. } if plugin == "a"),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(4));
}

#[tokio::test]
async fn check_and_status_follow_the_list_version() {
    let mut list = three_plugins();
    list["cniVersion"] = json!("0.3.1");
    let fake = Fake::new(Some(list.clone()), &["a", "b", "c", "ipam"]);
    let netns = fake.netns();
    let mgr = fake.manager();
    let req = request(&netns);
    // 0.3.1: no CHECK, no STATUS.
    mgr.check(&req, &json!({})).await.unwrap();
    mgr.status().await.unwrap();
    assert!(fake.labels().is_empty());

    list["cniVersion"] = json!("1.0.0");
    list["disableCheck"] = json!(true);
    fs::write(fake.config.conf_dir.join("10-test.conflist"), list.to_string()).unwrap();
    mgr.check(&req, &json!({})).await.unwrap();
    assert!(fake.labels().is_empty());

    // 1.1: the highest supported of cniVersions; STATUS in order, failures reported.
    list["cniVersions"] = json!(["1.0.0", "1.1.0", "9.0.0"]);
    fs::write(fake.config.conf_dir.join("10-test.conflist"), list.to_string()).unwrap();
    mgr.status().await.unwrap();
    let calls = fake.calls();
    assert_eq!(
        calls.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(),
        ["STATUS-a", "STATUS-b", "STATUS-c"]
    );
    assert_eq!(calls[0].1["cniVersion"], "1.1.0");
    fake.touch("b.STATUS.fail", r#"{"code":50,"msg":"The plugin is not available"}"#);
    let err = mgr.status().await.unwrap_err();
    assert!(matches!(err, CniError::Plugin { code: 50, .. }), "{err:?}");
}

#[test]
fn network_falls_back_to_the_embedded_default_only_without_config() {
    let fake = Fake::new(None, &["bridge", "portmap", "firewall", "host-local"]);
    let mgr = fake.manager();
    // No loopback plugin, and none needed.
    let net = mgr.network().unwrap();
    assert_eq!(net.conf_file, Path::new(EMBEDDED_CONF_FILE));
    assert_eq!(net.name, DEFAULT_NETWORK_NAME);
    assert_eq!(net.cni_version, "1.0.0");
    assert_eq!(
        net.plugins.iter().map(|p| p.0.as_str()).collect::<Vec<_>>(),
        ["bridge", "portmap", "firewall"]
    );
    assert_eq!(
        mgr.default_conflist()["plugins"][0]["ipam"]["dataDir"],
        json!(fake.dir.path().join("state/cni/networks"))
    );
    // The IPAM plugin is required too.
    fs::remove_file(fake.dir.path().join("bin/host-local")).unwrap();
    assert!(matches!(mgr.network(), Err(NotReady::PluginMissing { plugin, .. }) if plugin == "host-local"));
    fake.plugin("host-local", 10);

    // A config in the conf dir wins; a broken one is reported, not replaced.
    fs::write(fake.config.conf_dir.join("a.conflist"), "{").unwrap();
    assert!(matches!(mgr.network(), Err(NotReady::BadConfig { .. })));
    fs::write(
        fake.config.conf_dir.join("a.conflist"),
        r#"{"cniVersion":"0.4.0","name":"mine","plugins":[{"type":"portmap"}]}"#,
    )
    .unwrap();
    assert_eq!(mgr.network().unwrap().name, "mine");
}

#[tokio::test]
async fn single_plugin_conf_files_are_one_plugin_lists() {
    let fake = Fake::new(None, &["a", "ipam"]);
    fs::write(
        fake.config.conf_dir.join("10-a.conf"),
        r#"{"cniVersion":"0.4.0","name":"single","type":"a","ipam":{"type":"ipam"}}"#,
    )
    .unwrap();
    let netns = fake.netns();
    let mgr = fake.manager();
    let req = AttachRequest::new("s2", &netns);
    let result = mgr.setup(&req).await.unwrap();
    assert_eq!(result.ips, vec!["10.9.0.1".parse::<IpAddr>().unwrap()]);
    let calls = fake.calls();
    assert_eq!(calls[0].0, "ADD-a");
    assert_eq!(calls[0].1["name"], "single");
    assert_eq!(calls[0].1["cniVersion"], "0.4.0");
    assert_eq!(calls[0].1["ipam"]["type"], "ipam");
}

#[tokio::test]
async fn bad_requests_are_refused_before_any_plugin_runs() {
    let fake = Fake::new(Some(three_plugins()), &["a", "b", "c", "ipam"]);
    let netns = fake.netns();
    let mgr = fake.manager();
    for (id, ifname) in [
        ("", "eth0"),
        ("../x", "eth0"),
        ("ok", "averyveryverylongname"),
        ("ok", ""),
    ] {
        let req = AttachRequest {
            ifname,
            ..AttachRequest::new(id, &netns)
        };
        assert!(matches!(mgr.setup(&req).await, Err(CniError::InvalidRequest(_))));
        assert!(matches!(mgr.teardown(&req).await, Err(CniError::InvalidRequest(_))));
    }
    assert!(fake.labels().is_empty());
}

#[test]
fn result_ips_prefers_ipv4_and_skips_host_side_interfaces() {
    let result = json!({
        "cniVersion": "1.0.0",
        "interfaces": [
            {"name": "cni0", "mac": "aa"},
            {"name": "veth1", "mac": "bb"},
            {"name": "eth0", "mac": "cc", "sandbox": "/run/scute/netns/x"}
        ],
        "ips": [
            {"address": "fd00::5/64", "interface": 2},
            {"address": "10.88.0.1/16", "interface": 0},
            {"address": "10.88.0.5/16", "gateway": "10.88.0.1", "interface": 2}
        ]
    });
    assert_eq!(
        result_ips(&result),
        vec!["10.88.0.5".parse::<IpAddr>().unwrap(), "fd00::5".parse().unwrap()]
    );
    // No interface index: taken.
    assert_eq!(result_ips(&json!({"ips": [{"address": "10.1.0.2/24"}]})).len(), 1);
    // 0.2.0 layout.
    assert_eq!(
        result_ips(&json!({"ip4": {"ip": "10.1.0.3/24"}, "ip6": {"ip": "fd00::3/64"}})),
        vec!["10.1.0.3".parse::<IpAddr>().unwrap(), "fd00::3".parse().unwrap()]
    );
}

#[test]
fn versions_compare_numerically() {
    assert!(version_at_least("1.0.0", "0.4.0"));
    assert!(version_at_least("0.10.0", "0.4.0"));
    assert!(!version_at_least("0.3.1", "0.4.0"));
    assert!(!version_at_least("", "0.2.0"));
    assert!(version_at_least("1.1.0", "1.1.0"));
}
