//! Blocking work (a mount, an fsync, a fork) called from async code.

/// Runs `f`, which blocks, without taking one of the runtime's workers from the other
/// requests. tokio runs one worker per core (two on a small node), and under a burst of pod
/// starts a mount waits tens of milliseconds for the kernel's mount-table lock (libcontainer's
/// processes read the table several times per container), a fork waits out another process's
/// cgroup migration, a store write its fsync: with both workers inside such calls a kubelet's
/// PodSandboxStatus or ImageStatus, microseconds of work, waited 100 ms and more, and the
/// kubelet's PLEG relist, which makes those calls one pod at a time, took seconds
/// (docs/performance.md, "Through a real control plane").
///
/// On a multi-threaded runtime's worker the worker's other tasks move to a new thread while `f`
/// runs (`block_in_place`, which keeps borrowed data usable, unlike `spawn_blocking`); anywhere
/// else (a blocking thread, a current-thread runtime, no runtime) `f` just runs.
pub fn run<T>(f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    /// With both workers of a two-worker runtime inside `run`, a task spawned next is still
    /// served (the same two tasks blocking outside `run` starve it for their 10 s); `run` on a
    /// current-thread runtime does not panic.
    #[test]
    fn other_tasks_run_while_the_workers_block() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        rt.block_on(async {
            let blockers: Vec<_> = (0..2)
                .map(|_| {
                    let (release, wait) = mpsc::channel::<()>();
                    let task = tokio::spawn(async move {
                        let _ = super::run(|| wait.recv_timeout(Duration::from_secs(10)));
                    });
                    (release, task)
                })
                .collect();
            std::thread::sleep(Duration::from_millis(200));
            let (ran, served) = mpsc::channel();
            tokio::spawn(async move { ran.send(()).unwrap() });
            let served = served.recv_timeout(Duration::from_secs(5)).is_ok();
            for (release, task) in blockers {
                let _ = release.send(());
                task.await.unwrap();
            }
            assert!(served, "a task waited behind the blocking work");
        });
        let current = tokio::runtime::Builder::new_current_thread().build().unwrap();
        assert_eq!(current.block_on(async { super::run(|| 7) }), 7);
    }
}
