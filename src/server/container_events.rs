//! GetContainerEvents: a stream of every container event from the moment of the call, for as
//! many subscribers as call it (the kubelet's Evented PLEG, `crictl events`).

use futures_util::StreamExt as _;
use tonic::codegen::BoxStream;

use super::{Cri, RpcError};
use crate::api;
use crate::events::Ended;

impl Cri {
    pub(super) async fn container_events(
        &self,
        _request: api::GetEventsRequest,
    ) -> Result<BoxStream<api::ContainerEventResponse>, RpcError> {
        let subscription = self.events.subscribe();
        let stream = futures_util::stream::unfold(Some(subscription), |subscription| async move {
            let mut subscription = subscription?;
            match subscription.next().await {
                Ok(event) => Some((Ok(event), Some(subscription))),
                // Fallen too far behind: the stream ends with an error instead of going on with a
                // gap, so the subscriber relists and subscribes again.
                Err(Ended::Lagged(missed)) => {
                    tracing::warn!(missed, "an event subscriber fell behind: ending its stream");
                    let err = RpcError::ResourceExhausted(format!(
                        "GetContainerEvents: this subscriber fell {missed} events behind; subscribe again"
                    ));
                    Some((Err(err.into()), None))
                }
                Err(Ended::Closed) => None,
            }
        });
        Ok(stream.boxed())
    }
}
