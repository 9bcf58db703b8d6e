//! pause: the process that holds a pod sandbox's namespaces open.
//!
//! Behaves like Kubernetes' pause.c: it sleeps until SIGINT or SIGTERM, then
//! exits 0. When it is PID 1 of a pod PID namespace, orphaned processes are
//! re-parented to it, so it reaps every child on SIGCHLD to keep zombies from
//! piling up. Built statically (see images/build.sh) so the image needs no libc.

use std::io::Write;

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// SIGINT / SIGTERM: the runtime asks the sandbox to stop.
extern "C" fn on_terminate(signal: libc::c_int) {
    // Only async-signal-safe calls here: write(2) and _exit(2).
    let msg: &[u8] = if signal == libc::SIGINT {
        b"pause: shutting down, got SIGINT\n"
    } else {
        b"pause: shutting down, got SIGTERM\n"
    };
    unsafe {
        libc::write(libc::STDERR_FILENO, msg.as_ptr().cast(), msg.len());
        libc::_exit(0);
    }
}

/// SIGCHLD: reap every exited child. Several exits may be coalesced into one
/// signal, hence the loop.
extern "C" fn on_child(_signal: libc::c_int) {
    // waitpid may clobber errno, which the interrupted code may be reading.
    let saved_errno = unsafe { *libc::__errno_location() };
    loop {
        let pid = unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) };
        if pid <= 0 {
            break;
        }
    }
    unsafe { *libc::__errno_location() = saved_errno };
}

fn install_handler(
    signal: libc::c_int,
    handler: extern "C" fn(libc::c_int),
    flags: libc::c_int,
) -> std::io::Result<()> {
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler as libc::sighandler_t;
        action.sa_flags = flags;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(signal, &action, std::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        None => {}
        Some("-v") | Some("--version") => {
            println!("pause.rs (scute) {VERSION}");
            return;
        }
        Some(other) => {
            eprintln!("pause: unknown argument {other:?}; usage: pause [-v]");
            std::process::exit(2);
        }
    }

    if std::process::id() != 1 {
        eprintln!("pause: warning: not running as PID 1; orphaned processes will not be reaped here");
    }

    let installed = install_handler(libc::SIGINT, on_terminate, 0)
        .and_then(|()| install_handler(libc::SIGTERM, on_terminate, 0))
        .and_then(|()| install_handler(libc::SIGCHLD, on_child, libc::SA_NOCLDSTOP | libc::SA_RESTART));
    if let Err(err) = installed {
        let _ = writeln!(std::io::stderr(), "pause: installing signal handlers: {err}");
        std::process::exit(1);
    }

    // A runtime may hand us a blocked signal mask (it is inherited across
    // exec); unblock what we handle so SIGTERM is not lost.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }

    loop {
        // Returns only after a handler ran.
        unsafe { libc::pause() };
    }
}
