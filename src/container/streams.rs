//! Streaming sessions of a container (CRI Exec and Attach, served by the streaming server): the
//! shim runs the process or joins the container's stdio and streams it over a connection of its
//! own; this module checks the container and opens that session.

use super::manager::{shim_failed, ContainerError, ContainerManager};
use super::record::ContainerState;
use crate::shim_client::{AttachOptions, ExecStreamOptions, ShimError, ShimSession};

/// What the client asked for an exec session.
#[derive(Debug, Clone)]
pub struct ExecSession {
    pub cmd: Vec<String>,
    pub tty: bool,
    pub stdin: bool,
}

impl ContainerManager {
    /// Starts `cmd` in a running container with its stdio as a session.
    pub async fn exec_session(&self, id: &str, exec: &ExecSession) -> Result<ShimSession, ContainerError> {
        if exec.cmd.is_empty() || exec.cmd[0].is_empty() {
            return Err(ContainerError::InvalidArgument("Exec: cmd must not be empty".into()));
        }
        let record = self.refresh(self.get(id)?).await?;
        if record.state != ContainerState::Running {
            return Err(ContainerError::FailedPrecondition(format!(
                "container {id} is not running: exec needs a running container"
            )));
        }
        let shim = self.shim(&record.sandbox_id).await?;
        let options = ExecStreamOptions {
            args: exec.cmd.clone(),
            env: Vec::new(),
            tty: exec.tty,
            stdin: exec.stdin,
            width: 0,
            height: 0,
        };
        shim.exec_stream(id, &options).await.map_err(session_failed(id, "exec"))
    }

    /// Joins a running container's stdio (or a created one's from before deferred creates,
    /// whose stdio its shim holds already).
    pub async fn attach_session(&self, id: &str, options: &AttachOptions) -> Result<ShimSession, ContainerError> {
        let record = self.refresh(self.get(id)?).await?;
        if record.state == ContainerState::Exited {
            return Err(ContainerError::FailedPrecondition(format!(
                "container {id} has exited: there is nothing to attach to"
            )));
        }
        if record.state == ContainerState::Created && record.deferred {
            return Err(not_started(id));
        }
        let shim = self.shim(&record.sandbox_id).await?;
        shim.attach(id, options).await.map_err(session_failed(id, "attach"))
    }

    /// Checks, at Exec/Attach time, that the container exists and runs (the session itself
    /// starts when the client connects to the URL).
    pub async fn check_streamable(&self, id_or_prefix: &str, exec: bool) -> Result<String, ContainerError> {
        let id = self.resolve(id_or_prefix)?;
        let record = self.refresh(self.get(&id)?).await?;
        match record.state {
            ContainerState::Running => Ok(id),
            ContainerState::Created if !exec && !record.deferred => Ok(id),
            ContainerState::Created if !exec => Err(not_started(&id)),
            state => Err(ContainerError::FailedPrecondition(format!(
                "container {id} is {state:?}: {} needs a running container",
                if exec { "exec" } else { "attach" }
            ))),
        }
    }
}

/// A created container's stdio is made with its process, at StartContainer.
fn not_started(id: &str) -> ContainerError {
    ContainerError::FailedPrecondition(format!(
        "container {id} has not been started: its stdio is made at StartContainer, attach after it"
    ))
}

/// The shim's refusals keep their meaning (a container that stopped meanwhile, attach with stdin
/// to one created without); everything else is a failure.
fn session_failed<'a>(id: &'a str, what: &'static str) -> impl FnOnce(ShimError) -> ContainerError + 'a {
    move |e| match e {
        ShimError::NotFound(_) => ContainerError::NotFound(format!("container {id} is gone")),
        ShimError::Remote {
            code: crate::shim_client::pb::ErrorCode::FailedPrecondition,
            message,
        } => ContainerError::FailedPrecondition(format!("{what} in container {id}: {message}")),
        other => shim_failed(what)(other),
    }
}
