//! `os/architecture[/variant]`, as written on command lines and stored in
//! image configs and index entries.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    pub architecture: String,
    pub os: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

impl Default for Platform {
    fn default() -> Self {
        Platform {
            architecture: "amd64".to_string(),
            os: "linux".to_string(),
            variant: None,
        }
    }
}

impl FromStr for Platform {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split('/').collect();
        let valid = |p: &&str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !(2..=3).contains(&parts.len()) || !parts.iter().all(valid) {
            return Err(format!("{s:?}: want OS/ARCH[/VARIANT], e.g. linux/arm64/v8"));
        }
        Ok(Platform {
            os: parts[0].to_string(),
            architecture: parts[1].to_string(),
            variant: parts.get(2).map(|v| v.to_string()),
        })
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(variant) = &self.variant {
            write!(f, "/{variant}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        let p: Platform = "linux/arm64/v8".parse().unwrap();
        assert_eq!(p.os, "linux");
        assert_eq!(p.architecture, "arm64");
        assert_eq!(p.variant.as_deref(), Some("v8"));
        assert_eq!(p.to_string(), "linux/arm64/v8");
        assert_eq!("linux/amd64".parse::<Platform>().unwrap(), Platform::default());
        for bad in ["linux", "linux/", "/amd64", "a/b/c/d", "linux/am d64"] {
            assert!(bad.parse::<Platform>().is_err(), "{bad}");
        }
    }

    #[test]
    fn serializes_without_empty_variant() {
        let json = serde_json::to_value(Platform::default()).unwrap();
        assert_eq!(json, serde_json::json!({"architecture": "amd64", "os": "linux"}));
    }
}
