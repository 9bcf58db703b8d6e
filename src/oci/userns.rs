//! A pod's user namespace (NamespaceOption.userns_options): which modes scute runs, and the
//! checks the kubelet and critest expect before anything is made.
//!
//! POD mode gives the pod one user namespace, made by its pause process from the kubelet's
//! mappings; every container of the pod joins it. NODE mode (or no options) is the host's.

use crate::api::{self, NamespaceMode};

/// One contiguous id range: container ids `container_id..container_id+length` are host ids
/// `host_id..host_id+length`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    pub container_id: u32,
    pub host_id: u32,
    pub length: u32,
}

impl IdRange {
    /// The host id of a container id, when the range maps it.
    pub fn to_host(&self, container_id: u32) -> Option<u32> {
        let offset = container_id.checked_sub(self.container_id)?;
        (offset < self.length).then(|| self.host_id + offset)
    }
}

/// The mappings of a pod with its own user namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodUserNs {
    pub uids: IdRange,
    pub gids: IdRange,
}

/// The pod's user namespace, or None for the host's. Errors are the request's fault.
pub fn pod_user_namespace(options: &api::NamespaceOption) -> Result<Option<PodUserNs>, String> {
    let Some(userns) = &options.userns_options else {
        return Ok(None);
    };
    match NamespaceMode::try_from(userns.mode) {
        Ok(NamespaceMode::Node) => {
            if !userns.uids.is_empty() || !userns.gids.is_empty() {
                return Err("user namespace mode NODE takes no uid or gid mappings".into());
            }
            Ok(None)
        }
        Ok(NamespaceMode::Pod) => {
            let uids = single_range("uid", &userns.uids)?;
            let gids = single_range("gid", &userns.gids)?;
            // The kubelet never asks for these together; a pod user namespace could not own the
            // host's network, PID or IPC namespace anyway.
            for (mode, what) in [
                (options.network(), "network"),
                (options.pid(), "PID"),
                (options.ipc(), "IPC"),
            ] {
                if mode == NamespaceMode::Node {
                    return Err(format!(
                        "a pod with its own user namespace cannot use the host {what} namespace"
                    ));
                }
            }
            Ok(Some(PodUserNs { uids, gids }))
        }
        Ok(mode) => Err(format!(
            "user namespace mode {} is not supported: use POD or NODE",
            mode.as_str_name()
        )),
        Err(_) => Err(format!("user namespace mode {} is not a NamespaceMode", userns.mode)),
    }
}

/// Exactly one range that maps container id 0, as containerd and CRI-O require (and critest
/// checks): a pod's root must exist, and several ranges would need newuidmap.
fn single_range(kind: &str, mappings: &[api::IdMapping]) -> Result<IdRange, String> {
    let [m] = mappings else {
        return Err(format!(
            "a pod user namespace needs exactly one {kind} mapping, got {}",
            mappings.len()
        ));
    };
    if m.container_id != 0 {
        return Err(format!(
            "the {kind} mapping must map container id 0 (it starts at {})",
            m.container_id
        ));
    }
    if m.length == 0 {
        return Err(format!("the {kind} mapping has length 0"));
    }
    if m.host_id.checked_add(m.length - 1).is_none() {
        return Err(format!(
            "the {kind} mapping {}+{} overflows the id space",
            m.host_id, m.length
        ));
    }
    Ok(IdRange {
        container_id: m.container_id,
        host_id: m.host_id,
        length: m.length,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(container_id: u32, host_id: u32, length: u32) -> api::IdMapping {
        api::IdMapping {
            container_id,
            host_id,
            length,
        }
    }

    fn options(mode: NamespaceMode, uids: Vec<api::IdMapping>) -> api::NamespaceOption {
        api::NamespaceOption {
            userns_options: Some(api::UserNamespace {
                mode: mode as i32,
                gids: uids.clone(),
                uids,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn pod_mode_takes_one_range_from_root() {
        let got = pod_user_namespace(&options(NamespaceMode::Pod, vec![mapping(0, 1000, 100000)]))
            .unwrap()
            .unwrap();
        assert_eq!(got.uids.to_host(0), Some(1000));
        assert_eq!(got.uids.to_host(99999), Some(100999));
        assert_eq!(got.uids.to_host(100000), None);
        assert_eq!(got.gids, got.uids);
    }

    #[test]
    fn node_mode_and_no_options_are_the_host() {
        assert_eq!(pod_user_namespace(&api::NamespaceOption::default()).unwrap(), None);
        assert_eq!(pod_user_namespace(&options(NamespaceMode::Node, vec![])).unwrap(), None);
        assert!(pod_user_namespace(&options(NamespaceMode::Node, vec![mapping(0, 1, 1)])).is_err());
    }

    #[test]
    fn what_critest_expects_to_fail() {
        let two = vec![mapping(0, 1000, 100000), mapping(0, 2000, 100000)];
        assert!(pod_user_namespace(&options(NamespaceMode::Pod, two)).is_err());
        assert!(pod_user_namespace(&options(NamespaceMode::Pod, vec![mapping(1, 1000, 100000)])).is_err());
        assert!(pod_user_namespace(&options(NamespaceMode::Container, vec![])).is_err());
        assert!(pod_user_namespace(&options(NamespaceMode::Target, vec![])).is_err());
        assert!(pod_user_namespace(&options(NamespaceMode::Pod, vec![])).is_err());
        assert!(pod_user_namespace(&options(NamespaceMode::Pod, vec![mapping(0, u32::MAX, 2)])).is_err());
        let mut host_net = options(NamespaceMode::Pod, vec![mapping(0, 1000, 65536)]);
        host_net.network = NamespaceMode::Node as i32;
        assert!(pod_user_namespace(&host_net).is_err());
        let mut bad = options(NamespaceMode::Pod, vec![mapping(0, 1000, 65536)]);
        bad.userns_options.as_mut().unwrap().mode = 42;
        assert!(pod_user_namespace(&bad).is_err());
    }
}
