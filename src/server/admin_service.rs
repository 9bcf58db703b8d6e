//! Routing table of scute's Admin service (operator tools, not CRI), served on the main socket.

use tonic::{Request, Response, Status};

use super::{instrument, CriService};
use crate::admin_api::{self, admin_server::Admin};

pub fn admin_server(service: CriService) -> admin_api::admin_server::AdminServer<CriService> {
    admin_api::admin_server::AdminServer::new(service)
}

#[tonic::async_trait]
impl Admin for CriService {
    async fn list_pulls(
        &self,
        request: Request<admin_api::ListPullsRequest>,
    ) -> Result<Response<admin_api::ListPullsResponse>, Status> {
        instrument("ListPulls", self.cri.list_pulls(request.into_inner())).await
    }

    async fn doctor(
        &self,
        request: Request<admin_api::DoctorRequest>,
    ) -> Result<Response<admin_api::DoctorResponse>, Status> {
        instrument("Doctor", self.cri.doctor(request.into_inner())).await
    }
}
