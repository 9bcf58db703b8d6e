//! Registry host configuration (containerd's hosts.toml layout). Being written.
