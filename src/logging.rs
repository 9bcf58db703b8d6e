//! Structured logs through `tracing`: human-readable text by default, one JSON object per line
//! with `log.format = "json"`. Every RPC runs in an `rpc` span carrying its method and ids.

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
        LogFormat::Text => builder.with_target(false).try_init(),
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
