//! Structured logs through `tracing`: human-readable text by default, one JSON object per line
//! with `log.format = "json"`. Every RPC runs in an `rpc` span carrying its method and ids.
//! Text is coloured only on a terminal and carries no timestamp under journald.

use std::io::IsTerminal;
use std::os::unix::fs::MetadataExt;

use tracing_subscriber::{fmt, EnvFilter};

use crate::config::LogFormat;

/// Environment variable that overrides `log.level`.
pub const LOG_ENV: &str = "SCUTE_LOG";

pub fn init(level: &str, format: LogFormat) {
    let filter = std::env::var(LOG_ENV)
        .ok()
        .and_then(|env| EnvFilter::try_new(env).ok())
        .unwrap_or_else(|| EnvFilter::try_new(level).unwrap_or_else(|_| EnvFilter::new("info")));
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let result = match format {
        // Colour only on a terminal: a log in a file or the journal would be full of escapes.
        // journald stamps every line itself.
        LogFormat::Text if stderr_is_journal() => builder.with_target(false).with_ansi(false).without_time().try_init(),
        LogFormat::Text => builder
            .with_target(false)
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
    };
    // A second init (tests) keeps the first subscriber.
    let _ = result;
}

/// Whether stderr is the journal stream systemd connected (JOURNAL_STREAM names its device and
/// inode, as systemd.exec(5) says to check: a child of the service with stderr redirected
/// inherits the variable but not the stream).
fn stderr_is_journal() -> bool {
    let Ok(stream) = std::env::var("JOURNAL_STREAM") else {
        return false;
    };
    let Ok(meta) = std::fs::metadata("/proc/self/fd/2") else {
        return false;
    };
    journal_stream_matches(&stream, meta.dev(), meta.ino())
}

fn journal_stream_matches(stream: &str, dev: u64, ino: u64) -> bool {
    stream
        .split_once(':')
        .is_some_and(|(d, i)| d.parse() == Ok(dev) && i.parse() == Ok(ino))
}

#[cfg(test)]
mod tests {
    use super::journal_stream_matches;

    #[test]
    fn journal_stream_is_matched_by_device_and_inode() {
        assert!(journal_stream_matches("8:12345", 8, 12345));
        assert!(!journal_stream_matches("8:12345", 8, 12346));
        assert!(!journal_stream_matches("9:12345", 8, 12345));
        assert!(!journal_stream_matches("garbage", 8, 12345));
        assert!(!journal_stream_matches("", 0, 0));
    }
}
