//! RuntimeClass-scoped images (KEP-4216) as the kubelet sees them: the ImageSpec's
//! runtime_handler in PullImage, ImageStatus, ListImages and RemoveImage. scute has one
//! snapshotter, so the content is shared; each image lists once per handler it was pulled (or
//! found by ImageStatus) for, a handler's RemoveImage drops that handler's claim, and an unknown
//! handler is InvalidArgument everywhere.

mod common;

use common::pod::BUSYBOX;
use common::{Daemon, Registry};
use scute::api;
use tonic::Code;

const HANDLERS: &str = "[runtime.handlers.kata]\ndefault_seccomp = \"unconfined\"\n";

fn spec(image: &str, handler: &str) -> Option<api::ImageSpec> {
    Some(api::ImageSpec {
        image: image.into(),
        runtime_handler: handler.into(),
        ..Default::default()
    })
}

async fn pull(daemon: &Daemon, handler: &str) -> Result<String, tonic::Status> {
    daemon
        .images()
        .await
        .pull_image(api::PullImageRequest {
            image: spec(BUSYBOX, handler),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner().image_ref)
}

/// The runtime handlers ListImages shows image `id` under (filtered by `handler` when given).
async fn listed_handlers(daemon: &Daemon, id: &str, handler: &str) -> Vec<String> {
    let filter = (!handler.is_empty()).then(|| api::ImageFilter {
        image: spec("", handler),
    });
    let mut handlers: Vec<String> = daemon
        .images()
        .await
        .list_images(api::ListImagesRequest { filter })
        .await
        .unwrap()
        .into_inner()
        .images
        .into_iter()
        .filter(|i| i.id == id)
        .map(|i| i.spec.unwrap().runtime_handler)
        .collect();
    handlers.sort();
    handlers
}

async fn remove(daemon: &Daemon, id: &str, handler: &str) -> Result<(), tonic::Status> {
    daemon
        .images()
        .await
        .remove_image(api::RemoveImageRequest {
            image: spec(id, handler),
        })
        .await
        .map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_are_scoped_by_runtime_handler() {
    let registry = Registry::with_test_images();
    let daemon = Daemon::start(HANDLERS);
    daemon.mirror_public_registries_to(&registry.addr);

    // An unknown handler is refused by every image RPC, naming it.
    let err = pull(&daemon, "gvisor").await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("gvisor"), "{}", err.message());
    let err = remove(&daemon, BUSYBOX, "gvisor").await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    let err = daemon
        .images()
        .await
        .image_status(api::ImageStatusRequest {
            image: spec(BUSYBOX, "gvisor"),
            verbose: false,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    let err = daemon
        .images()
        .await
        .list_images(api::ListImagesRequest {
            filter: Some(api::ImageFilter {
                image: spec("", "gvisor"),
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");

    // Pulled for kata: listed for kata only; pulled again for the default handler: both.
    let id = pull(&daemon, "kata").await.unwrap();
    assert_eq!(listed_handlers(&daemon, &id, "").await, ["kata"]);
    assert_eq!(pull(&daemon, "").await.unwrap(), id);
    assert_eq!(listed_handlers(&daemon, &id, "").await, ["", "kata"]);
    assert_eq!(listed_handlers(&daemon, &id, "kata").await, ["kata"]);
    let status = daemon
        .images()
        .await
        .image_status(api::ImageStatusRequest {
            image: spec(BUSYBOX, "kata"),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .image
        .unwrap();
    assert_eq!(status.id, id);
    assert_eq!(status.spec.unwrap().runtime_handler, "kata");

    // A handler's RemoveImage drops its claim; the other handler still has the image.
    remove(&daemon, &id, "kata").await.unwrap();
    assert_eq!(listed_handlers(&daemon, &id, "").await, [""]);
    pull(&daemon, "kata").await.unwrap();
    remove(&daemon, &id, "").await.unwrap();
    assert_eq!(listed_handlers(&daemon, &id, "").await, ["kata"]);
    // RemoveImage for a handler that holds no claim (crictl rmi of an image only kata pulled)
    // removes the image.
    remove(&daemon, &id, "").await.unwrap();
    assert!(listed_handlers(&daemon, &id, "").await.is_empty());

    // ImageStatus finding the image for a handler records that handler's claim: the kubelet
    // will not pull it for that handler, and its image GC must see it under that handler.
    pull(&daemon, "").await.unwrap();
    daemon
        .images()
        .await
        .image_status(api::ImageStatusRequest {
            image: spec(BUSYBOX, "kata"),
            verbose: false,
        })
        .await
        .unwrap();
    assert_eq!(listed_handlers(&daemon, &id, "").await, ["", "kata"]);

    // The claims survive a restart.
    let mut daemon = daemon;
    daemon.restart();
    assert_eq!(listed_handlers(&daemon, &id, "").await, ["", "kata"]);
}
