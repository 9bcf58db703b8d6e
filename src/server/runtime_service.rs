//! Routing table of CRI RuntimeService: every RPC goes through `instrument` to its handler.

use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

use super::{instrument, CriService};
use crate::api::{self, runtime_service_server::RuntimeService};

pub fn runtime_service_server(service: CriService) -> api::runtime_service_server::RuntimeServiceServer<CriService> {
    api::runtime_service_server::RuntimeServiceServer::new(service)
}

#[tonic::async_trait]
impl RuntimeService for CriService {
    async fn version(&self, request: Request<api::VersionRequest>) -> Result<Response<api::VersionResponse>, Status> {
        instrument("Version", self.cri.version(request.into_inner())).await
    }

    async fn run_pod_sandbox(
        &self,
        request: Request<api::RunPodSandboxRequest>,
    ) -> Result<Response<api::RunPodSandboxResponse>, Status> {
        instrument("RunPodSandbox", self.cri.run_pod_sandbox(request.into_inner())).await
    }

    async fn stop_pod_sandbox(
        &self,
        request: Request<api::StopPodSandboxRequest>,
    ) -> Result<Response<api::StopPodSandboxResponse>, Status> {
        instrument("StopPodSandbox", self.cri.stop_pod_sandbox(request.into_inner())).await
    }

    async fn remove_pod_sandbox(
        &self,
        request: Request<api::RemovePodSandboxRequest>,
    ) -> Result<Response<api::RemovePodSandboxResponse>, Status> {
        instrument("RemovePodSandbox", self.cri.remove_pod_sandbox(request.into_inner())).await
    }

    async fn pod_sandbox_status(
        &self,
        request: Request<api::PodSandboxStatusRequest>,
    ) -> Result<Response<api::PodSandboxStatusResponse>, Status> {
        instrument("PodSandboxStatus", self.cri.pod_sandbox_status(request.into_inner())).await
    }

    async fn list_pod_sandbox(
        &self,
        request: Request<api::ListPodSandboxRequest>,
    ) -> Result<Response<api::ListPodSandboxResponse>, Status> {
        instrument("ListPodSandbox", self.cri.list_pod_sandbox(request.into_inner())).await
    }

    type StreamPodSandboxesStream = BoxStream<api::StreamPodSandboxesResponse>;

    async fn stream_pod_sandboxes(
        &self,
        request: Request<api::StreamPodSandboxesRequest>,
    ) -> Result<Response<Self::StreamPodSandboxesStream>, Status> {
        instrument(
            "StreamPodSandboxes",
            self.cri.stream_pod_sandboxes(request.into_inner()),
        )
        .await
    }

    async fn create_container(
        &self,
        request: Request<api::CreateContainerRequest>,
    ) -> Result<Response<api::CreateContainerResponse>, Status> {
        instrument("CreateContainer", self.cri.create_container(request.into_inner())).await
    }

    async fn start_container(
        &self,
        request: Request<api::StartContainerRequest>,
    ) -> Result<Response<api::StartContainerResponse>, Status> {
        instrument("StartContainer", self.cri.start_container(request.into_inner())).await
    }

    async fn stop_container(
        &self,
        request: Request<api::StopContainerRequest>,
    ) -> Result<Response<api::StopContainerResponse>, Status> {
        instrument("StopContainer", self.cri.stop_container(request.into_inner())).await
    }

    async fn remove_container(
        &self,
        request: Request<api::RemoveContainerRequest>,
    ) -> Result<Response<api::RemoveContainerResponse>, Status> {
        instrument("RemoveContainer", self.cri.remove_container(request.into_inner())).await
    }

    async fn list_containers(
        &self,
        request: Request<api::ListContainersRequest>,
    ) -> Result<Response<api::ListContainersResponse>, Status> {
        instrument("ListContainers", self.cri.list_containers(request.into_inner())).await
    }

    type StreamContainersStream = BoxStream<api::StreamContainersResponse>;

    async fn stream_containers(
        &self,
        request: Request<api::StreamContainersRequest>,
    ) -> Result<Response<Self::StreamContainersStream>, Status> {
        instrument("StreamContainers", self.cri.stream_containers(request.into_inner())).await
    }

    async fn container_status(
        &self,
        request: Request<api::ContainerStatusRequest>,
    ) -> Result<Response<api::ContainerStatusResponse>, Status> {
        instrument("ContainerStatus", self.cri.container_status(request.into_inner())).await
    }

    async fn update_container_resources(
        &self,
        request: Request<api::UpdateContainerResourcesRequest>,
    ) -> Result<Response<api::UpdateContainerResourcesResponse>, Status> {
        instrument(
            "UpdateContainerResources",
            self.cri.update_container_resources(request.into_inner()),
        )
        .await
    }

    async fn reopen_container_log(
        &self,
        request: Request<api::ReopenContainerLogRequest>,
    ) -> Result<Response<api::ReopenContainerLogResponse>, Status> {
        instrument(
            "ReopenContainerLog",
            self.cri.reopen_container_log(request.into_inner()),
        )
        .await
    }

    async fn exec_sync(
        &self,
        request: Request<api::ExecSyncRequest>,
    ) -> Result<Response<api::ExecSyncResponse>, Status> {
        instrument("ExecSync", self.cri.exec_sync(request.into_inner())).await
    }

    async fn exec(&self, request: Request<api::ExecRequest>) -> Result<Response<api::ExecResponse>, Status> {
        instrument("Exec", self.cri.exec(request.into_inner())).await
    }

    async fn attach(&self, request: Request<api::AttachRequest>) -> Result<Response<api::AttachResponse>, Status> {
        instrument("Attach", self.cri.attach(request.into_inner())).await
    }

    async fn port_forward(
        &self,
        request: Request<api::PortForwardRequest>,
    ) -> Result<Response<api::PortForwardResponse>, Status> {
        instrument("PortForward", self.cri.port_forward(request.into_inner())).await
    }

    async fn container_stats(
        &self,
        request: Request<api::ContainerStatsRequest>,
    ) -> Result<Response<api::ContainerStatsResponse>, Status> {
        instrument("ContainerStats", self.cri.container_stats(request.into_inner())).await
    }

    async fn list_container_stats(
        &self,
        request: Request<api::ListContainerStatsRequest>,
    ) -> Result<Response<api::ListContainerStatsResponse>, Status> {
        instrument(
            "ListContainerStats",
            self.cri.list_container_stats(request.into_inner()),
        )
        .await
    }

    type StreamContainerStatsStream = BoxStream<api::StreamContainerStatsResponse>;

    async fn stream_container_stats(
        &self,
        request: Request<api::StreamContainerStatsRequest>,
    ) -> Result<Response<Self::StreamContainerStatsStream>, Status> {
        instrument(
            "StreamContainerStats",
            self.cri.stream_container_stats(request.into_inner()),
        )
        .await
    }

    async fn pod_sandbox_stats(
        &self,
        request: Request<api::PodSandboxStatsRequest>,
    ) -> Result<Response<api::PodSandboxStatsResponse>, Status> {
        instrument("PodSandboxStats", self.cri.pod_sandbox_stats(request.into_inner())).await
    }

    async fn list_pod_sandbox_stats(
        &self,
        request: Request<api::ListPodSandboxStatsRequest>,
    ) -> Result<Response<api::ListPodSandboxStatsResponse>, Status> {
        instrument(
            "ListPodSandboxStats",
            self.cri.list_pod_sandbox_stats(request.into_inner()),
        )
        .await
    }

    type StreamPodSandboxStatsStream = BoxStream<api::StreamPodSandboxStatsResponse>;

    async fn stream_pod_sandbox_stats(
        &self,
        request: Request<api::StreamPodSandboxStatsRequest>,
    ) -> Result<Response<Self::StreamPodSandboxStatsStream>, Status> {
        instrument(
            "StreamPodSandboxStats",
            self.cri.stream_pod_sandbox_stats(request.into_inner()),
        )
        .await
    }

    async fn update_runtime_config(
        &self,
        request: Request<api::UpdateRuntimeConfigRequest>,
    ) -> Result<Response<api::UpdateRuntimeConfigResponse>, Status> {
        instrument(
            "UpdateRuntimeConfig",
            self.cri.update_runtime_config(request.into_inner()),
        )
        .await
    }

    async fn status(&self, request: Request<api::StatusRequest>) -> Result<Response<api::StatusResponse>, Status> {
        instrument("Status", self.cri.status(request.into_inner())).await
    }

    async fn checkpoint_container(
        &self,
        request: Request<api::CheckpointContainerRequest>,
    ) -> Result<Response<api::CheckpointContainerResponse>, Status> {
        instrument(
            "CheckpointContainer",
            self.cri.checkpoint_container(request.into_inner()),
        )
        .await
    }

    type GetContainerEventsStream = BoxStream<api::ContainerEventResponse>;

    async fn get_container_events(
        &self,
        request: Request<api::GetEventsRequest>,
    ) -> Result<Response<Self::GetContainerEventsStream>, Status> {
        instrument("GetContainerEvents", self.cri.container_events(request.into_inner())).await
    }

    async fn list_metric_descriptors(
        &self,
        request: Request<api::ListMetricDescriptorsRequest>,
    ) -> Result<Response<api::ListMetricDescriptorsResponse>, Status> {
        instrument(
            "ListMetricDescriptors",
            self.cri.list_metric_descriptors(request.into_inner()),
        )
        .await
    }

    async fn list_pod_sandbox_metrics(
        &self,
        request: Request<api::ListPodSandboxMetricsRequest>,
    ) -> Result<Response<api::ListPodSandboxMetricsResponse>, Status> {
        instrument(
            "ListPodSandboxMetrics",
            self.cri.list_pod_sandbox_metrics(request.into_inner()),
        )
        .await
    }

    type StreamPodSandboxMetricsStream = BoxStream<api::StreamPodSandboxMetricsResponse>;

    async fn stream_pod_sandbox_metrics(
        &self,
        request: Request<api::StreamPodSandboxMetricsRequest>,
    ) -> Result<Response<Self::StreamPodSandboxMetricsStream>, Status> {
        instrument(
            "StreamPodSandboxMetrics",
            self.cri.stream_pod_sandbox_metrics(request.into_inner()),
        )
        .await
    }

    async fn runtime_config(
        &self,
        request: Request<api::RuntimeConfigRequest>,
    ) -> Result<Response<api::RuntimeConfigResponse>, Status> {
        instrument("RuntimeConfig", self.cri.runtime_config(request.into_inner())).await
    }

    async fn update_pod_sandbox_resources(
        &self,
        request: Request<api::UpdatePodSandboxResourcesRequest>,
    ) -> Result<Response<api::UpdatePodSandboxResourcesResponse>, Status> {
        instrument(
            "UpdatePodSandboxResources",
            self.cri.update_pod_sandbox_resources(request.into_inner()),
        )
        .await
    }
}
