//! scute-shim: the per-pod supervisor (one process per pod sandbox).
//!
//! Not built out yet: the pod-sandbox issue gives it its job (daemonize, child subreaper,
//! run pause and the pod's containers through libcontainer, write CRI logs, record exits,
//! serve proto/shim over a unix socket). Until then it refuses to run so nobody mistakes it
//! for a working shim.
fn main() {
    eprintln!("scute-shim: not implemented yet (pod sandboxes are tracked in the sandbox issue)");
    std::process::exit(2);
}
