//! The foundation as a user sees it: a real daemon on a unix socket answering Version, Status
//! and RuntimeConfig; config errors naming the key; a store that survives restarts; socket
//! modes; graceful shutdown.

mod common;

use std::os::unix::fs::PermissionsExt;

use common::{scute, Daemon, Registry};
use scute::api;
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_names_scute_and_cri_v1() {
    let daemon = Daemon::start("");
    let v = daemon
        .runtime()
        .await
        .version(api::VersionRequest {
            version: "0.1.0".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(v.runtime_name, "scute");
    assert_eq!(v.runtime_api_version, "v1");
    assert_eq!(v.runtime_version, env!("CARGO_PKG_VERSION"));
    assert_eq!(v.version, "0.1.0");
}

/// `scute --version`, `scute version` and `crictl info` name the commit and its date; the
/// CRI Version keeps the plain semver (the kubelet shows it as the node's runtime version).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_names_the_commit_it_was_built_from() {
    let head = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string());
    let (code, out, err) = scute(&["--version"]);
    assert_eq!(code, 0, "{err}");
    let commit = out
        .split("(commit ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .unwrap_or_else(|| panic!("no commit in `scute --version`: {out:?}"));
    match &head {
        // The binary was built from a commit of this checkout (HEAD, or an earlier one when
        // only tests changed since): git knows it.
        Some(_) => {
            let known = std::process::Command::new("git")
                .args(["cat-file", "-e", &format!("{commit}^{{commit}}")])
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .status()
                .unwrap();
            assert!(
                known.success(),
                "`scute --version` names {commit:?}, not a commit of this checkout: {out:?}"
            );
        }
        None => assert_eq!(commit, "unknown", "{out:?}"),
    }
    assert!(
        out.starts_with(&format!("scute {} (commit {commit}, ", env!("CARGO_PKG_VERSION"))),
        "{out:?}"
    );
    let (_, long, _) = scute(&["version"]);
    assert!(long.contains(&format!("(commit {commit}, ")), "{long:?}");

    let daemon = Daemon::start("");
    let status = daemon
        .runtime()
        .await
        .status(api::StatusRequest { verbose: true })
        .await
        .unwrap()
        .into_inner();
    let info: serde_json::Value = serde_json::from_str(&status.info["daemon"]).unwrap();
    assert_eq!(info["commit"], commit, "{info}");
    assert_eq!(info["version"], env!("CARGO_PKG_VERSION"), "{info}");
    // A log written to a file carries no terminal colour codes.
    let log = daemon.log();
    assert!(log.contains("INFO"), "{log}");
    assert!(
        !log.contains('\x1b'),
        "escape codes in a log that is not a terminal:\n{log}"
    );
}

fn condition<'a>(status: &'a api::StatusResponse, kind: &str) -> &'a api::RuntimeCondition {
    status
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.r#type == kind)
        .unwrap_or_else(|| panic!("no {kind} condition in {status:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reports_runtime_ready_and_network_readiness_honestly() {
    let daemon = Daemon::start("");
    let mut client = daemon.runtime().await;

    // No CNI config in the (empty) conf dir: the embedded default bridge network is used, so a
    // fresh node is ready (Debian's plugins are installed by hack/setup.sh).
    let status = client
        .status(api::StatusRequest { verbose: true })
        .await
        .unwrap()
        .into_inner();
    let runtime = condition(&status, "RuntimeReady");
    assert!(
        runtime.status,
        "RuntimeReady false on a node that can run pods: {runtime:?}"
    );
    let network = condition(&status, "NetworkReady");
    assert!(network.status, "{network:?}");
    let cni: serde_json::Value = serde_json::from_str(&status.info["cniconfig"]).unwrap();
    assert_eq!(cni["name"], "scute", "the embedded default network");
    let status = client
        .status(api::StatusRequest { verbose: false })
        .await
        .unwrap()
        .into_inner();
    assert!(status.info.is_empty(), "info must be empty unless verbose");

    // A conflist whose plugins are missing names the missing plugin.
    let conflist = daemon.cni_conf_dir.join("10-pods.conflist");
    std::fs::write(
        &conflist,
        r#"{"cniVersion":"1.0.0","name":"pods","plugins":[{"type":"no-such-plugin"}]}"#,
    )
    .unwrap();
    let status = client
        .status(api::StatusRequest { verbose: false })
        .await
        .unwrap()
        .into_inner();
    let network = condition(&status, "NetworkReady");
    assert!(!network.status);
    assert!(network.message.contains("no-such-plugin"), "{}", network.message);

    // With Debian's real CNI plugins (hack/setup.sh installs them) the network is ready,
    // without a restart.
    assert!(
        std::path::Path::new("/usr/lib/cni/bridge").exists(),
        "containernetworking-plugins missing: run hack/setup.sh"
    );
    std::fs::write(
        &conflist,
        r#"{"cniVersion":"1.0.0","name":"pods","plugins":[{"type":"bridge","ipam":{"type":"host-local"}},{"type":"portmap"}]}"#,
    )
    .unwrap();
    let status = client
        .status(api::StatusRequest { verbose: true })
        .await
        .unwrap()
        .into_inner();
    let network = condition(&status, "NetworkReady");
    assert!(network.status, "{network:?}");
    assert_eq!(network.reason, "");

    // Verbose info is JSON an operator can read.
    let config: serde_json::Value = serde_json::from_str(&status.info["config"]).unwrap();
    assert_eq!(config["root"], daemon.root.to_str().unwrap());
    assert_eq!(config["runtime"]["cgroup_driver"], "cgroupfs");
    let cni: serde_json::Value = serde_json::from_str(&status.info["cniconfig"]).unwrap();
    assert_eq!(cni["name"], "pods");
    assert_eq!(status.info["lastCNILoadStatus"], "OK");

    // Handlers: the default "" and the configured "runc", each with the features every handler
    // has (tests/userns.rs and critest exercise them).
    let names: Vec<&str> = status.runtime_handlers.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(names, vec!["", "runc"]);
    for h in &status.runtime_handlers {
        let f = h.features.as_ref().unwrap();
        assert!(f.user_namespaces && f.recursive_read_only_mounts, "{h:?}");
    }
    assert!(
        status.features.unwrap().supplemental_groups_policy,
        "Merge and Strict are implemented"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_config_reports_the_configured_cgroup_driver() {
    let daemon = Daemon::start("");
    let linux = daemon
        .runtime()
        .await
        .runtime_config(api::RuntimeConfigRequest {})
        .await
        .unwrap()
        .into_inner()
        .linux
        .unwrap();
    let configured = if common::systemd_driver() {
        api::CgroupDriver::Systemd
    } else {
        api::CgroupDriver::Cgroupfs
    };
    assert_eq!(linux.cgroup_driver(), configured);

    // The flag overrides the file. systemd's driver needs systemd as PID 1 and pure cgroup v2:
    // there it is reported (the VM test node), elsewhere scute refuses to start, saying why.
    if scute::cgroups::systemd_booted() && scute::cgroups::unified_only() {
        let daemon = Daemon::start_with_args("", &["--cgroup-driver", "systemd"]);
        let linux = daemon
            .runtime()
            .await
            .runtime_config(api::RuntimeConfigRequest {})
            .await
            .unwrap()
            .into_inner()
            .linux
            .unwrap();
        assert_eq!(linux.cgroup_driver(), api::CgroupDriver::Systemd);
    } else {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("never.sock");
        let (code, _out, err) = scute(&[
            "serve",
            "--config",
            "/dev/null",
            "--root",
            dir.path().join("root").to_str().unwrap(),
            "--state",
            dir.path().join("state").to_str().unwrap(),
            "--address",
            socket.to_str().unwrap(),
            "--cgroup-driver",
            "systemd",
        ]);
        assert_ne!(code, 0, "{err}");
        assert!(err.contains("cgroup_driver = \"systemd\" needs"), "{err}");
        assert!(!socket.exists(), "a refused driver must not serve");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_survives_restart_and_crash() {
    let mut daemon = Daemon::start("");
    let mut client = daemon.runtime().await;
    let update = |cidr: &str| api::UpdateRuntimeConfigRequest {
        runtime_config: Some(api::RuntimeConfig {
            network_config: Some(api::NetworkConfig { pod_cidr: cidr.into() }),
        }),
    };
    let err = client.update_runtime_config(update("10.88.0.0/99")).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("10.88.0.0/99"));
    client.update_runtime_config(update("10.88.0.0/16")).await.unwrap();

    let pod_cidr = |status: api::StatusResponse| -> String {
        let v: serde_json::Value = serde_json::from_str(&status.info["runtimeConfig"]).unwrap();
        v["podCIDR"].as_str().unwrap().to_string()
    };

    // The client stays connected across the restart, as the kubelet does: shutdown must not
    // wait for it (it answers the GOAWAY; multi_thread so its connection task keeps running).
    let started = std::time::Instant::now();
    daemon.restart();
    assert!(
        !daemon.log().contains("did not finish"),
        "an idle client held up shutdown ({:?})",
        started.elapsed()
    );
    let mut client = daemon.runtime().await;
    let status = client
        .status(api::StatusRequest { verbose: true })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(pod_cidr(status), "10.88.0.0/16");

    // An empty CIDR from the kubelet keeps the stored one.
    client.update_runtime_config(update("")).await.unwrap();
    client
        .update_runtime_config(update("10.244.0.0/24,fd00:10:244::/64"))
        .await
        .unwrap();

    // A crash right after the reply loses nothing either (every write is a durable commit).
    daemon.kill();
    assert!(daemon.socket.exists(), "SIGKILL leaves a stale socket behind");
    daemon.start_again();
    let status = daemon
        .runtime()
        .await
        .status(api::StatusRequest { verbose: true })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(pod_cidr(status), "10.244.0.0/24,fd00:10:244::/64");
}

#[test]
fn bad_config_is_rejected_at_start_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("[grpc]\nadress = \"/run/x.sock\"\n", "unknown key `grpc.adress`"),
        (
            "[runtime]\ncgroup_driver = \"cgroupv3\"\n",
            "key `runtime.cgroup_driver`",
        ),
        (
            "[grpc]\nmax_recv_message_size = \"16M\"\n",
            "key `grpc.max_recv_message_size` must be an integer",
        ),
        ("state = \"run/scute\"\n", "key `state`: must be an absolute path"),
        ("[log\n", "is not valid TOML"),
    ];
    for (text, expected) in cases {
        let path = dir.path().join("config.toml");
        std::fs::write(&path, text).unwrap();
        let socket = dir.path().join("never.sock");
        let (code, _out, err) = scute(&[
            "serve",
            "--config",
            path.to_str().unwrap(),
            "--address",
            socket.to_str().unwrap(),
        ]);
        assert_eq!(code, 2, "{text}: {err}");
        assert!(err.contains(expected), "{text}: stderr was {err}");
        assert!(!socket.exists(), "a rejected config must not serve");
    }
    // A missing explicit config file is an error too, not silently the defaults.
    let (code, _, err) = scute(&["serve", "--config", "/nonexistent/scute.toml"]);
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent/scute.toml"), "{err}");
    // Bad flag values are named like keys.
    let (code, _, err) = scute(&["serve", "--config", "/dev/null", "--root", "relative"]);
    assert_eq!(code, 2);
    assert!(err.contains("key `root`"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_is_0660_in_a_0700_dir_and_a_second_daemon_is_refused() {
    let daemon = Daemon::start("");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&daemon.socket), 0o660);
    assert_eq!(mode(&daemon.state), 0o700);
    assert_eq!(std::fs::metadata(&daemon.state).unwrap().uid_gid(), (0, 0));

    // Another daemon pointed at the same live socket must refuse, not steal it.
    let other_root = daemon.dir().join("other-root");
    let (code, _, err) = scute(&[
        "serve",
        "--config",
        daemon.config_path.to_str().unwrap(),
        "--root",
        other_root.to_str().unwrap(),
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("in use"), "{err}");
    // The first daemon still answers.
    daemon
        .runtime()
        .await
        .version(api::VersionRequest::default())
        .await
        .unwrap();

    // And one pointed at the same root (store) must refuse as well.
    let (code, _, err) = scute(&[
        "serve",
        "--config",
        daemon.config_path.to_str().unwrap(),
        "--address",
        daemon.dir().join("other.sock").to_str().unwrap(),
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("another process"), "{err}");
}

trait UidGid {
    fn uid_gid(&self) -> (u32, u32);
}
impl UidGid for std::fs::Metadata {
    fn uid_gid(&self) -> (u32, u32) {
        use std::os::unix::fs::MetadataExt;
        (self.uid(), self.gid())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_serving_and_removes_the_socket() {
    let mut daemon = Daemon::start("");
    daemon
        .runtime()
        .await
        .version(api::VersionRequest::default())
        .await
        .unwrap();
    let status = daemon.stop();
    assert!(status.success(), "exit status {status}:\n{}", daemon.log());
    assert!(!daemon.socket.exists());
    assert!(daemon.log().contains("containers keep running"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn separate_image_endpoint_serves_image_service_only() {
    let image_socket_dir = tempfile::tempdir().unwrap();
    let image_socket = image_socket_dir.path().join("images.sock");
    let daemon = Daemon::start_with_args("", &["--image-address", &format!("unix://{}", image_socket.display())]);
    let channel = common::connect(&image_socket).await;
    // ImageService answers there (the embedded pause image is listed)...
    let images = api::image_service_client::ImageServiceClient::new(channel.clone())
        .list_images(api::ListImagesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .images;
    assert!(images
        .iter()
        .any(|i| i.repo_tags.contains(&"registry.k8s.io/pause:3.10".to_string())));
    // ...and RuntimeService does not.
    let err = api::runtime_service_client::RuntimeServiceClient::new(channel)
        .version(api::VersionRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
    assert!(
        !err.message().contains("scute"),
        "RuntimeService must not be on the image socket: {err:?}"
    );
    assert_eq!(
        std::fs::metadata(&image_socket).unwrap().permissions().mode() & 0o777,
        0o660
    );
    drop(daemon);
    assert!(!image_socket.exists(), "image socket removed on shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_method_and_duration_per_rpc() {
    let mut daemon = Daemon::start_with_args("", &["--log-format", "json", "--log-level", "scute=debug"]);
    let mut client = daemon.runtime().await;
    client.version(api::VersionRequest::default()).await.unwrap();
    let _ = client
        .checkpoint_container(api::CheckpointContainerRequest::default())
        .await;
    daemon.stop();
    let lines: Vec<serde_json::Value> = daemon
        .log()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let rpc = |method: &str| {
        lines
            .iter()
            .find(|l| l["span"]["method"] == method)
            .unwrap_or_else(|| panic!("no log line for {method} in {lines:?}"))
            .clone()
    };
    let version = rpc("Version");
    assert_eq!(version["code"], "OK");
    assert!(version["duration_ms"].as_f64().is_some());
    // A caller's mistake is logged at INFO with its code, not as the daemon's error.
    let checkpoint = rpc("CheckpointContainer");
    assert_eq!(checkpoint["code"], "InvalidArgument");
    assert_eq!(checkpoint["level"], "INFO");
}

#[test]
fn cli_version_config_default_and_check() {
    let (code, out, _) = scute(&["--version"]);
    assert_eq!(code, 0);
    assert!(
        out.trim()
            .starts_with(&format!("scute {} (commit ", env!("CARGO_PKG_VERSION"))),
        "{out:?} (version_names_the_commit_it_was_built_from checks the rest)"
    );

    // `config default` is the full, valid, commented config.
    let (code, out, _) = scute(&["config", "default"]);
    assert_eq!(code, 0);
    assert!(out.contains("# ") && out.contains("cgroup_driver = \"cgroupfs\""));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, &out).unwrap();
    let (code, shown, err) = scute(&["config", "show", "--config", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(shown.contains("address = \"/run/scute/scute.sock\""));
}

#[test]
fn check_reports_the_node_and_registry_reachability() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs.d");
    std::fs::create_dir_all(certs.join("registry.k8s.io")).unwrap();
    std::fs::write(
        certs.join("registry.k8s.io/hosts.toml"),
        format!(
            "server = \"https://registry.k8s.io\"\n[host.\"http://{}\"]\ncapabilities = [\"pull\", \"resolve\"]\n",
            registry.addr
        ),
    )
    .unwrap();
    let config = dir.path().join("c.toml");
    std::fs::write(
        &config,
        format!(
            "root = {:?}\n[registry]\nconfig_path = {:?}\n[cni]\nconf_dir = {:?}\n",
            dir.path().join("root"),
            certs,
            dir.path().join("net.d")
        ),
    )
    .unwrap();
    let (code, out, err) = scute(&["check", "--config", config.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("ok    overlay"), "{out}");
    assert!(out.contains("ok    cgroups"), "{out}");
    assert!(
        out.contains(&format!("ok    registry   http://{} reachable", registry.addr)),
        "{out}"
    );
    assert!(
        out.contains("ok    cni        network \"scute\""),
        "the embedded default network: {out}"
    );
    // The overlay probe leaves nothing in root.
    assert_eq!(std::fs::read_dir(dir.path().join("root")).unwrap().count(), 0);

    registry.stop();
    let (code, out, _) = scute(&["check", "--config", config.to_str().unwrap()]);
    assert_eq!(code, 0, "an unreachable mirror is a warning, not a node failure: {out}");
    assert!(
        out.contains(&format!("warn  registry   http://{} unreachable", registry.addr)),
        "{out}"
    );

    // A node that cannot run pods exits non-zero with the reason.
    std::fs::write(
        &config,
        format!("root = \"/proc/scute-cannot-create\"\n[registry]\nconfig_path = {certs:?}\n"),
    )
    .unwrap();
    let (code, out, _) = scute(&["check", "--config", config.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("FAIL  overlay") && out.contains("cannot run pods"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crictl_talks_to_scute_when_installed() {
    // crictl is not packaged anywhere reachable; developers build it themselves. Skip loudly.
    let Some(crictl) = common::which("crictl") else {
        eprintln!("SKIP: crictl not on PATH");
        return;
    };
    let daemon = Daemon::start("");
    let endpoint = format!("unix://{}", daemon.socket.display());
    let run = |args: &[&str]| {
        let out = std::process::Command::new(&crictl)
            .args([
                "--runtime-endpoint",
                &endpoint,
                "--image-endpoint",
                &endpoint,
                "--timeout",
                "5s",
            ])
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, out, err) = run(&["version"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("RuntimeName:  scute") && out.contains("RuntimeApiVersion:  v1"),
        "{out}"
    );
    let (ok, out, err) = run(&["info"]);
    assert!(ok, "{err}");
    let info: serde_json::Value = serde_json::from_str(&out).unwrap();
    let conditions = info["status"]["conditions"].as_array().unwrap();
    assert!(conditions
        .iter()
        .any(|c| c["type"] == "RuntimeReady" && c["status"] == true));
    let (ok, out, err) = run(&["pods"]);
    assert!(ok && out.starts_with("POD ID"), "{out}{err}");
    let (ok, out, err) = run(&["ps", "-a"]);
    assert!(ok && out.starts_with("CONTAINER"), "{out}{err}");
    let (ok, out, err) = run(&["stats"]);
    // Both clear the screen first (they are `top`-like).
    assert!(ok && out.contains("CONTAINER"), "{out}{err}");
    let (ok, out, err) = run(&["statsp"]);
    assert!(ok && out.contains("POD"), "{out}{err}");
}

/// docs/configuration.md names every key of `scute config default`, with the default the binary
/// has, and no key the binary does not have: the page cannot drift from the daemon.
#[test]
fn configuration_reference_names_every_key() {
    fn render(value: &toml::Value) -> String {
        match value {
            toml::Value::String(s) => format!("{s:?}"),
            toml::Value::Array(items) => format!("[{}]", items.iter().map(render).collect::<Vec<_>>().join(", ")),
            other => other.to_string(),
        }
    }
    fn flatten(prefix: &str, table: &toml::Table, out: &mut Vec<(String, String)>) {
        for (key, value) in table {
            let name = if prefix.is_empty() {
                key.clone()
            } else {
                format!("{prefix}.{key}")
            };
            match value {
                toml::Value::Table(inner) => flatten(&name, inner, out),
                value => out.push((name, render(value))),
            }
        }
    }
    let (code, default, _) = scute(&["config", "default"]);
    assert_eq!(code, 0);
    let mut keys = Vec::new();
    flatten("", &default.parse::<toml::Table>().unwrap(), &mut keys);
    assert!(keys.len() > 20, "{keys:?}");
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md")).unwrap();
    for (key, value) in &keys {
        let row = format!("| `{key}` | `{value}` |");
        assert!(
            page.lines().any(|l| l.starts_with(&row)),
            "docs/configuration.md has no row {row}"
        );
    }
    // And every key the page documents is one the binary has.
    for line in page.lines().filter(|l| l.starts_with("| `")) {
        let key = line.trim_start_matches("| `").split('`').next().unwrap();
        assert!(
            keys.iter().any(|(k, _)| k == key),
            "docs/configuration.md documents {key}, which `scute config default` does not have"
        );
    }
}
