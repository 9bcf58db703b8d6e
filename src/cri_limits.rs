//! Checks of what the kubelet names and labels, shared by RunPodSandbox and
//! CreateContainer: what no Kubernetes object can carry is InvalidArgument with the field named,
//! before anything is made. Kubernetes' own limits, widened only where the kubelet itself goes
//! past them (it labels a pod with its name, up to 253 bytes).

use std::collections::HashMap;

/// A name, namespace or UID: at most 253 bytes, not blank, no `/`, no control character.
pub const MAX_NAME: usize = 253;
/// A label key: an optional DNS-subdomain prefix (253) and `/`, then a name of at most 63.
pub const MAX_LABEL_KEY: usize = 253 + 1 + 63;
/// A label value: 63 in the API, but the kubelet's `io.kubernetes.pod.name` carries a whole pod
/// name.
pub const MAX_LABEL_VALUE: usize = 253;

/// `field` as a name: Err is the InvalidArgument message.
pub fn check_name(field: &str, value: &str) -> Result<(), String> {
    if value.trim().is_empty() {
        return Err(format!("{field} must not be empty or blank"));
    }
    if value.len() > MAX_NAME || value.contains('/') || value.chars().any(char::is_control) {
        let shown: String = value.chars().take(64).collect();
        return Err(format!(
            "{field} {shown:?} ({} bytes) is not a valid name (at most {MAX_NAME} bytes, no '/' or control characters)",
            value.len()
        ));
    }
    Ok(())
}

pub fn check_labels(field: &str, labels: &HashMap<String, String>) -> Result<(), String> {
    for (key, value) in labels {
        if key.trim().is_empty() || key.len() > MAX_LABEL_KEY {
            let shown: String = key.chars().take(64).collect();
            return Err(format!(
                "{field} key {shown:?} ({} bytes) must be 1 to {MAX_LABEL_KEY} bytes",
                key.len()
            ));
        }
        if value.len() > MAX_LABEL_VALUE {
            return Err(format!(
                "{field}[{key:?}] is {} bytes (at most {MAX_LABEL_VALUE})",
                value.len()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_labels_at_kubernetes_limits() {
        check_name("name", "web-0").unwrap();
        for bad in ["", " ", "\t", "a/b", "nul\0", &"n".repeat(254)] {
            assert!(check_name("name", bad).unwrap_err().starts_with("name"), "{bad:?}");
        }
        let labels = |k: &str, v: &str| HashMap::from([(k.to_string(), v.to_string())]);
        check_labels("labels", &labels("io.kubernetes.pod.name", &"p".repeat(253))).unwrap();
        check_labels(
            "labels",
            &labels(&format!("{}/{}", "d".repeat(253), "n".repeat(63)), ""),
        )
        .unwrap();
        assert!(check_labels("labels", &labels("big", &"v".repeat(1 << 20)))
            .unwrap_err()
            .contains("\"big\""));
        assert!(check_labels("labels", &labels(" ", "v")).is_err());
    }
}
