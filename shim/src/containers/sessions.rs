//! Attach sessions and exec'd processes of the shim's containers: their requests, the output
//! copied to sessions as it is read, their input to a container's stdin, and the descriptors the
//! event loop polls for them.

use super::executor::{exec_in_helper, ExecIo};
use std::fs::{self};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::exec::{self, output_frame, Capture, Exec, Outbox, StreamExec};
use crate::pb::{self, session_input};
use crate::stdio::{self, Input};

use super::{in_helper, output_pipe, ApiError, Containers, Entry, Source, Status};

/// An attach session of a container.
pub(super) struct Attachment {
    pub(super) conn: u64,
    /// Its input goes to the container's stdin (until it ends its input).
    pub(super) stdin: bool,
    pub(super) stdout: bool,
    pub(super) stderr: bool,
}

impl Attachment {
    /// Wants output of stream `i` (0 stdout, 1 stderr; a terminal is stream 0 and serves both).
    fn wants(&self, i: usize, tty: bool) -> bool {
        if tty {
            self.stdout || self.stderr
        } else if i == 0 {
            self.stdout
        } else {
            self.stderr
        }
    }
}

/// Copies a chunk of a container's stream `i` to its attached sessions.
pub(super) fn copy_to_sessions(attached: &[Attachment], tty: bool, i: usize, chunk: &[u8], outbox: &mut Outbox) {
    for a in attached.iter().filter(|a| a.wants(i, tty)) {
        outbox.push((a.conn, output_frame(i, chunk)));
    }
}

impl Containers {
    /// Checks an exec request: the container runs, the command and environment make sense.
    fn check_exec(&self, id: &str, args: &[String], env: &[String]) -> Result<(), ApiError> {
        let entry = self.table.get(id).ok_or_else(|| ApiError::not_found(id))?;
        if entry.status != Status::Running {
            return Err(ApiError::precondition(format!(
                "container {id} is {}, exec needs a running container",
                entry.status.name()
            )));
        }
        if args.is_empty() || args[0].is_empty() {
            return Err(ApiError::invalid("exec needs a command"));
        }
        if let Some(bad) = env.iter().find(|e| !e.contains('=') || e.starts_with('=')) {
            return Err(ApiError::invalid(format!("environment entry {bad:?} is not KEY=VALUE")));
        }
        Ok(())
    }

    /// Starts `args` in container `id` through a libcontainer helper, with `io`: (serial, pid).
    fn spawn_exec(
        &mut self,
        id: &str,
        args: Vec<String>,
        env: Vec<String>,
        io: ExecIo,
    ) -> Result<(u64, i32), ApiError> {
        let serial = self.next_exec;
        self.next_exec += 1;
        let keep: Vec<RawFd> = std::iter::once(self.log_fd)
            .chain(
                [&io.stdin, &io.stdout, &io.stderr]
                    .into_iter()
                    .flatten()
                    .map(|f| f.as_raw_fd()),
            )
            .collect();
        let root = self.root.clone();
        let process_file = self
            .root
            .parent()
            .unwrap_or(Path::new("/"))
            .join(format!("exec-{serial}.json"));
        let log_file = self.log_path();
        let pid = in_helper(&format!("exec in container {id}"), &keep, move || {
            let result = exec_in_helper(id, &root, &process_file, args, env, io);
            let _ = fs::remove_file(&process_file);
            result.map_err(|e| {
                ApiError::new(
                    e.code,
                    format!("exec in container {id}: {} (details in {log_file:?})", e.message),
                )
            })
        })?;
        Ok((serial, pid))
    }

    /// Starts `r.args` in the running container `r.container_id`, for the connection `conn`. The
    /// answer comes from `take_finished_execs` once the process has exited.
    pub fn exec(&mut self, conn: u64, r: pb::ExecRequest) -> Result<(), ApiError> {
        let started = Instant::now();
        let id = r.container_id.as_str();
        self.check_exec(id, &r.args, &r.env)?;
        let max = match usize::try_from(r.max_output_bytes) {
            Ok(0) | Err(_) => exec::DEFAULT_MAX_OUTPUT,
            Ok(n) => n.min(exec::DEFAULT_MAX_OUTPUT),
        };
        let deadline = (r.timeout_ms > 0).then(|| started + Duration::from_millis(r.timeout_ms.into()));
        let (out_r, out_w) = output_pipe()?;
        let (err_r, err_w) = output_pipe()?;
        let io = ExecIo {
            stdout: Some(out_w),
            stderr: Some(err_w),
            ..ExecIo::default()
        };
        let (serial, pid) = self.spawn_exec(id, r.args, r.env, io)?;
        tracing::info!(id, pid, serial, setup = ?started.elapsed(), "exec started");
        self.execs.push(Exec::new(
            serial,
            conn,
            id.to_owned(),
            pid,
            [Capture::new(out_r, max), Capture::new(err_r, max)],
            deadline,
        ));
        Ok(())
    }

    /// Starts `r.args` in the running container `r.container_id` with its stdio a session on
    /// the connection `conn`; the process's pid. Output and the exit come as frames for `conn`.
    pub fn exec_stream(&mut self, conn: u64, r: pb::ExecStreamRequest) -> Result<u32, ApiError> {
        let started = Instant::now();
        let id = r.container_id.as_str();
        self.check_exec(id, &r.args, &r.env)?;
        let winsize = if r.tty { stdio::winsize(r.width, r.height) } else { None };
        let mut io = ExecIo {
            winsize,
            ..ExecIo::default()
        };
        let mut out = [None, None];
        let mut stdin = None;
        let console = if r.tty {
            let console = self.console_socket()?;
            io.console = Some(console.path().to_path_buf());
            Some(console)
        } else {
            let (out_r, out_w) = output_pipe()?;
            let (err_r, err_w) = output_pipe()?;
            out = [Some(out_r), Some(err_r)];
            (io.stdout, io.stderr) = (Some(out_w), Some(err_w));
            if r.stdin {
                let (r, w) = stdio::input_pipe().map_err(|e| ApiError::internal(format!("stdin pipe: {e}")))?;
                io.stdin = Some(r);
                stdin = Some(Input::new(w, false));
            }
            None
        };
        let (serial, pid) = self.spawn_exec(id, r.args, r.env, io)?;
        let mut master = None;
        if let Some(console) = console {
            let received = console.receive().and_then(|m| {
                let out_copy = stdio::dup(m.as_fd())?;
                let stdin_copy = if r.stdin { Some(stdio::dup(m.as_fd())?) } else { None };
                Ok((m, out_copy, stdin_copy))
            });
            match received {
                Ok((m, out_copy, stdin_copy)) => {
                    // The process set the size itself before it exec'd (see ShimExecutor); this
                    // only repeats it.
                    if let Some(ws) = winsize {
                        let _ = stdio::set_winsize(m.as_raw_fd(), ws);
                    }
                    out[0] = Some(out_copy);
                    stdin = stdin_copy.map(|fd| Input::new(fd, true));
                    master = Some(m);
                }
                Err(e) => {
                    // Reaped by the event loop as an unknown child.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    return Err(ApiError::internal(format!(
                        "exec in container {id}: its terminal did not arrive: {e} (details in {:?})",
                        self.log_path()
                    )));
                }
            }
        }
        tracing::info!(id, pid, serial, tty = r.tty, stdin = r.stdin, setup = ?started.elapsed(), "exec session started");
        self.streams
            .push(StreamExec::new(serial, conn, id.to_owned(), pid, out, stdin, master));
        Ok(pid as u32)
    }

    /// Attaches the connection `conn` to container `r.container_id`'s stdio: from now on its
    /// output is copied to `conn` as frames, and input from `conn` goes to its stdin.
    pub fn attach(&mut self, conn: u64, r: pb::AttachRequest) -> Result<pb::AttachResponse, ApiError> {
        let id = r.container_id.as_str();
        let entry = self.table.get_mut(id).ok_or_else(|| ApiError::not_found(id))?;
        if let Status::Stopped(_) = entry.status {
            return Err(ApiError::precondition(format!(
                "container {id} is stopped, there is nothing to attach to"
            )));
        }
        if r.stdin {
            match &entry.stdin {
                None => {
                    return Err(ApiError::precondition(format!(
                        "container {id} was created without stdin, attach cannot write to it"
                    )))
                }
                Some(input) if !input.is_open() => {
                    return Err(ApiError::precondition(format!(
                        "the stdin of container {id} is closed{}",
                        if entry.stdin_once {
                            " (stdin_once: an earlier attach ended its input)"
                        } else {
                            ""
                        }
                    )))
                }
                Some(_) => {}
            }
        }
        entry.attached.push(Attachment {
            conn,
            stdin: r.stdin,
            stdout: r.stdout,
            stderr: r.stderr,
        });
        tracing::info!(
            id,
            conn,
            stdin = r.stdin,
            stdout = r.stdout,
            stderr = r.stderr,
            "attached"
        );
        Ok(pb::AttachResponse {
            tty: entry.tty.is_some(),
        })
    }

    /// Input from the session on `conn`: stdin data, its end, or a terminal size.
    pub fn session_input(&mut self, conn: u64, input: session_input::Kind) {
        if let Some(x) = self.streams.iter_mut().find(|x| x.conn == Some(conn)) {
            match input {
                session_input::Kind::Stdin(data) => {
                    if let Some(i) = &mut x.stdin {
                        i.push(&data);
                    }
                }
                session_input::Kind::CloseStdin(_) => {
                    if let Some(i) = &mut x.stdin {
                        i.close();
                    }
                }
                session_input::Kind::Resize(r) => x.resize(r.width, r.height),
            }
            return;
        }
        let Some((id, entry)) = self
            .table
            .iter_mut()
            .find(|(_, e)| e.attached.iter().any(|a| a.conn == conn))
        else {
            return;
        };
        let Some(a) = entry.attached.iter_mut().find(|a| a.conn == conn) else {
            return;
        };
        match input {
            session_input::Kind::Stdin(data) => {
                if a.stdin {
                    if let Some(i) = &mut entry.stdin {
                        i.push(&data);
                    }
                }
            }
            session_input::Kind::CloseStdin(_) => {
                if a.stdin {
                    a.stdin = false;
                    end_attach_input(id, entry);
                }
            }
            session_input::Kind::Resize(r) => {
                if let (Some(master), Some(ws)) = (&entry.tty, stdio::winsize(r.width, r.height)) {
                    if let Err(e) = stdio::set_winsize(master.as_raw_fd(), ws) {
                        tracing::debug!(id, error = %e, "resizing a container's terminal");
                    }
                }
            }
        }
    }

    /// Whether the session on `conn` may send more input now: false while its stdin has more
    /// queued than the process has taken (the session is then not read; nothing is dropped).
    pub fn session_input_room(&self, conn: u64) -> bool {
        if let Some(x) = self.streams.iter().find(|x| x.conn == Some(conn)) {
            return x.stdin.as_ref().is_none_or(|i| i.has_room());
        }
        for entry in self.table.values() {
            if entry.attached.iter().any(|a| a.conn == conn && a.stdin) {
                return entry.stdin.as_ref().is_none_or(|i| i.has_room());
            }
        }
        true
    }

    /// The session on `conn` went away: an exec's process is killed, an attach detaches (its
    /// input ends, which closes stdin with stdin_once).
    pub fn session_closed(&mut self, conn: u64) {
        if let Some(x) = self.streams.iter_mut().find(|x| x.conn == Some(conn)) {
            if !x.exited() {
                tracing::info!(container = %x.container, pid = x.pid, "exec session closed by the client, killing its process");
            }
            x.abandon();
            return;
        }
        for (id, entry) in self.table.iter_mut() {
            if let Some(pos) = entry.attached.iter().position(|a| a.conn == conn) {
                let a = entry.attached.remove(pos);
                tracing::info!(id, conn, "detached");
                if a.stdin {
                    end_attach_input(id, entry);
                }
                return;
            }
        }
    }

    /// Frames for sessions since the last call.
    pub fn take_session_output(&mut self) -> Outbox {
        std::mem::take(&mut self.outbox)
    }

    /// Hands the exits of finished ExecStream processes to their sessions (after their output).
    pub fn finish_streams(&mut self) {
        let now = Instant::now();
        let mut i = 0;
        while i < self.streams.len() {
            if self.streams[i].is_done(now) {
                self.streams.swap_remove(i).finish(&mut self.outbox);
            } else {
                i += 1;
            }
        }
    }

    /// Descriptors to poll (containers' output and stdin, execs) and the events wanted. `room`:
    /// how much more a session's connection takes now (ExecStream output is read only that far).
    pub fn poll_sources(&self, room: &dyn Fn(u64) -> usize) -> Vec<(Source, BorrowedFd<'_>, i16)> {
        let mut out = Vec::new();
        for (id, e) in &self.table {
            if let Some(log) = &e.log {
                for (i, s) in log.streams.iter().enumerate() {
                    if let Some(fd) = s.fd() {
                        out.push((Source::Log(id.clone(), i), fd, libc::POLLIN));
                    }
                }
            }
            if let Some(fd) = e.stdin.as_ref().and_then(|i| i.pending_fd()) {
                out.push((Source::Stdin(id.clone()), fd, libc::POLLOUT));
            }
            if let (Status::Created | Status::Running, Some(fd)) = (&e.status, e.oom.as_ref().and_then(|o| o.fd())) {
                out.push((Source::Oom(id.clone()), fd, libc::POLLPRI));
            }
        }
        for x in &self.execs {
            for (i, c) in x.out.iter().enumerate() {
                if let Some(fd) = c.fd() {
                    out.push((Source::Exec(x.serial, i), fd, libc::POLLIN));
                }
            }
        }
        for x in &self.streams {
            if x.conn.is_none_or(|c| room(c) > 0) {
                for (i, fd) in x.out_fds() {
                    out.push((Source::Stream(x.serial, i), fd, libc::POLLIN));
                }
            }
            if let Some(fd) = x.stdin.as_ref().and_then(|i| i.pending_fd()) {
                out.push((Source::StreamStdin(x.serial), fd, libc::POLLOUT));
            }
        }
        out
    }

    /// A polled descriptor is ready (`revents`).
    pub fn on_ready(&mut self, source: &Source, revents: i16, room: &dyn Fn(u64) -> usize) {
        // For a stdin: its reader is gone (a pipe's read end closed, a terminal's slave closed).
        let gone = revents & (libc::POLLHUP | libc::POLLERR) != 0;
        match source {
            Source::Oom(id) => {
                if let Some(watch) = self.table.get_mut(id).and_then(|e| e.oom.as_mut()) {
                    watch.refresh();
                }
            }
            Source::Log(id, i) => {
                let Containers { table, outbox, .. } = self;
                if let Some(Entry {
                    log: Some(log),
                    attached,
                    ..
                }) = table.get_mut(id)
                {
                    let tty = log.terminal;
                    log.drain(*i, id, false, &mut |s, chunk| {
                        copy_to_sessions(attached, tty, s, chunk, outbox)
                    });
                }
            }
            Source::Exec(serial, i) => {
                if let Some(x) = self.execs.iter_mut().find(|x| x.serial == *serial) {
                    x.out[*i].drain(false);
                }
            }
            Source::Stream(serial, i) => {
                if let Some(x) = self.streams.iter_mut().find(|x| x.serial == *serial) {
                    let room = x.conn.map_or(usize::MAX, room);
                    x.read(*i, room, &mut self.outbox);
                }
            }
            Source::Stdin(id) => {
                if let Some(input) = self.table.get_mut(id).and_then(|e| e.stdin.as_mut()) {
                    if gone {
                        input.hang_up();
                    } else {
                        input.flush();
                    }
                }
            }
            Source::StreamStdin(serial) => {
                if let Some(input) = self
                    .streams
                    .iter_mut()
                    .find(|x| x.serial == *serial)
                    .and_then(|x| x.stdin.as_mut())
                {
                    if gone {
                        input.hang_up();
                    } else {
                        input.flush();
                    }
                }
            }
        }
    }

    /// The earliest time an exec needs attention (a timeout, the end of waiting for its output).
    pub fn next_wake(&self) -> Option<Instant> {
        self.execs
            .iter()
            .filter_map(|x| x.wake_at())
            .chain(self.streams.iter().filter_map(|x| x.wake_at()))
            .min()
    }

    /// Kills timed-out execs and hands out the answers of finished ones: (connection, answer);
    /// answers of execs whose connection went away are dropped.
    pub fn take_finished_execs(&mut self) -> Vec<(u64, pb::ExecResponse)> {
        let now = Instant::now();
        for x in &mut self.execs {
            x.check_timeout(now);
        }
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.execs.len() {
            if self.execs[i].is_done(now) {
                let x = self.execs.swap_remove(i);
                let conn = x.conn;
                let (serial, container) = (x.serial, x.container.clone());
                let resp = x.into_response();
                tracing::info!(
                    container,
                    serial,
                    exit_code = resp.exit_code,
                    timed_out = resp.timed_out,
                    "exec finished"
                );
                if let Some(conn) = conn {
                    out.push((conn, resp));
                }
            } else {
                i += 1;
            }
        }
        out
    }

    /// The connection waiting for these execs went away: kill them, nobody wants their answer.
    pub fn abandon_execs(&mut self, conn: u64) {
        for x in self.execs.iter_mut().filter(|x| x.conn == Some(conn)) {
            tracing::info!(container = %x.container, pid = x.pid, "exec's client went away, killing it");
            x.conn = None;
            x.kill();
        }
    }

    #[cfg(test)]
    pub fn pending_execs(&self) -> usize {
        self.execs.len()
    }
}

/// An attach session that fed stdin ended its input: with stdin_once, that closes stdin.
pub(super) fn end_attach_input(id: &str, entry: &mut Entry) {
    if !entry.stdin_once {
        return;
    }
    if let Some(input) = entry.stdin.as_mut().filter(|i| i.is_open()) {
        tracing::info!(
            id,
            "stdin_once: an attach ended its input, closing the container's stdin"
        );
        input.close();
    }
}
