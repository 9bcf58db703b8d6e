//! ListImages and StreamImages (the same list, paged): every image, or the one the filter names,
//! once per runtime handler it was pulled for (KEP-4216), or for the handler the filter names.

use tonic::codegen::BoxStream;

use super::image_convert::to_cri_image;
use super::{Cri, RpcError};
use crate::api::{self, ListImagesRequest, ListImagesResponse, StreamImagesRequest, StreamImagesResponse};
use crate::image::ImageError;

impl Cri {
    pub(super) async fn list_images(&self, request: ListImagesRequest) -> Result<ListImagesResponse, RpcError> {
        let images = self.images_listed("ListImages", request.filter)?;
        Ok(ListImagesResponse { images })
    }

    pub(super) async fn stream_images(
        &self,
        request: StreamImagesRequest,
    ) -> Result<BoxStream<StreamImagesResponse>, RpcError> {
        let images = self.images_listed("StreamImages", request.filter)?;
        Ok(self.paged(images, |images| StreamImagesResponse { images }))
    }

    /// Every image, or the one `filter` names (none when it names no image).
    fn images_listed(&self, rpc: &str, filter: Option<api::ImageFilter>) -> Result<Vec<api::Image>, RpcError> {
        let spec = filter.and_then(|f| f.image).unwrap_or_default();
        let handler = (!spec.runtime_handler.is_empty()).then_some(spec.runtime_handler);
        if let Some(handler) = &handler {
            self.check_runtime_handler(rpc, handler)?;
        }
        let wanted = Some(spec.image).filter(|i| !i.is_empty());
        let records = match wanted {
            Some(reference) => match self.images.resolve(&reference) {
                Ok(record) => vec![record],
                Err(ImageError::NotFound(_) | ImageError::InvalidReference(_)) => vec![],
                Err(e) => return Err(e.into()),
            },
            None => self.images.list()?,
        };
        Ok(records
            .iter()
            .flat_map(|r| {
                r.handlers()
                    .into_iter()
                    .filter(|h| handler.as_ref().is_none_or(|wanted| wanted == h))
                    .map(|h| to_cri_image(&self.images, r, &h))
            })
            .collect())
    }
}
