//! The transport-neutral part of an exec or attach session: the client's streams (from SPDY or
//! WebSocket, see `remotecommand.rs`) on one side, the shim's session on the other. Also the
//! status the client gets at the end, in the remotecommand protocol's two formats.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::{mpsc, Mutex};

use crate::shim_client::{SessionOutput, ShimSession};

/// Output for the client, in order.
#[derive(Debug)]
pub enum Out {
    Stdout(Bytes),
    Stderr(Bytes),
}

/// A terminal size as the remotecommand resize stream sends it (JSON, one object per event).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct TerminalSize {
    #[serde(rename = "Width")]
    pub width: u16,
    #[serde(rename = "Height")]
    pub height: u16,
}

/// The client side of a session, as a transport presents it.
pub struct ClientStreams {
    /// Stdin data; the channel closes at the client's end of input.
    pub stdin: Option<mpsc::Receiver<Bytes>>,
    pub resize: Option<mpsc::Receiver<TerminalSize>>,
    /// Where output goes; the transport writes it out (bounded: a slow client slows the copy).
    pub output: mpsc::Sender<Out>,
}

/// How a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The process (exec) or the container (attach) exited with this code.
    Exited(i32),
    /// The session could not run, or broke; the message says why.
    Failed(String),
}

/// When a session last moved data, for the idle timeout.
#[derive(Clone)]
pub struct Activity {
    origin: Instant,
    last_ms: Arc<AtomicU64>,
}

impl Default for Activity {
    fn default() -> Self {
        Activity {
            origin: Instant::now(),
            last_ms: Arc::new(AtomicU64::new(0)),
        }
    }
}

impl Activity {
    pub fn touch(&self) {
        self.last_ms
            .store(self.origin.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Resolves once nothing has moved for `timeout`.
    pub async fn idle_for(&self, timeout: Duration) {
        loop {
            let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            let idle = self.origin.elapsed().saturating_sub(last);
            if idle >= timeout {
                return;
            }
            tokio::time::sleep(timeout - idle).await;
        }
    }
}

/// Copies between the client and the shim until the process (or container) exits, then returns
/// how it ended. Output that came before the exit has been handed to `client.output`. If the
/// client goes away, the caller drops this future, which closes the shim session (the shim then
/// kills an exec'd process).
pub async fn bridge(shim: ShimSession, client: ClientStreams, activity: Activity) -> Outcome {
    let ShimSession { input, mut output, .. } = shim;
    let input = Arc::new(Mutex::new(input));
    let mut pumps = tokio::task::JoinSet::new();
    if let Some(mut stdin) = client.stdin {
        let (input, activity) = (input.clone(), activity.clone());
        pumps.spawn(async move {
            while let Some(data) = stdin.recv().await {
                activity.touch();
                if input.lock().await.stdin(&data).await.is_err() {
                    return;
                }
            }
            let _ = input.lock().await.close_stdin().await;
        });
    }
    if let Some(mut resize) = client.resize {
        let input = input.clone();
        pumps.spawn(async move {
            while let Some(size) = resize.recv().await {
                if input
                    .lock()
                    .await
                    .resize(size.width.into(), size.height.into())
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
    }
    let outcome = loop {
        match output.next().await {
            Some(Ok(SessionOutput::Stdout(data))) => {
                activity.touch();
                // A client that stopped reading its output still gets the exit status.
                let _ = client.output.send(Out::Stdout(data)).await;
            }
            Some(Ok(SessionOutput::Stderr(data))) => {
                activity.touch();
                let _ = client.output.send(Out::Stderr(data)).await;
            }
            Some(Ok(SessionOutput::Exit(code))) => break Outcome::Exited(code),
            Some(Err(e)) => break Outcome::Failed(format!("the shim session broke: {e}")),
            None => break Outcome::Failed("the shim ended the session without an exit status".into()),
        }
    };
    pumps.abort_all();
    outcome
}

/// The error-stream message for `outcome`: protocol v4 and later send a JSON `metav1.Status`
/// (the exit code in its causes, which kubectl and crictl turn into their own exit code); earlier
/// versions send failures as plain text and nothing on success. `exec` adds the command to the
/// message, as the kubelet does. None: nothing to send.
pub fn status_message(outcome: &Outcome, json_status: bool, command: Option<&[String]>) -> Option<Vec<u8>> {
    let status = match outcome {
        Outcome::Exited(0) => json!({"metadata": {}, "status": "Success"}),
        Outcome::Exited(code) => {
            let what = match command {
                Some(cmd) => format!("error executing command {cmd:?}, exit code {code}"),
                None => format!("exit code {code}"),
            };
            json!({
                "metadata": {},
                "status": "Failure",
                "message": format!("command terminated with non-zero exit code: {what}"),
                "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
            })
        }
        Outcome::Failed(message) => {
            let message = format!("error executing command in container: {message}");
            json!({
                "metadata": {},
                "status": "Failure",
                "message": format!("Internal error occurred: {message}"),
                "reason": "InternalError",
                "details": {"causes": [{"message": message}]},
                "code": 500,
            })
        }
    };
    if json_status {
        return Some(status.to_string().into_bytes());
    }
    match outcome {
        Outcome::Exited(0) => None,
        _ => status["message"].as_str().map(|m| m.as_bytes().to_vec()),
    }
}

/// Splits a resize stream's bytes into sizes (JSON objects, maybe several per read, maybe cut
/// across reads): whole objects are returned, a cut one stays in `pending`. Garbage ends the
/// stream (Err).
pub fn parse_resizes(pending: &mut Vec<u8>, data: &[u8]) -> Result<Vec<TerminalSize>, String> {
    pending.extend_from_slice(data);
    let mut sizes = Vec::new();
    let mut stream = serde_json::Deserializer::from_slice(pending).into_iter::<TerminalSize>();
    let mut consumed = 0;
    loop {
        match stream.next() {
            Some(Ok(size)) => {
                sizes.push(size);
                consumed = stream.byte_offset();
            }
            Some(Err(e)) if e.is_eof() => break,
            Some(Err(e)) => return Err(format!("bad resize event: {e}")),
            None => {
                consumed = stream.byte_offset();
                break;
            }
        }
    }
    pending.drain(..consumed);
    if pending.len() > 4096 {
        return Err("resize event too long".into());
    }
    Ok(sizes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v4_status_carries_the_exit_code() {
        let cmd = vec!["sh".to_string(), "-c".to_string(), "exit 3".to_string()];
        let body = status_message(&Outcome::Exited(3), true, Some(&cmd)).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["status"], "Failure");
        assert_eq!(v["reason"], "NonZeroExitCode");
        assert_eq!(v["details"]["causes"][0]["reason"], "ExitCode");
        assert_eq!(v["details"]["causes"][0]["message"], "3");
        let ok = status_message(&Outcome::Exited(0), true, Some(&cmd)).unwrap();
        assert_eq!(ok, br#"{"metadata":{},"status":"Success"}"#);
    }

    #[test]
    fn pre_v4_status_is_text_and_only_for_failures() {
        assert_eq!(status_message(&Outcome::Exited(0), false, None), None);
        let text = status_message(&Outcome::Failed("boom".into()), false, None).unwrap();
        assert_eq!(
            String::from_utf8(text).unwrap(),
            "Internal error occurred: error executing command in container: boom"
        );
    }

    #[test]
    fn resize_events_split_anywhere() {
        let mut pending = Vec::new();
        let all = br#"{"Width":80,"Height":24}
{"Width":100,"Height":50}{"Width":1,"#;
        let sizes = parse_resizes(&mut pending, all).unwrap();
        assert_eq!(
            sizes,
            [
                TerminalSize { width: 80, height: 24 },
                TerminalSize { width: 100, height: 50 }
            ]
        );
        let sizes = parse_resizes(&mut pending, br#""Height":2}"#).unwrap();
        assert_eq!(sizes, [TerminalSize { width: 1, height: 2 }]);
        assert!(pending.is_empty());
        assert!(parse_resizes(&mut pending, b"nonsense").is_err());
    }
}
