//! The Prometheus endpoint as a scraper sees it: valid text exposition, and counters that match
//! the RPCs made.

mod common;

use std::collections::HashMap;

use common::Daemon;
use scute::api;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// GET /metrics: (status line, body).
async fn scrape(address: &str) -> (String, String) {
    let mut tcp = tokio::net::TcpStream::connect(address).await.unwrap();
    tcp.write_all(format!("GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut raw = Vec::new();
    tcp.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        dechunk(body)
    } else {
        body.to_string()
    };
    (head.lines().next().unwrap().to_string(), body)
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap();
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        body = &rest[n + 2..];
    }
    out
}

/// Every sample as "name{labels}" → value; panics on a line that is not the text format.
fn samples(body: &str) -> HashMap<String, f64> {
    let mut out = HashMap::new();
    assert!(body.trim_end().ends_with("# EOF"), "no EOF marker:\n{body}");
    for line in body.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (key, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("bad line {line:?}"));
        let name_end = key.find('{').unwrap_or(key.len());
        assert!(
            key[..name_end].bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'),
            "bad metric name in {line:?}"
        );
        if name_end < key.len() {
            assert!(key.ends_with('}'), "bad labels in {line:?}");
        }
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("bad value in {line:?}"));
        out.insert(key.to_string(), value);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_the_rpcs_made() {
    let port = common::free_port();
    let address = format!("127.0.0.1:{port}");
    let daemon = Daemon::start(&format!("[metrics]\naddress = \"{address}\"\n"));
    let mut runtime = daemon.runtime().await;
    for _ in 0..3 {
        runtime.version(api::VersionRequest::default()).await.unwrap();
    }
    let missing = runtime
        .container_status(api::ContainerStatusRequest {
            container_id: "nope".into(),
            verbose: false,
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);

    let (status, body) = scrape(&address).await;
    assert!(status.contains(" 200 "), "{status}");
    let samples = samples(&body);
    let get = |key: &str| {
        *samples
            .get(key)
            .unwrap_or_else(|| panic!("{key} missing from:\n{body}"))
    };
    assert_eq!(get(r#"scute_cri_requests_total{method="Version",code="Ok"}"#), 3.0);
    assert_eq!(
        get(r#"scute_cri_requests_total{method="ContainerStatus",code="NotFound"}"#),
        1.0
    );
    assert_eq!(
        get(r#"scute_cri_request_duration_seconds_count{method="Version"}"#),
        3.0
    );
    assert!(get(r#"scute_cri_request_duration_seconds_sum{method="Version"}"#) > 0.0);
    assert_eq!(get("scute_pod_sandboxes_ready"), 0.0);
    assert_eq!(get("scute_containers_running"), 0.0);
    assert_eq!(get("scute_image_pulls_in_flight"), 0.0);
    assert!(samples.contains_key("scute_image_pull_bytes_total"), "{body}");
    assert!(samples.contains_key("scute_shims"), "{body}");

    // Anything else is not there.
    let mut tcp = tokio::net::TcpStream::connect(&address).await.unwrap();
    tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut raw = Vec::new();
    tcp.read_to_end(&mut raw).await.unwrap();
    assert!(String::from_utf8_lossy(&raw).starts_with("HTTP/1.1 404"));
}

#[test]
fn a_bad_metrics_address_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "[metrics]\naddress = \"not-an-address\"\n").unwrap();
    let (code, _, stderr) = common::scute(&["check", "--config", config.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(stderr.contains("metrics.address"), "{stderr}");
}
