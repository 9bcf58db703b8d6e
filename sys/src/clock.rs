//! Wall-clock time as the CRI and the shim protocol carry it.

/// Nanoseconds since the Unix epoch (0 if the clock is before it).
pub fn now_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn after_2020() {
        assert!(super::now_nanos() > 1_577_836_800_000_000_000);
    }
}
