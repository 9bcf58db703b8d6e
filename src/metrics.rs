//! Prometheus metrics: RPC counts and latencies per method and code (recorded by the server's
//! `instrument`), image pulls (in flight, bytes, durations), and at scrape time the running pod
//! sandboxes and containers, each pull in flight's progress, and the shims' count and memory. Served as Prometheus text on
//! `http://<metrics.address>/metrics` when an address is configured (off by default).
//!
//! The registry is process-wide, like every Prometheus client's: the code that counts (the RPC
//! wrapper, the pull pipeline) has no handle to the daemon's state, and metrics must not become a
//! reason to thread one through.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// What the daemon counts at scrape time (the metrics module knows no manager: it sits below
/// them, and the image pull pipeline counts into it).
#[derive(Debug, Clone, Default)]
pub struct Live {
    pub sandboxes_ready: usize,
    pub containers_running: usize,
    pub pulls: Vec<PullProgress>,
}

/// One pull in flight, as exported (labelled by image and phase).
#[derive(Debug, Clone, Default)]
pub struct PullProgress {
    pub image: String,
    pub phase: &'static str,
    pub bytes_done: u64,
    pub bytes_total: u64,
    pub layers_done: u32,
    pub layers_total: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PullLabels {
    image: String,
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcLabels {
    method: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    method: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

pub struct Metrics {
    registry: Registry,
    rpc_requests: Family<RpcLabels, Counter>,
    rpc_duration: Family<MethodLabels, Histogram>,
    pulls_in_flight: Gauge,
    pull_bytes: Counter,
    pull_duration: Family<OutcomeLabels, Histogram>,
    pull_progress: [Family<PullLabels, Gauge>; 4],
    sandboxes_ready: Gauge,
    containers_running: Gauge,
    shims: Gauge,
    shim_rss: Gauge,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The process-wide metrics.
pub fn global() -> &'static Metrics {
    &METRICS
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("scute");
        let rpc_requests = Family::<RpcLabels, Counter>::default();
        registry.register(
            "cri_requests",
            "CRI RPCs served, by method and gRPC code",
            rpc_requests.clone(),
        );
        // 100 µs to ~13 min: a Version call and a slow pull fit the same buckets.
        let rpc_duration = Family::<MethodLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0001, 4.0, 12))
        });
        registry.register(
            "cri_request_duration_seconds",
            "Time to answer CRI RPCs, by method",
            rpc_duration.clone(),
        );
        let pulls_in_flight = Gauge::default();
        registry.register(
            "image_pulls_in_flight",
            "Image pulls running now",
            pulls_in_flight.clone(),
        );
        let pull_bytes = Counter::default();
        registry.register(
            "image_pull_bytes",
            "Bytes of image layers downloaded from registries",
            pull_bytes.clone(),
        );
        let pull_duration = Family::<OutcomeLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.01, 2.0, 16))
        });
        registry.register(
            "image_pull_duration_seconds",
            "Time an image pull took, by outcome (success, failure)",
            pull_duration.clone(),
        );
        // Per pull in flight, set at each scrape (a finished pull's series go).
        let pull_progress: [Family<PullLabels, Gauge>; 4] = Default::default();
        for (family, (name, help)) in pull_progress.iter().zip([
            ("image_pull_progress_bytes", "Layer bytes done of a pull in flight"),
            (
                "image_pull_size_bytes",
                "Layer bytes of a pull in flight in all (0 while resolving)",
            ),
            ("image_pull_progress_layers", "Layers done of a pull in flight"),
            ("image_pull_layers", "Layers of a pull in flight in all"),
        ]) {
            registry.register(name, help, family.clone());
        }
        let sandboxes_ready = Gauge::default();
        registry.register(
            "pod_sandboxes_ready",
            "Pod sandboxes in state READY",
            sandboxes_ready.clone(),
        );
        let containers_running = Gauge::default();
        registry.register(
            "containers_running",
            "Containers in state RUNNING",
            containers_running.clone(),
        );
        let shims = Gauge::default();
        registry.register(
            "shims",
            "scute-shim processes alive (one per pod until its stop)",
            shims.clone(),
        );
        let shim_rss = Gauge::default();
        registry.register(
            "shim_resident_memory_bytes",
            "Resident memory of all scute-shim processes together",
            shim_rss.clone(),
        );
        Metrics {
            registry,
            rpc_requests,
            rpc_duration,
            pulls_in_flight,
            pull_bytes,
            pull_duration,
            pull_progress,
            sandboxes_ready,
            containers_running,
            shims,
            shim_rss,
        }
    }

    /// One answered RPC.
    pub fn rpc(&self, method: &str, code: tonic::Code, took: Duration) {
        self.rpc_requests
            .get_or_create(&RpcLabels {
                method: method.to_string(),
                code: format!("{code:?}"),
            })
            .inc();
        self.rpc_duration
            .get_or_create(&MethodLabels {
                method: method.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    pub fn pull_bytes(&self, n: u64) {
        self.pull_bytes.inc_by(n);
    }

    /// Counts a pull as in flight until the guard is finished or dropped (a failure).
    pub fn pull_started(&'static self) -> PullGuard {
        self.pulls_in_flight.inc();
        PullGuard {
            metrics: self,
            started: std::time::Instant::now(),
            succeeded: false,
        }
    }

    /// The registry as Prometheus text, with the scrape-time gauges refreshed first.
    fn render(&self, live: Live) -> String {
        self.sandboxes_ready.set(live.sandboxes_ready as i64);
        self.containers_running.set(live.containers_running as i64);
        for family in &self.pull_progress {
            family.clear();
        }
        for pull in &live.pulls {
            let labels = PullLabels {
                image: pull.image.clone(),
                phase: pull.phase.to_string(),
            };
            let values = [
                pull.bytes_done,
                pull.bytes_total,
                pull.layers_done.into(),
                pull.layers_total.into(),
            ];
            for (family, value) in self.pull_progress.iter().zip(values) {
                family
                    .get_or_create(&labels)
                    .set(i64::try_from(value).unwrap_or(i64::MAX));
            }
        }
        let (count, rss) = shim_memory();
        self.shims.set(count);
        self.shim_rss.set(rss);
        let mut text = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            tracing::warn!(error = %e, "encoding metrics");
        }
        text
    }
}

/// A pull in flight; `finish(true)` on success.
pub struct PullGuard {
    metrics: &'static Metrics,
    started: std::time::Instant,
    succeeded: bool,
}

impl PullGuard {
    pub fn succeeded(mut self) {
        self.succeeded = true;
    }
}

impl Drop for PullGuard {
    fn drop(&mut self) {
        self.metrics.pulls_in_flight.dec();
        let outcome = if self.succeeded { "success" } else { "failure" };
        self.metrics
            .pull_duration
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_string(),
            })
            .observe(self.started.elapsed().as_secs_f64());
    }
}

/// Count and summed VmRSS of the scute-shim processes (by their comm name).
fn shim_memory() -> (i64, i64) {
    let (mut count, mut rss_kib) = (0i64, 0i64);
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return (0, 0);
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        if status.lines().next() != Some("Name:\tscute-shim") {
            continue;
        }
        count += 1;
        rss_kib += status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
            .unwrap_or(0);
    }
    (count, rss_kib * 1024)
}

/// Serves `/metrics` on `address` until `shutdown` turns true; `live` counts the daemon's pods
/// and containers at each scrape.
pub async fn serve(
    address: &str,
    live: impl Fn() -> Live + Send + Sync + 'static,
    mut shutdown: watch::Receiver<bool>,
) -> Result<std::net::SocketAddr> {
    let live = Arc::new(live);
    let listener = TcpListener::bind(address)
        .await
        .with_context(|| format!("binding the metrics server to {address}"))?;
    let local = listener.local_addr()?;
    tracing::info!(url = %format!("http://{local}/metrics"), "serving Prometheus metrics");
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = async { let _ = shutdown.wait_for(|stop| *stop).await; } => return,
            };
            let Ok((stream, _)) = accepted else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let live = live.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                    let live = live.clone();
                    async move {
                        let response = if request.method() != Method::GET || request.uri().path() != "/metrics" {
                            let mut r = Response::new(Full::new(Bytes::from_static(b"see /metrics\n")));
                            *r.status_mut() = StatusCode::NOT_FOUND;
                            r
                        } else {
                            let text = global().render(live());
                            let mut r = Response::new(Full::new(Bytes::from(text)));
                            r.headers_mut().insert(
                                header::CONTENT_TYPE,
                                header::HeaderValue::from_static(
                                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                                ),
                            );
                            r
                        };
                        Ok::<_, std::convert::Infallible>(response)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(local)
}
