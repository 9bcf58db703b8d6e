//! Routing table of CRI ImageService: every RPC goes through `instrument` to its handler.
//! RPCs not served yet answer Unimplemented, naming the piece of work that adds them.

use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

use super::{instrument, unimplemented, CriService};
use crate::api::{self, image_service_server::ImageService};

const IMAGES: &str = "image pulls, content store and snapshots";
const STATS: &str = "stats, events, metrics and streaming lists";

pub fn image_service_server(
    service: CriService,
) -> api::image_service_server::ImageServiceServer<CriService> {
    api::image_service_server::ImageServiceServer::new(service)
}

#[tonic::async_trait]
impl ImageService for CriService {
    async fn list_images(
        &self,
        _request: Request<api::ListImagesRequest>,
    ) -> Result<Response<api::ListImagesResponse>, Status> {
        instrument("ListImages", unimplemented("ListImages", IMAGES)).await
    }

    type StreamImagesStream = BoxStream<api::StreamImagesResponse>;

    async fn stream_images(
        &self,
        _request: Request<api::StreamImagesRequest>,
    ) -> Result<Response<Self::StreamImagesStream>, Status> {
        instrument("StreamImages", unimplemented("StreamImages", STATS)).await
    }

    async fn image_status(
        &self,
        _request: Request<api::ImageStatusRequest>,
    ) -> Result<Response<api::ImageStatusResponse>, Status> {
        instrument("ImageStatus", unimplemented("ImageStatus", IMAGES)).await
    }

    async fn pull_image(
        &self,
        _request: Request<api::PullImageRequest>,
    ) -> Result<Response<api::PullImageResponse>, Status> {
        instrument("PullImage", unimplemented("PullImage", IMAGES)).await
    }

    async fn remove_image(
        &self,
        _request: Request<api::RemoveImageRequest>,
    ) -> Result<Response<api::RemoveImageResponse>, Status> {
        instrument("RemoveImage", unimplemented("RemoveImage", IMAGES)).await
    }

    async fn image_fs_info(
        &self,
        _request: Request<api::ImageFsInfoRequest>,
    ) -> Result<Response<api::ImageFsInfoResponse>, Status> {
        instrument("ImageFsInfo", unimplemented("ImageFsInfo", IMAGES)).await
    }
}
