//! Attach: checks the request and the container, then hands out a one-time URL on the streaming
//! server, where the client's connection joins the container's stdio (see `crate::streaming`).

use super::container_exec::token_error;
use super::{Cri, RpcError};
use crate::api::{AttachRequest, AttachResponse};
use crate::streaming::{self, Pending};

impl Cri {
    pub(super) async fn attach(&self, mut request: AttachRequest) -> Result<AttachResponse, RpcError> {
        tracing::Span::current().record("id", request.container_id.as_str());
        streaming::check_attach(&request).map_err(RpcError::InvalidArgument)?;
        request.container_id = self.containers.check_streamable(&request.container_id, false).await?;
        let url = self.streaming.url_for(Pending::Attach(request)).map_err(token_error)?;
        Ok(AttachResponse { url })
    }
}
