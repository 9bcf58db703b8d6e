//! scute as the runtime of every node of a real Kubernetes v1.36 cluster (issue 44), driven the
//! way a user drives one: through kubectl and the API server. The cluster is `hack/cluster.sh up`
//! (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, two nodes each with its own
//! scute, kubelet and kube-proxy in a network namespace of its own, CoreDNS on the cluster);
//! hack/test.sh starts one for the run and names its kubeconfig in `SCUTE_CLUSTER_KUBECONFIG`.
//! Without it every test says it was skipped.
//!
//! Each test works in a namespace of its own, deleted (and waited for: every pod removed through
//! scute) at the end, also when it fails. The tests run one at a time (.config/nextest.toml):
//! the drain takes a node from everybody.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const AGNHOST: &str = "registry.k8s.io/e2e-test-images/agnhost:2.63.0";
const BUSYBOX: &str = "registry.k8s.io/e2e-test-images/busybox:1.36.1-1";

struct Cluster {
    kubectl: PathBuf,
    kubeconfig: String,
}

impl Cluster {
    /// The run's cluster, or None after saying the test is skipped.
    fn get(test: &str) -> Option<Cluster> {
        let Ok(kubeconfig) = std::env::var("SCUTE_CLUSTER_KUBECONFIG") else {
            eprintln!("SKIPPED {test}: no cluster (SCUTE_CLUSTER_KUBECONFIG is unset; hack/cluster.sh up starts one)");
            return None;
        };
        let tools = std::env::var_os("SCUTE_TEST_TOOLS")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/var/cache/scute-test-tools"));
        Some(Cluster {
            kubectl: tools.join("kubectl"),
            kubeconfig,
        })
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.kubectl);
        command.arg("--kubeconfig").arg(&self.kubeconfig).args(args);
        command
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run kubectl")
    }

    /// kubectl's stdout; panics with its stderr when it fails.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&all)).unwrap()
    }

    /// The nodes' names and InternalIPs, sorted by name.
    fn nodes(&self) -> Vec<(String, String)> {
        let list = self.json(&["get", "nodes"]);
        let mut nodes: Vec<_> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| {
                let ip = n["status"]["addresses"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|a| a["type"] == "InternalIP")
                    .and_then(|a| a["address"].as_str())
                    .unwrap_or_default()
                    .to_string();
                (n["metadata"]["name"].as_str().unwrap().to_string(), ip)
            })
            .collect();
        nodes.sort();
        nodes
    }

    /// A namespace of the test's own, deleted with everything in it on drop.
    fn namespace(&self, test: &str) -> Namespace<'_> {
        let name = format!("sc-{}", test.replace('_', "-").chars().take(50).collect::<String>());
        // One left by an earlier, killed run goes first.
        let _ = self.run(&[
            "delete",
            "namespace",
            &name,
            "--ignore-not-found",
            "--wait=true",
            "--timeout=180s",
        ]);
        self.ok(&["create", "namespace", &name]);
        // The namespace's default ServiceAccount comes from a controller: pods wait for it.
        wait_until("the default ServiceAccount", Duration::from_secs(60), || {
            self.run(&["-n", &name, "get", "serviceaccount", "default"])
                .status
                .success()
        });
        Namespace { cluster: self, name }
    }
}

struct Namespace<'a> {
    cluster: &'a Cluster,
    name: String,
}

impl Drop for Namespace<'_> {
    fn drop(&mut self) {
        let out = self
            .cluster
            .run(&["delete", "namespace", &self.name, "--wait=true", "--timeout=180s"]);
        if !out.status.success() && !std::thread::panicking() {
            panic!(
                "deleting namespace {}: {}",
                self.name,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

impl Namespace<'_> {
    fn kubectl(&self, args: &[&str]) -> String {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend(args);
        self.cluster.ok(&all)
    }

    fn run(&self, args: &[&str]) -> Output {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend(args);
        self.cluster.run(&all)
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend(args);
        self.cluster.json(&all)
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend(args);
        self.cluster.command(&all)
    }

    /// `kubectl apply` of one object (JSON is YAML).
    fn apply(&self, object: Value) {
        let mut child = self
            .command(&["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(object.to_string().as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "kubectl apply {object}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn wait(&self, what: &str, condition: &str, seconds: u64) {
        let out = self.run(&[
            "wait",
            what,
            &format!("--for={condition}"),
            &format!("--timeout={seconds}s"),
        ]);
        if !out.status.success() {
            panic!(
                "{what} not {condition} in {seconds} s: {}\n{}\n{}",
                String::from_utf8_lossy(&out.stderr),
                String::from_utf8_lossy(&self.run(&["get", "pods", "-o", "wide"]).stdout),
                String::from_utf8_lossy(&self.run(&["get", "events", "--sort-by=.lastTimestamp"]).stdout)
            );
        }
    }

    /// A pod running `command` in `image` (pinned to `node` when given), Ready.
    fn pod(&self, name: &str, image: &str, command: &[&str], node: Option<&str>) {
        let mut spec = json!({
            "containers": [{"name": "main", "image": image, "command": command}],
            "terminationGracePeriodSeconds": 2,
        });
        if let Some(node) = node {
            spec["nodeName"] = json!(node);
        }
        self.apply(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}));
        self.wait(&format!("pod/{name}"), "condition=Ready", 120);
    }

    fn exec(&self, pod: &str, command: &[&str]) -> String {
        let mut args = vec!["exec", pod, "--"];
        args.extend(command);
        self.kubectl(&args)
    }

    /// The output of `command` in `pod` once it succeeds and `accept`s it, run anew until then
    /// (for `within`). A new Service is programmed asynchronously: CoreDNS and each node's
    /// kube-proxy learn it through their watches, and a connection made on a node before
    /// kube-proxy's rules for it exist hangs for its whole life (its conntrack entry was made
    /// without the DNAT), so each try must be a new connection — what Kubernetes' e2e does too.
    fn first_answer(&self, pod: &str, command: &[&str], within: Duration, accept: impl Fn(&str) -> bool) -> String {
        let mut args = vec!["exec", pod, "--"];
        args.extend(command);
        poll(&format!("{command:?} in {pod}"), within, || {
            let out = self.run(&args);
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            match out.status.success() && accept(&stdout) {
                true => Ok(stdout),
                false => Err(format!("{stdout}{}", String::from_utf8_lossy(&out.stderr))),
            }
        })
    }
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    poll(what, timeout, || {
        f().then_some(()).ok_or_else(|| "still not".to_string())
    });
}

/// `probe`'s answer once it has one, asked every 500 ms for `within`; panics with `what` and
/// what `probe` last said instead.
fn poll<T>(what: &str, within: Duration, mut probe: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + within;
    loop {
        match probe() {
            Ok(answer) => return answer,
            Err(last) => assert!(
                Instant::now() < deadline,
                "{what}: not within {within:?}; the last: {last}"
            ),
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A Deployment of agnhost's netexec spread over every node, behind a ClusterIP and a NodePort
/// Service: reached by DNS name and ClusterIP from a pod on each node, and through the NodePort
/// of the other node; every answer names a pod of the Deployment.
#[test]
fn a_deployment_spreads_over_the_nodes_and_its_services_reach_it_from_each_node() {
    let Some(cluster) = Cluster::get("services") else {
        return;
    };
    let ns = cluster.namespace("services");
    let nodes = cluster.nodes();
    assert!(nodes.len() >= 2, "the cluster has {} node(s)", nodes.len());
    let replicas = 2 * nodes.len();
    ns.apply(json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                        "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}],
                    "containers": [{"name": "web", "image": AGNHOST, "args": ["netexec", "--http-port=8080"],
                        "ports": [{"containerPort": 8080}],
                        "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 1}}],
                    "terminationGracePeriodSeconds": 2,
                }
            }
        }
    }));
    ns.kubectl(&["rollout", "status", "deployment/web", "--timeout=180s"]);
    let pods = ns.json(&["get", "pods", "-l", "app=web"]);
    let pods = pods["items"].as_array().unwrap();
    let mut names: Vec<String> = pods
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().into())
        .collect();
    names.sort();
    for (node, _) in &nodes {
        let here = pods.iter().filter(|p| p["spec"]["nodeName"] == node.as_str()).count();
        assert_eq!(here, 2, "{node} runs {here} of the {replicas} replicas");
    }

    ns.apply(
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}}),
    );
    ns.apply(
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web-np"},
        "spec": {"type": "NodePort", "selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}}),
    );
    let cluster_ip = ns.json(&["get", "service", "web"])["spec"]["clusterIP"]
        .as_str()
        .unwrap()
        .to_string();
    let node_port = ns.json(&["get", "service", "web-np"])["spec"]["ports"][0]["nodePort"]
        .as_u64()
        .unwrap();

    for (i, (node, _)) in nodes.iter().enumerate() {
        let client = format!("client-{i}");
        ns.pod(&client, BUSYBOX, &["sleep", "3600"], Some(node));
        // The Service's name through cluster DNS (CoreDNS, a pod on this cluster), once CoreDNS
        // has seen the Service.
        let fqdn = format!("web.{}.svc.cluster.local", ns.name);
        ns.first_answer(&client, &["nslookup", &fqdn], Duration::from_secs(60), |lookup| {
            lookup.contains(&cluster_ip)
        });
        // Once this node's kube-proxy has the Service, several requests: kube-proxy spreads
        // them, and every answer is one of the pods. (Not wget's -T: Debian's busybox 1.35 wget
        // crashes with it, on any host.)
        for target in [
            "http://web/hostname".to_string(),
            format!("http://{cluster_ip}/hostname"),
        ] {
            ns.first_answer(
                &client,
                &["timeout", "3", "wget", "-qO-", &target],
                Duration::from_secs(60),
                |_| true,
            );
            for _ in 0..4 {
                let answer = ns.exec(&client, &["timeout", "10", "wget", "-qO-", &target]);
                assert!(
                    names.contains(&answer.trim().to_string()),
                    "{target} from {node}: {answer:?}, pods {names:?}"
                );
            }
        }
        // The other node's NodePort.
        let (other, other_ip) = &nodes[(i + 1) % nodes.len()];
        let target = format!("http://{other_ip}:{node_port}/hostname");
        let answer = ns.first_answer(
            &client,
            &["timeout", "3", "wget", "-qO-", &target],
            Duration::from_secs(60),
            |_| true,
        );
        assert!(
            names.contains(&answer.trim().to_string()),
            "NodePort of {other} from {node}: {answer:?}"
        );
    }
}

/// exec (with stdin, with a tty), attach, logs -f, logs --previous, port-forward and cp, each
/// from kubectl through the API server and the kubelet to scute's streaming server.
#[test]
fn kubectl_streams_reach_the_container_through_the_api_server() {
    let Some(cluster) = Cluster::get("streams") else { return };
    let ns = cluster.namespace("streams");
    ns.pod("web", AGNHOST, &["/agnhost", "netexec", "--http-port=8080"], None);

    // exec, and exec -i with stdin.
    assert_eq!(ns.exec("web", &["echo", "hello"]).trim(), "hello");
    let mut child = ns
        .command(&["exec", "-i", "web", "--", "sh", "-c", "tr a-z A-Z"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"through stdin\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "THROUGH STDIN");

    // exec -it: kubectl wants a terminal, which script(1) gives it; the container sees a tty.
    let command = format!(
        "{} --kubeconfig {} -n {} exec -it web -- sh -c 'tty; exit 3'",
        cluster.kubectl.display(),
        cluster.kubeconfig,
        ns.name
    );
    let out = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("/dev/pts/"), "exec -it: {text}");
    assert_eq!(out.status.code(), Some(3), "exec -it's exit code: {text}");

    // port-forward to the pod's 8080.
    let mut forward = ns
        .command(&["port-forward", "pod/web", ":8080"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(forward.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("port-forward said {line:?}"))
        .to_string();
    let answer = http_get(&format!("127.0.0.1:{port}"), "/hostname");
    let _ = forward.kill();
    let _ = forward.wait();
    assert_eq!(answer.trim(), "web", "through port-forward");

    // cp in and out (tar in the container).
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("in.txt"), "copied in\n").unwrap();
    let target = format!("{}/web:/tmp/in.txt", ns.name);
    cluster.ok(&["cp", dir.path().join("in.txt").to_str().unwrap(), &target]);
    assert_eq!(ns.exec("web", &["cat", "/tmp/in.txt"]), "copied in\n");
    ns.exec("web", &["sh", "-c", "echo copied out > /tmp/out.txt"]);
    let source = format!("{}/web:/tmp/out.txt", ns.name);
    cluster.ok(&["cp", &source, dir.path().join("out.txt").to_str().unwrap()]);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("out.txt")).unwrap(),
        "copied out\n"
    );

    // logs -f follows a container's output as it writes; then it restarts (exit 1), and
    // logs --previous shows the run before.
    ns.apply(
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "talker"},
        "spec": {"terminationGracePeriodSeconds": 2, "containers": [{"name": "main", "image": BUSYBOX,
            "command": ["sh", "-c", "for i in 1 2 3 4 5 6; do echo line-$i; sleep 1; done; exit 1"]}]}}),
    );
    ns.wait("pod/talker", "condition=Ready", 120);
    let mut follow = ns
        .command(&["logs", "-f", "talker"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(follow.stdout.take().unwrap());
    let mut seen = Vec::new();
    while seen.len() < 6 {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap() == 0 {
            break;
        }
        seen.push(line.trim().to_string());
    }
    let _ = follow.kill();
    let _ = follow.wait();
    assert_eq!(
        seen,
        (1..=6).map(|i| format!("line-{i}")).collect::<Vec<_>>(),
        "logs -f"
    );
    wait_until("talker's restart", Duration::from_secs(90), || {
        ns.json(&["get", "pod", "talker"])["status"]["containerStatuses"][0]["restartCount"]
            .as_u64()
            .unwrap_or(0)
            >= 1
    });
    let previous = ns.kubectl(&["logs", "--previous", "talker"]);
    assert!(previous.contains("line-6"), "logs --previous: {previous}");

    // attach to a container reading its stdin.
    ns.apply(
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "reader"},
        "spec": {"terminationGracePeriodSeconds": 2, "containers": [{"name": "main", "image": BUSYBOX,
            "stdin": true, "command": ["sh", "-c", "while read l; do echo got-$l; done"]}]}}),
    );
    ns.wait("pod/reader", "condition=Ready", 120);
    let mut attach = ns
        .command(&["attach", "-i", "reader"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = attach.stdin.take().unwrap();
    let stdout = attach.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // The attach may take a moment to be set up: say it until the answer comes.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut answered = false;
    while !answered && Instant::now() < deadline {
        let _ = stdin.write_all(b"ping\n");
        if let Ok(line) = rx.recv_timeout(Duration::from_secs(2)) {
            answered = line == "got-ping";
        }
    }
    drop(stdin);
    let _ = attach.kill();
    let _ = attach.wait();
    assert!(answered, "attach -i: no got-ping");
}

/// A plain HTTP/1.0 GET (the answer's body).
fn http_get(addr: &str, path: &str) -> String {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or(answer)
}

/// The controllers' workloads: a Job runs to completion, a DaemonSet runs on every node, a
/// StatefulSet rolls to a new template pod by pod.
#[test]
fn jobs_daemonsets_and_statefulsets_run_on_scute_nodes() {
    let Some(cluster) = Cluster::get("workloads") else {
        return;
    };
    let ns = cluster.namespace("workloads");
    let nodes = cluster.nodes();

    ns.apply(
        json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "sum"},
        "spec": {"completions": 2, "parallelism": 2, "backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": BUSYBOX, "command": ["sh", "-c", "echo $((40 + 2))"]}]}}}}),
    );
    ns.wait("job/sum", "condition=Complete", 180);
    let logs = ns.kubectl(&["logs", "job/sum"]);
    assert_eq!(logs.trim(), "42", "the Job's output");

    ns.apply(
        json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "every"},
        "spec": {"selector": {"matchLabels": {"app": "every"}}, "template": {
            "metadata": {"labels": {"app": "every"}},
            "spec": {"terminationGracePeriodSeconds": 2,
                "containers": [{"name": "main", "image": BUSYBOX, "command": ["sleep", "3600"]}]}}}}),
    );
    ns.kubectl(&["rollout", "status", "daemonset/every", "--timeout=180s"]);
    let pods = ns.json(&["get", "pods", "-l", "app=every"]);
    let mut on: Vec<String> = pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["spec"]["nodeName"].as_str().unwrap().to_string())
        .collect();
    on.sort();
    assert_eq!(
        on,
        nodes.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>(),
        "one DaemonSet pod per node"
    );

    ns.apply(
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "db"},
        "spec": {"clusterIP": "None", "selector": {"app": "db"}, "ports": [{"port": 80}]}}),
    );
    let statefulset = |version: &str| {
        json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db"},
            "spec": {"serviceName": "db", "replicas": 2, "selector": {"matchLabels": {"app": "db"}},
                "template": {"metadata": {"labels": {"app": "db"}}, "spec": {"terminationGracePeriodSeconds": 2,
                    "containers": [{"name": "main", "image": BUSYBOX, "env": [{"name": "VERSION", "value": version}],
                        "command": ["sh", "-c", "echo $VERSION > /tmp/version; exec sleep 3600"]}]}}}})
    };
    ns.apply(statefulset("one"));
    ns.kubectl(&["rollout", "status", "statefulset/db", "--timeout=180s"]);
    ns.apply(statefulset("two"));
    ns.kubectl(&["rollout", "status", "statefulset/db", "--timeout=180s"]);
    for pod in ["db-0", "db-1"] {
        assert_eq!(
            ns.exec(pod, &["cat", "/tmp/version"]).trim(),
            "two",
            "{pod} after the rolling update"
        );
    }
    // A StatefulSet pod's stable DNS name, naming the new db-0 once the EndpointSlice
    // controller and CoreDNS have seen it (both asynchronous to the rollout's end).
    let fqdn = format!("db-0.db.{}.svc.cluster.local", ns.name);
    let ip = ns.json(&["get", "pod", "db-0"])["status"]["podIP"]
        .as_str()
        .unwrap()
        .to_string();
    ns.first_answer("db-1", &["nslookup", &fqdn], Duration::from_secs(60), |lookup| {
        lookup.contains(&ip)
    });
}

/// Files the kubelet writes while the container runs: a ConfigMap volume updated in place, and
/// the projected ServiceAccount token the API server accepts.
#[test]
fn the_kubelets_volumes_are_seen_and_updated_in_running_containers() {
    let Some(cluster) = Cluster::get("volumes") else { return };
    let ns = cluster.namespace("volumes");
    ns.apply(
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "conf"}, "data": {"greeting": "hello"}}),
    );
    ns.apply(
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "reader"},
        "spec": {"terminationGracePeriodSeconds": 2,
            "containers": [{"name": "main", "image": AGNHOST, "command": ["sleep", "3600"],
                "volumeMounts": [{"name": "conf", "mountPath": "/etc/conf"}]}],
            "volumes": [{"name": "conf", "configMap": {"name": "conf"}}]}}),
    );
    ns.wait("pod/reader", "condition=Ready", 120);
    assert_eq!(ns.exec("reader", &["cat", "/etc/conf/greeting"]), "hello");
    ns.kubectl(&["patch", "configmap", "conf", "-p", r#"{"data":{"greeting":"bonjour"}}"#]);
    wait_until(
        "the ConfigMap update in the container",
        Duration::from_secs(120),
        || ns.exec("reader", &["cat", "/etc/conf/greeting"]) == "bonjour",
    );

    // The projected token authenticates the pod's ServiceAccount to the API server.
    // (Asked with the token alone: the admin kubeconfig's client certificate would win.)
    let token = ns.exec(
        "reader",
        &["cat", "/var/run/secrets/kubernetes.io/serviceaccount/token"],
    );
    let ca = ns.exec(
        "reader",
        &["cat", "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"],
    );
    let ca_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ca_file.path(), ca).unwrap();
    let server = cluster.ok(&[
        "config",
        "view",
        "--minify",
        "-o",
        "jsonpath={.clusters[0].cluster.server}",
    ]);
    let out = Command::new(&cluster.kubectl)
        .args([
            "--kubeconfig",
            "/dev/null",
            "--server",
            &server,
            "--certificate-authority",
        ])
        .arg(ca_file.path())
        .args(["--token", token.trim(), "auth", "whoami", "-o", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "whoami with the pod's token: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let review = String::from_utf8_lossy(&out.stdout);
    let review: Value = serde_json::from_str(&review).unwrap();
    assert_eq!(
        review["status"]["userInfo"]["username"],
        format!("system:serviceaccount:{}:default", ns.name),
        "{review}"
    );
}

/// Graceful deletion: the preStop hook runs, then SIGTERM, inside terminationGracePeriodSeconds;
/// both leave a line in a hostPath file the test reads on the host.
#[test]
fn graceful_deletion_runs_prestop_then_sigterm() {
    let Some(cluster) = Cluster::get("graceful") else {
        return;
    };
    let ns = cluster.namespace("graceful");
    let dir = tempfile::Builder::new()
        .prefix("scute-cluster-graceful-")
        .tempdir()
        .unwrap();
    let marks = dir.path().join("marks");
    ns.apply(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "polite"},
        "spec": {"terminationGracePeriodSeconds": 30,
            "containers": [{"name": "main", "image": BUSYBOX,
                "command": ["sh", "-c", "trap 'echo term >> /data/marks; exit 0' TERM; echo started >> /data/marks; while true; do sleep 0.2; done"],
                "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", "echo prestop >> /data/marks; sleep 2"]}}},
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "data", "hostPath": {"path": dir.path().to_str().unwrap()}}]}}));
    ns.wait("pod/polite", "condition=Ready", 120);
    let started = Instant::now();
    ns.kubectl(&["delete", "pod", "polite", "--wait=true", "--timeout=60s"]);
    let took = started.elapsed();
    let text = std::fs::read_to_string(&marks).unwrap();
    assert_eq!(text, "started\nprestop\nterm\n", "the pod's marks");
    // (Ordering, not timing, is asserted; the figure says how long it took.)
    eprintln!("figure: graceful deletion with a 2 s preStop took {took:?}");
}

/// `kubectl drain` evicts a node's pods through scute and the Deployment brings them back on the
/// other node; the node is uncordoned after.
#[test]
fn draining_a_node_moves_its_pods_to_the_other() {
    let Some(cluster) = Cluster::get("drain") else { return };
    let ns = cluster.namespace("drain");
    let nodes = cluster.nodes();
    let (drained, _) = nodes.last().unwrap().clone();
    ns.apply(
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "app"},
        "spec": {"replicas": 4, "selector": {"matchLabels": {"app": "app"}},
            "template": {"metadata": {"labels": {"app": "app"}}, "spec": {"terminationGracePeriodSeconds": 2,
                "containers": [{"name": "main", "image": BUSYBOX, "command": ["sleep", "3600"]}]}}}}),
    );
    ns.kubectl(&["rollout", "status", "deployment/app", "--timeout=180s"]);
    struct Uncordon<'a>(&'a Cluster, String);
    impl Drop for Uncordon<'_> {
        fn drop(&mut self) {
            let _ = self.0.run(&["uncordon", &self.1]);
        }
    }
    let _uncordon = Uncordon(&cluster, drained.clone());
    // Only this test's pods: the rest of the cluster (CoreDNS) is left where it is.
    cluster.ok(&[
        "drain",
        &drained,
        "--pod-selector=app=app",
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--timeout=120s",
    ]);
    // The drain's end is not the Deployment's: its ReplicaSet's status follows the evictions
    // asynchronously (the generation is unchanged, so `rollout status` may read it stale).
    // Four running pods, none on the drained node, are waited for.
    poll(
        &format!("the Deployment's four running pods off {drained}"),
        Duration::from_secs(180),
        || {
            let pods = ns.json(&["get", "pods", "-l", "app=app", "--field-selector=status.phase=Running"]);
            let on: Vec<&str> = pods["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["spec"]["nodeName"].as_str().unwrap_or_default())
                .collect();
            match on.len() == 4 && on.iter().all(|node| *node != drained) {
                true => Ok(()),
                false => Err(format!("running on {on:?}")),
            }
        },
    );
}

/// A container writing past its ephemeral-storage limit is evicted by the kubelet, which sees the
/// writable layer's usage in scute's ContainerStats.
#[test]
fn a_pod_over_its_ephemeral_storage_limit_is_evicted() {
    let Some(cluster) = Cluster::get("ephemeral") else {
        return;
    };
    let ns = cluster.namespace("ephemeral");
    ns.apply(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hog"},
        "spec": {"terminationGracePeriodSeconds": 2, "restartPolicy": "Never",
            "containers": [{"name": "main", "image": BUSYBOX,
                "command": ["sh", "-c", "dd if=/dev/zero of=/fill bs=1M count=40; sleep 3600"],
                "resources": {"limits": {"ephemeral-storage": "10Mi"}}}]}}));
    wait_until("the pod's eviction", Duration::from_secs(180), || {
        let pod = ns.json(&["get", "pod", "hog"]);
        pod["status"]["reason"] == "Evicted"
    });
    let pod = ns.json(&["get", "pod", "hog"]);
    assert_eq!(pod["status"]["phase"], "Failed", "{}", pod["status"]);
    let message = pod["status"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("ephemeral"), "the eviction's message: {message}");
}
