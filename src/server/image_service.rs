//! Routing table of CRI ImageService: every RPC goes through `instrument` to its handler.

use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

use super::{grpc_timeout, instrument, CriService};
use crate::api::{self, image_service_server::ImageService};

pub fn image_service_server(service: CriService) -> api::image_service_server::ImageServiceServer<CriService> {
    api::image_service_server::ImageServiceServer::new(service)
}

#[tonic::async_trait]
impl ImageService for CriService {
    async fn list_images(
        &self,
        request: Request<api::ListImagesRequest>,
    ) -> Result<Response<api::ListImagesResponse>, Status> {
        instrument("ListImages", self.cri.list_images(request.into_inner())).await
    }

    type StreamImagesStream = BoxStream<api::StreamImagesResponse>;

    async fn stream_images(
        &self,
        request: Request<api::StreamImagesRequest>,
    ) -> Result<Response<Self::StreamImagesStream>, Status> {
        instrument("StreamImages", self.cri.stream_images(request.into_inner())).await
    }

    async fn image_status(
        &self,
        request: Request<api::ImageStatusRequest>,
    ) -> Result<Response<api::ImageStatusResponse>, Status> {
        instrument("ImageStatus", self.cri.image_status(request.into_inner())).await
    }

    async fn pull_image(
        &self,
        request: Request<api::PullImageRequest>,
    ) -> Result<Response<api::PullImageResponse>, Status> {
        let deadline = grpc_timeout(request.metadata());
        instrument("PullImage", self.cri.pull_image(request.into_inner(), deadline)).await
    }

    async fn remove_image(
        &self,
        request: Request<api::RemoveImageRequest>,
    ) -> Result<Response<api::RemoveImageResponse>, Status> {
        instrument("RemoveImage", self.cri.remove_image(request.into_inner())).await
    }

    async fn image_fs_info(
        &self,
        request: Request<api::ImageFsInfoRequest>,
    ) -> Result<Response<api::ImageFsInfoResponse>, Status> {
        instrument("ImageFsInfo", self.cri.image_fs_info(request.into_inner())).await
    }
}
