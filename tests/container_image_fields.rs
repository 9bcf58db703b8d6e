//! What each image field of ContainerStatus and ListContainers holds (issue 22): the kubelet
//! copies `image.image` verbatim into the pod's `containerStatuses[].image`, so it must be the
//! name the user wrote, while `image_ref` / `image_id` keep the ID the kubelet compares.

mod common;

use common::pod::{container, pod, BUSYBOX};
use scute::api;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_image_fields_name_the_image_and_keep_its_id() {
    let pod = pod("image-fields").await;
    let image_id = pod.image_status(BUSYBOX).await.id;
    assert!(image_id.starts_with("sha256:"), "{image_id}");

    // (name in `image`, name in `user_specified_image`) → the name ContainerStatus reports.
    let cases = [
        // The kubelet's form: the ID in `image`, the manifest's name in `user_specified_image`.
        ("kubelet-form", image_id.clone(), BUSYBOX.to_string(), BUSYBOX),
        // crictl's form: the name only.
        ("by-name", BUSYBOX.to_string(), String::new(), BUSYBOX),
        // Created by ID with no name: the image's repo tag, as containerd reports.
        ("by-id", image_id.clone(), String::new(), BUSYBOX),
    ];
    let mut runtime = pod.daemon.runtime().await;
    for (name, image, user_specified, want) in &cases {
        let mut c = container(name, "sleep 60");
        c.image = Some(api::ImageSpec {
            image: image.clone(),
            user_specified_image: user_specified.clone(),
            ..Default::default()
        });
        let id = pod.run(c).await;
        let status = pod.status(&id).await;
        let spec = status.image.clone().unwrap();
        assert_eq!(spec.image, *want, "{name}: ContainerStatus.image.image");
        assert_eq!(
            spec.user_specified_image, *user_specified,
            "{name}: user_specified_image as sent"
        );
        assert_eq!(status.image_ref, image_id, "{name}: image_ref");
        assert_eq!(status.image_id, image_id, "{name}: image_id");

        let listed = runtime
            .list_containers(api::ListContainersRequest {
                filter: Some(api::ContainerFilter {
                    id: id.clone(),
                    ..Default::default()
                }),
            })
            .await
            .unwrap()
            .into_inner()
            .containers;
        assert_eq!(listed.len(), 1);
        assert_eq!(
            listed[0].image.as_ref().unwrap().image,
            *want,
            "{name}: ListContainers image"
        );
        assert_eq!(
            (listed[0].image_ref.as_str(), listed[0].image_id.as_str()),
            (image_id.as_str(), image_id.as_str())
        );
    }
    pod.remove_all().await;
}
