//! Whether CRIU can checkpoint on this host: `criu check`, as the operator would run it. The
//! shim's CRIU (libcontainer's, over `criu swrk`) is the same binary, found on the same PATH.

use std::process::Command;
use std::sync::OnceLock;

/// libcontainer refuses older CRIU (crun's minimum).
pub const MIN_VERSION: &str = "3.15";

/// A successful probe is kept for the daemon's life; a failed one is repeated on the next call
/// (the operator may install or upgrade CRIU meanwhile).
static WORKS: OnceLock<String> = OnceLock::new();

/// CRIU's version when `criu check` passes; otherwise why checkpointing cannot work here, in
/// words an operator can act on (with CRIU's own message). `criu check` takes a second or two.
pub async fn available() -> Result<String, String> {
    if let Some(version) = WORKS.get() {
        return Ok(version.clone());
    }
    tokio::task::spawn_blocking(probe)
        .await
        .unwrap_or_else(|e| Err(format!("probing CRIU: {e}")))
}

/// `available`, blocking (for `scute check`).
pub fn probe() -> Result<String, String> {
    if let Some(version) = WORKS.get() {
        return Ok(version.clone());
    }
    let version = run(&["--version"])?;
    let version = version
        .lines()
        .find_map(|l| l.strip_prefix("Version:"))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| version.trim().to_string());
    if let Err(why) = run(&["check"]) {
        return Err(format!("`criu check` fails on this host (CRIU {version}): {why}"));
    }
    Ok(WORKS.get_or_init(|| version).clone())
}

/// Runs criu with `args`: its output when it exits 0, else its message.
fn run(args: &[&str]) -> Result<String, String> {
    let output = match Command::new("criu").args(args).output() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!(
            "CRIU is not installed (no `criu` on PATH; on Debian and Ubuntu: apt install criu, {MIN_VERSION} or newer)"
        ))
        }
        Err(e) => return Err(format!("running `criu {}`: {e}", args.join(" "))),
        Ok(output) => output,
    };
    let text = |b: &[u8]| String::from_utf8_lossy(b).trim().to_string();
    if output.status.success() {
        return Ok(format!("{}\n{}", text(&output.stdout), text(&output.stderr)));
    }
    // CRIU prints its reasons on stderr, "Error (file:line): what" lines first.
    let stderr = text(&output.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("Error")).take(3).collect();
    let said = if errors.is_empty() {
        stderr.lines().take(3).collect::<Vec<_>>().join(" | ")
    } else {
        errors.join(" | ")
    };
    Err(format!(
        "{} ({})",
        said.chars().take(1500).collect::<String>(),
        output.status
    ))
}
