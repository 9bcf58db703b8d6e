//! Exec: checks the request and the container, then hands out a one-time URL on the streaming
//! server, where the client's SPDY or WebSocket connection runs the command (see
//! `crate::streaming`).

use super::{Cri, RpcError};
use crate::api::{ExecRequest, ExecResponse};
use crate::streaming::{self, Pending};

impl Cri {
    pub(super) async fn exec(&self, mut request: ExecRequest) -> Result<ExecResponse, RpcError> {
        tracing::Span::current().record("id", request.container_id.as_str());
        streaming::check_exec(&request).map_err(RpcError::InvalidArgument)?;
        super::check_cmd("Exec", &request.cmd)?;
        request.container_id = self.containers.check_streamable(&request.container_id, true).await?;
        let url = self.streaming.url_for(Pending::Exec(request)).map_err(token_error)?;
        Ok(ExecResponse { url })
    }
}

pub(super) fn token_error(e: streaming::TokenError) -> RpcError {
    match e {
        streaming::TokenError::Full => RpcError::ResourceExhausted(e.to_string()),
        streaming::TokenError::Random(_) => RpcError::Internal(e.to_string()),
    }
}
