//! A device plugin as vendors write them, speaking the kubelet's device plugin API (v1beta1,
//! proto/deviceplugin) on a socket in the kubelet's device-plugins directory: it registers one
//! resource, lists its devices as healthy, and answers Allocate with CDI device names only
//! (`<kind>=<device id>`), as DRA-era plugins do. The kubelet passes those names to the runtime
//! in CreateContainer's `CDI_devices`.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{Stream, StreamExt};
use tonic::{Request, Response, Status};

pub mod pb {
    tonic::include_proto!("v1beta1");
}

use pb::device_plugin_server::{DevicePlugin, DevicePluginServer};

pub struct FakePlugin {
    kind: String,
    devices: Vec<String>,
    /// Set once the kubelet opened ListAndWatch and was sent the device list.
    listed: Arc<AtomicBool>,
}

#[tonic::async_trait]
impl DevicePlugin for FakePlugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<pb::Empty>,
    ) -> Result<Response<pb::DevicePluginOptions>, Status> {
        Ok(Response::new(pb::DevicePluginOptions::default()))
    }

    type ListAndWatchStream = Pin<Box<dyn Stream<Item = Result<pb::ListAndWatchResponse, Status>> + Send>>;

    async fn list_and_watch(&self, _: Request<pb::Empty>) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let list = pb::ListAndWatchResponse {
            devices: self
                .devices
                .iter()
                .map(|id| pb::Device {
                    id: id.clone(),
                    health: "Healthy".into(),
                    topology: None,
                })
                .collect(),
        };
        let listed = self.listed.clone();
        // One list, then the stream stays open: a closed stream is a plugin gone.
        let stream = futures_util::stream::once(async move {
            listed.store(true, Ordering::SeqCst);
            Ok(list)
        })
        .chain(futures_util::stream::pending());
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        _: Request<pb::PreferredAllocationRequest>,
    ) -> Result<Response<pb::PreferredAllocationResponse>, Status> {
        Err(Status::unimplemented("no preferred allocation"))
    }

    async fn allocate(&self, request: Request<pb::AllocateRequest>) -> Result<Response<pb::AllocateResponse>, Status> {
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|c| pb::ContainerAllocateResponse {
                cdi_devices: c
                    .devices_ids
                    .iter()
                    .map(|id| pb::CdiDevice {
                        name: format!("{}={id}", self.kind),
                    })
                    .collect(),
                ..Default::default()
            })
            .collect();
        Ok(Response::new(pb::AllocateResponse { container_responses }))
    }

    async fn pre_start_container(
        &self,
        _: Request<pb::PreStartContainerRequest>,
    ) -> Result<Response<pb::PreStartContainerResponse>, Status> {
        Ok(Response::new(pb::PreStartContainerResponse {}))
    }
}

/// A registered plugin; serving stops and its socket goes on drop.
pub struct Registered {
    socket: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Serves a plugin for `resource` (devices `devices`, CDI kind `kind`) in `plugins_dir` and
/// registers it with the kubelet there; returns once the kubelet has listed its devices.
pub async fn register(plugins_dir: &Path, resource: &str, kind: &str, devices: &[&str]) -> Registered {
    let kubelet_sock = plugins_dir.join("kubelet.sock");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !kubelet_sock.exists() {
        assert!(Instant::now() < deadline, "{} never appeared", kubelet_sock.display());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let endpoint = format!("scute-test-{}.sock", std::process::id());
    let socket = plugins_dir.join(&endpoint);
    let _ = std::fs::remove_file(&socket);
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let listed = Arc::new(AtomicBool::new(false));
    let plugin = FakePlugin {
        kind: kind.to_string(),
        devices: devices.iter().map(|d| d.to_string()).collect(),
        listed: listed.clone(),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(DevicePluginServer::new(plugin))
            .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(listener), async {
                let _ = stopped.await;
            }),
    );
    let registered = Registered {
        socket,
        stop: Some(stop),
    };
    let mut registration = pb::registration_client::RegistrationClient::new(super::connect(&kubelet_sock).await);
    registration
        .register(pb::RegisterRequest {
            version: "v1beta1".into(),
            endpoint,
            resource_name: resource.into(),
            options: Some(pb::DevicePluginOptions::default()),
        })
        .await
        .expect("the kubelet registers the plugin");
    while !listed.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the kubelet never called ListAndWatch");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The kubelet records the list when the stream's message arrives, just after it was sent.
    tokio::time::sleep(Duration::from_secs(1)).await;
    registered
}
