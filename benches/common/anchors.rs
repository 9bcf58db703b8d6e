// The containerd releases the benchmarks measure beside scute, and their configs. Included
// (`include!`) by every benchmark, as harness.rs is, so each stays one binary with its own `use`
// list; it needs `std::path::{Path, PathBuf}`, `std::process::Command` and
// `std::time::Duration` in scope.

/// A containerd measured beside scute, with the CRI plugin and the runc shim: Debian's 1.6 from
/// PATH, and 2.3 from `../shared/tools` (`containerd2` and `containerd2-shim-runc-v2`, renamed so
/// they never shadow Debian's), found in `SCUTE_TEST_TOOLS` (hack/bench.sh installs them there).
/// Both run Debian's runc.
struct Anchor {
    /// The row's name: "containerd 1.6", "containerd 2.3".
    label: String,
    /// `containerd --version`'s version, for the header.
    version: String,
    bin: PathBuf,
    /// 2.x: the shim binary the CRI runtime is given (`runtime_path`); 1.6 finds its
    /// `containerd-shim-runc-v2` on PATH.
    shim: Option<PathBuf>,
}

impl Anchor {
    fn modern(&self) -> bool {
        self.shim.is_some()
    }
}

/// The anchors on this machine, each said once; what is missing is said too.
fn anchors() -> Vec<Anchor> {
    let mut found = Vec::new();
    // For a before/after check of scute alone (same bench binary, another scute binary).
    if std::env::var("SCUTE_BENCH_ANCHORS").as_deref() == Ok("none") {
        println!("(SCUTE_BENCH_ANCHORS=none: scute only, no containerd figures)");
        return found;
    }
    let runc = which("runc");
    match (which("containerd"), which("containerd-shim-runc-v2"), &runc) {
        (Some(bin), Some(_), Some(_)) => found.extend(anchor(bin, None)),
        (None, _, _) => println!("(containerd not on PATH: no containerd 1.6 figures)"),
        (Some(_), None, _) => println!("(containerd-shim-runc-v2 not on PATH: no containerd 1.6 figures)"),
        (Some(_), _, None) => println!("(runc not on PATH: no containerd figures)"),
    }
    let tools = std::env::var_os("SCUTE_TEST_TOOLS").map(PathBuf::from);
    match tools {
        Some(dir) if dir.join("containerd2").is_file() && dir.join("containerd2-shim-runc-v2").is_file() => {
            if runc.is_some() {
                found.extend(anchor(dir.join("containerd2"), Some(dir.join("containerd2-shim-runc-v2"))));
            }
        }
        Some(dir) => println!(
            "(no containerd2 in SCUTE_TEST_TOOLS={}: ../shared/tools/install.sh {} containerd2 containerd2-shim-runc-v2; \
             no containerd 2.3 figures)",
            dir.display(),
            dir.display()
        ),
        None => println!("(SCUTE_TEST_TOOLS not set, as hack/bench.sh sets it: no containerd 2.3 figures)"),
    }
    for a in &found {
        println!("anchor: {} {} ({})", a.label, a.version, a.bin.display());
    }
    found
}

fn anchor(bin: PathBuf, shim: Option<PathBuf>) -> Option<Anchor> {
    // "containerd github.com/containerd/containerd v1.6.20~ds1 1.6.20~ds1-1+b1" or
    // "containerd github.com/containerd/containerd/v2 v2.3.4 <commit>"
    let out = Command::new(&bin).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let version = text.split_whitespace().nth(2)?.trim_start_matches('v').to_string();
    let minor: Vec<&str> = version.split(['.', '~', '-']).take(2).collect();
    Some(Anchor {
        label: format!("containerd {}", minor.join(".")),
        version,
        bin,
        shim,
    })
}

/// What the CRI plugin needs beyond a daemon's own dirs (none, for the daemon benchmark).
#[derive(Default)]
struct CriSettings<'a> {
    /// The CNI conf dir (the plugins are Debian's, in /usr/lib/cni).
    net: Option<&'a Path>,
    /// hosts.toml's dir (`config_path`).
    certs: Option<&'a Path>,
    /// The pod sandbox image.
    pause: Option<String>,
}

/// The config of `anchor` with its root, state, socket and (2.x) shims' sockets and runc's
/// root under `dir`, so nothing of it is outside `dir` but the pods' network namespaces.
fn containerd_config(anchor: &Anchor, dir: &Path, socket: &Path, cri: &CriSettings) -> String {
    let root = dir.join("root");
    let state = dir.join("state");
    // What neither release needs here, and each one's own.
    let unused = [
        "io.containerd.snapshotter.v1.btrfs",
        "io.containerd.snapshotter.v1.devmapper",
        "io.containerd.snapshotter.v1.zfs",
        "io.containerd.tracing.processor.v1.otlp",
        "io.containerd.internal.v1.tracing",
    ];
    let own: &[&str] = if anchor.modern() {
        &["io.containerd.nri.v1.nri"]
    } else {
        &["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs"]
    };
    let disabled = format!("{:?}", own.iter().chain(&unused).collect::<Vec<_>>());
    if !anchor.modern() {
        let mut text = format!(
            r#"version = 2
root = {root:?}
state = {state:?}
# Nothing here needs these; "opt" would otherwise install into /opt/containerd.
disabled_plugins = {disabled}

[grpc]
  address = {socket:?}

[plugins."io.containerd.grpc.v1.cri"]
  # Pause would get oom_score_adj -998, which runc fails to set without CAP_SYS_RESOURCE (as in a
  # container); scute clamps it to its own score the same way.
  restrict_oom_score_adj = true
"#
        );
        if let Some(pause) = &cri.pause {
            text += &format!("  sandbox_image = {pause:?}\n");
        }
        if let Some(net) = cri.net {
            text += &format!("\n[plugins.\"io.containerd.grpc.v1.cri\".cni]\n  bin_dir = \"/usr/lib/cni\"\n  conf_dir = {net:?}\n");
        }
        if let Some(certs) = cri.certs {
            text += &format!("\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = {certs:?}\n");
        }
        return text;
    }
    // 2.x (config version 3): the README of ../shared/tools says what this host needs.
    let shim = anchor.shim.as_deref().unwrap();
    let shims = dir.join("shims");
    let runc_root = dir.join("runc");
    let mut text = format!(
        r#"version = 3
root = {root:?}
state = {state:?}
# NRI's socket is host-wide; the rest is not used here.
disabled_plugins = {disabled}

[grpc]
  address = {socket:?}

[ttrpc]
  address = "{socket}.ttrpc"

[plugins."io.containerd.shim.v1.manager"]
  socket_dir = {shims:?}

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  disable_hugetlb_controller = true

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  runtime_path = {shim:?}

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  Root = {runc_root:?}
"#,
        socket = socket.display(),
    );
    if let Some(net) = cri.net {
        text += &format!(
            "\n[plugins.\"io.containerd.cri.v1.runtime\".cni]\n  bin_dirs = [\"/usr/lib/cni\"]\n  conf_dir = {net:?}\n"
        );
    }
    if let Some(certs) = cri.certs {
        text += &format!("\n[plugins.\"io.containerd.cri.v1.images\".registry]\n  config_path = {certs:?}\n");
    }
    if let Some(pause) = &cri.pause {
        text += &format!("\n[plugins.\"io.containerd.cri.v1.images\".pinned_images]\n  sandbox = {pause:?}\n");
    }
    text
}

/// A KiB figure of a /proc file's `Name: value kB` lines (status, smaps_rollup); 0 when absent.
fn kib_field(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// One field of /proc/<pid>/<file>, in KiB.
#[allow(dead_code)] // the daemon benchmark reads whole smaps_rollup only
fn proc_kib(pid: u32, file: &str, field: &str) -> u64 {
    kib_field(&std::fs::read_to_string(format!("/proc/{pid}/{file}")).unwrap_or_default(), field)
}

/// Resident, anonymous (what the node cannot reclaim) and proportional set sizes, in KiB.
#[derive(Clone, Copy)]
#[allow(dead_code)] // the benchmarks that take RSS from status read only anon and pss
struct Memory {
    rss: u64,
    anon: u64,
    pss: u64,
}

/// A process's memory from one read of /proc/<pid>/smaps_rollup.
#[allow(dead_code)] // the pull and streaming benchmarks report RSS alone
fn memory(pid: u32) -> Memory {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    Memory {
        rss: kib_field(&rollup, "Rss"),
        anon: kib_field(&rollup, "Anonymous"),
        pss: kib_field(&rollup, "Pss"),
    }
}

#[allow(dead_code)] // not every benchmark compares durations
fn mean(samples: &[Duration]) -> Duration {
    samples.iter().sum::<Duration>() / samples.len().max(1) as u32
}

/// "what: scute X ms; containerd 1.6 Y ms (scute Z×); ...; against the better: W×", for the rows
/// `(name, figure)` with scute's first; the better is the better anchor (rows named "scute …",
/// scute in another configuration, are shown but not compared against). Printed, never asserted.
#[allow(dead_code)]
fn print_ratios(what: &str, rows: &[(String, Duration)]) {
    let Some(((_, scute), anchors)) = rows.split_first() else { return };
    let ms = |d: &Duration| d.as_secs_f64() * 1e3;
    let mut line = format!("{what}: scute {:.1} ms", ms(scute));
    for (name, d) in anchors {
        line += &format!("; {name} {:.1} ms ({:.2}×)", ms(d), ms(scute) / ms(d));
    }
    if let Some(best) = anchors
        .iter()
        .filter(|(name, _)| !name.starts_with("scute"))
        .map(|(_, d)| *d)
        .min()
    {
        line += &format!("; scute against the better: {:.2}×", ms(scute) / ms(&best));
    }
    println!("{line}");
}
