//! scute-shim: the per-pod supervisor, one process per pod sandbox.
//!
//! `scute-shim --id <sandbox-id> --state-dir <dir> [--log-level L]`
//!
//! Started by the daemon, it forks: the process the daemon started waits until the real shim is
//! ready (socket listening, pid file written) and exits 0, or prints why it is not and exits 1.
//! The shim itself is detached (own session, stdio on /dev/null and <state-dir>/shim.log), is the
//! child subreaper of its containers, runs them through libcontainer, reaps them and records
//! their exits in <state-dir>/exits/, and serves proto/shim/v1 on <state-dir>/shim.sock until a
//! Shutdown. It is single-threaded: one poll loop (see server.rs), no async runtime.

mod api_error;
mod cgroup_v1;
mod cgroup_v2;
mod containers;
mod devices;
mod exec;
mod exits;
mod frame;
mod helper;
mod logs;
mod memory;
mod oom;
mod scope;
mod server;
mod stdio;
mod systemd_scope;
#[cfg(test)]
mod test_support;

pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/scute.shim.v1.rs"));
}

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Mutex;

use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::unistd::{fork, ForkResult};
use tracing::level_filters::LevelFilter;

use containers::Containers;
use server::Server;

const USAGE: &str = "usage: scute-shim --id <sandbox-id> --state-dir <dir> [--log-level error|warn|info|debug|trace] [--cgroup-driver cgroupfs|systemd] [--cgroup <path>]";

/// `--help` (also the package's man page, by help2man).
const HELP: &str = "scute-shim: the per-pod shim of the scute container runtime.

The scute daemon starts one per pod sandbox; it is not meant to be run by hand. It serves the
daemon on <state-dir>/shim.sock, creates and runs the pod's containers (pause included)
through libcontainer, reaps them as their subreaper, keeps their logs and exit codes, and
outlives daemon restarts and upgrades.

usage: scute-shim --id <sandbox-id> --state-dir <dir> [--log-level error|warn|info|debug|trace] [--cgroup-driver cgroupfs|systemd] [--cgroup <path>]

Options:
  --id <sandbox-id>         the pod sandbox this shim serves
  --state-dir <dir>         its socket, pid file, exit files and container state
  --log-level <level>       error, warn, info (the default), debug or trace
  --cgroup-driver <driver>  cgroupfs (the default) or systemd
  --cgroup <path>           the shim's own cgroup, in the driver's form (the daemon puts it
                            beside the pod's containers); without it, the shim stays where it
                            was started (cgroupfs) or takes a scope in system.slice (systemd)
  -h, --help                this text
  -V, --version             the version";

#[derive(Debug)]
struct Args {
    id: String,
    state_dir: PathBuf,
    log_level: LevelFilter,
    /// systemd: containers get transient scopes (libcontainer's systemd manager) and the shim a
    /// scope of its own.
    systemd: bool,
    /// The cgroups path (the driver's form) the shim moves itself into.
    cgroup: Option<String>,
}

fn parse_args(args: impl IntoIterator<Item = OsString>) -> Result<Args, String> {
    let mut id = None;
    let mut state_dir = None;
    let mut log_level = LevelFilter::INFO;
    let mut systemd = false;
    let mut cgroup = None;
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let arg = arg.into_string().map_err(|a| format!("argument {a:?} is not UTF-8"))?;
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(OsString::from(v))),
            _ => (arg.clone(), None),
        };
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match name.as_str() {
            "--id" => {
                id = Some(
                    value("--id")?
                        .into_string()
                        .map_err(|_| "--id is not UTF-8".to_string())?,
                )
            }
            "--state-dir" => state_dir = Some(PathBuf::from(value("--state-dir")?)),
            "--log-level" => {
                let v = value("--log-level")?;
                let v = v.to_str().ok_or("--log-level is not UTF-8")?;
                log_level = LevelFilter::from_str(v).map_err(|_| format!("unknown log level {v:?}"))?;
            }
            "--cgroup-driver" => {
                systemd = match value("--cgroup-driver")?.to_str() {
                    Some("systemd") => true,
                    Some("cgroupfs") => false,
                    other => return Err(format!("unknown cgroup driver {other:?} (cgroupfs or systemd)")),
                }
            }
            "--cgroup" => {
                let v = value("--cgroup")?
                    .into_string()
                    .map_err(|_| "--cgroup is not UTF-8".to_string())?;
                if v.is_empty() || v.contains('\0') || v.split('/').any(|c| c == "..") {
                    return Err(format!("invalid cgroup path {v:?}"));
                }
                cgroup = Some(v);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let id = id.ok_or("--id is required")?;
    if id.is_empty() || id.contains('/') || id.contains('\0') {
        return Err(format!("invalid sandbox id {id:?}"));
    }
    let state_dir = state_dir.ok_or("--state-dir is required")?;
    if !state_dir.is_absolute() {
        return Err(format!("--state-dir {state_dir:?} must be absolute"));
    }
    Ok(Args {
        id,
        state_dir,
        log_level,
        systemd,
        cgroup,
    })
}

fn main() {
    // The daemon's descriptors have no business in a long-lived process (its listening sockets
    // would stay open as long as the pod runs). Everything Rust opened so far is CLOEXEC anyway.
    unsafe {
        libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
    }
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == "--version" || a == "-V")
    {
        println!("scute-shim {}", env!("CARGO_PKG_VERSION"));
        return;
    }
    if std::env::args_os().nth(1).is_some_and(|a| a == "--help" || a == "-h") {
        println!("{HELP}");
        return;
    }
    let args = match parse_args(std::env::args_os().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("scute-shim: {e}\n{USAGE}");
            std::process::exit(2);
        }
    };

    let (ready_r, ready_w) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
        Ok(p) => p,
        Err(e) => fail_early(&format!("pipe: {e}")),
    };
    // Single-threaded so far, so fork is safe.
    match unsafe { fork() } {
        Err(e) => fail_early(&format!("fork: {e}")),
        Ok(ForkResult::Parent { child }) => {
            drop(ready_w);
            let mut msg = String::new();
            let _ = File::from(ready_r).read_to_string(&mut msg);
            if msg == "ok" {
                std::process::exit(0);
            }
            let _ = nix::sys::wait::waitpid(child, None);
            if msg.is_empty() {
                msg = "the shim exited before it was ready".into();
            }
            fail_early(&msg);
        }
        Ok(ForkResult::Child) => {
            drop(ready_r);
            match setup(&args) {
                Ok(mut server) => {
                    let mut ready = File::from(ready_w);
                    let _ = ready.write_all(b"ok");
                    drop(ready);
                    tracing::info!(
                        sandbox = %args.id,
                        pid = std::process::id(),
                        version = env!("CARGO_PKG_VERSION"),
                        "shim ready"
                    );
                    server.run();
                    tracing::info!("shim exits");
                    std::process::exit(0);
                }
                Err(e) => {
                    tracing::error!(error = %e, "shim setup failed");
                    let _ = File::from(ready_w).write_all(e.as_bytes());
                    std::process::exit(1);
                }
            }
        }
    }
}

fn fail_early(msg: &str) -> ! {
    eprintln!("scute-shim: {msg}");
    std::process::exit(1);
}

/// Everything between the fork and readiness. Errors are sent to the waiting parent.
fn setup(args: &Args) -> Result<Server, String> {
    nix::unistd::setsid().map_err(|e| format!("setsid: {e}"))?;
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    let dir = &args.state_dir;
    fs::create_dir_all(dir).map_err(|e| format!("creating state dir {dir:?}: {e}"))?;
    let dir = fs::canonicalize(dir).map_err(|e| format!("state dir {dir:?}: {e}"))?;
    std::env::set_current_dir("/").map_err(|e| format!("chdir /: {e}"))?;

    // Logs: tracing writes to its own descriptor of shim.log (libcontainer's forked helpers log
    // through it too, until they exec); stderr also goes there so that a panic is recorded.
    let log_path = dir.join("shim.log");
    let log = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(&log_path)
        .map_err(|e| format!("opening {log_path:?}: {e}"))?;
    let null = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| format!("/dev/null: {e}"))?;
    for (from, to) in [(null.as_raw_fd(), 0), (null.as_raw_fd(), 1), (log.as_raw_fd(), 2)] {
        nix::unistd::dup2(from, to).map_err(|e| format!("dup2 to {to}: {e}"))?;
    }
    drop(null);
    let log_fd = log.as_raw_fd();
    tracing_subscriber::fmt()
        .with_max_level(args.log_level)
        .with_writer(Mutex::new(log))
        .with_target(false)
        .init();

    if let Some(cgroup) = scope::own_cgroup(&args.id, args.systemd, args.cgroup.as_deref()) {
        scope::enter(&cgroup, args.systemd)?;
        tracing::info!(%cgroup, "in a cgroup of its own");
    }
    // Orphaned descendants (a container's init once libcontainer's helper exits) become ours.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(format!("PR_SET_CHILD_SUBREAPER: {}", std::io::Error::last_os_error()));
    }
    // SIGCHLD through a signalfd; the mask is reset for container processes (ShimExecutor).
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    mask.thread_block().map_err(|e| format!("blocking SIGCHLD: {e}"))?;
    let sigchld = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
        .map_err(|e| format!("signalfd: {e}"))?;

    let root = dir.join("containers");
    let exits_dir = dir.join("exits");
    for d in [&root, &exits_dir] {
        fs::create_dir_all(d).map_err(|e| format!("creating {d:?}: {e}"))?;
    }

    let listener = listen(&dir.join("shim.sock"))?;
    write_pid_file(&dir)?;
    // The shim's own files are private (its dir is 0700). What libcontainer makes from here on
    // — cgroup dirs, mount points in a rootfs — gets runc's 0755: a pod user namespace's root
    // is not the host's and must be able to walk its own cgroup path to bind it.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
    Ok(Server::new(
        args.id.clone(),
        dir,
        listener,
        sigchld,
        Containers::new(root, exits_dir, log_fd).with_systemd(args.systemd),
    ))
}

fn listen(sock: &Path) -> Result<UnixListener, String> {
    if sock.exists() {
        if UnixStream::connect(sock).is_ok() {
            return Err(format!("another shim is serving {sock:?}"));
        }
        fs::remove_file(sock).map_err(|e| format!("removing stale {sock:?}: {e}"))?;
    }
    // The umask (077) makes the socket 0600 from the start; chmod states it.
    let listener = UnixListener::bind(sock).map_err(|e| format!("binding {sock:?}: {e}"))?;
    fs::set_permissions(sock, fs::Permissions::from_mode(0o600)).map_err(|e| format!("chmod {sock:?}: {e}"))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("set_nonblocking: {e}"))?;
    Ok(listener)
}

fn write_pid_file(dir: &Path) -> Result<(), String> {
    let tmp = dir.join(".shim.pid.tmp");
    let target = dir.join("shim.pid");
    fs::write(&tmp, format!("{}\n", std::process::id()))
        .and_then(|()| fs::rename(&tmp, &target))
        .map_err(|e| format!("writing {target:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, String> {
        parse_args(args.iter().map(OsString::from))
    }

    #[test]
    fn args() {
        let a = parse(&["--id", "sb1", "--state-dir", "/run/x"]).unwrap();
        assert_eq!(a.id, "sb1");
        assert_eq!(a.state_dir, Path::new("/run/x"));
        assert_eq!(a.log_level, LevelFilter::INFO);
        let a = parse(&["--id=sb1", "--state-dir=/run/x", "--log-level=debug"]).unwrap();
        assert_eq!(a.log_level, LevelFilter::DEBUG);
        assert!(parse(&["--id", "sb1"]).unwrap_err().contains("--state-dir"));
        assert!(parse(&["--state-dir", "/x"]).unwrap_err().contains("--id"));
        assert!(parse(&["--id", "a", "--state-dir", "rel"])
            .unwrap_err()
            .contains("absolute"));
        assert!(parse(&["--id", "a/b", "--state-dir", "/x"]).is_err());
        assert!(parse(&["--id", "a", "--state-dir", "/x", "--log-level", "loud"]).is_err());
        assert!(parse(&["--id", "a", "--state-dir", "/x", "--bogus"]).is_err());
        assert!(parse(&["--id"]).unwrap_err().contains("needs a value"));
        let a = parse(&[
            "--id",
            "a",
            "--state-dir",
            "/x",
            "--cgroup",
            "/kubepods/pod1/scute-shim-a",
        ])
        .unwrap();
        assert_eq!(a.cgroup.as_deref(), Some("/kubepods/pod1/scute-shim-a"));
        assert!(parse(&["--id", "a", "--state-dir", "/x", "--cgroup", "/kubepods/../x"]).is_err());
        assert!(parse(&["--id", "a", "--state-dir", "/x", "--cgroup="]).is_err());
    }
}
