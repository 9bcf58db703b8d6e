//! ImageFsInfo: bytes and inodes used by images (content store + layer snapshots). Container
//! writable layers live on the same filesystem, so it is reported for both, as containerd does
//! when the image and container filesystems are not split.

use super::{Cri, RpcError};
use crate::api::{FilesystemIdentifier, FilesystemUsage, ImageFsInfoRequest, ImageFsInfoResponse, UInt64Value};

impl Cri {
    pub(super) async fn image_fs_info(&self, _request: ImageFsInfoRequest) -> Result<ImageFsInfoResponse, RpcError> {
        let images = self.images.clone();
        let (bytes, inodes) = tokio::task::spawn_blocking(move || images.usage()).await?;
        let usage = FilesystemUsage {
            timestamp: scute_sys::clock::now_nanos(),
            fs_id: Some(FilesystemIdentifier {
                mountpoint: self.images.snapshots_root().display().to_string(),
            }),
            used_bytes: Some(UInt64Value { value: bytes }),
            inodes_used: Some(UInt64Value { value: inodes }),
        };
        Ok(ImageFsInfoResponse {
            image_filesystems: vec![usage.clone()],
            container_filesystems: vec![usage],
        })
    }
}
