// 1. Compiles proto/runtime/v1/api.proto (CRI v1) into tonic server and client code. protoc comes
//    from protoc-bin-vendored so a fresh machine needs no system protobuf package.
//    proto/shim/v1/shim.proto (daemon <-> scute-shim) becomes messages only;
//    proto/deviceplugin/v1beta1/api.proto (the kubelet's) is for the tests' device plugin;
//    proto/scute/admin/v1/admin.proto is scute's operator API (`scute pulls`).
// 2. Builds the static pause binary (images/pause) that the daemon embeds as its pause image, so
//    a node can run pods with no registry at all. It is built by a nested cargo into its own
//    target dir (no lock shared with this build), with crt-static for this target only.
use std::path::PathBuf;
use std::process::Command;

/// How the daemon's binary is laid out, to keep less of it resident.
fn link_layout() {
    // Relative relocations packed (DT_RELR, glibc 2.36+): the PIE daemon's 0.9 MB of RELA
    // entries, each read at every start, become a few KB.
    println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    // The functions a node runs side by side: the kernel maps text 64 KiB around each fault, so
    // spread over the whole text they keep most of it resident. SCUTE_LAYOUT names the order file
    // hack/orderfile.sh made for this very code (hack/package.sh and hack/bench.sh pass it): its
    // names carry hashes that change with the code, so it is made where it is used, not kept.
    // lld's option, and rustc links x86_64-unknown-linux-gnu with its own lld.
    println!("cargo:rerun-if-env-changed=SCUTE_LAYOUT");
    let Some(order) = std::env::var_os("SCUTE_LAYOUT").map(PathBuf::from) else {
        return;
    };
    println!("cargo:rerun-if-changed={}", order.display());
    if order.is_file() && std::env::var("TARGET").is_ok_and(|t| t == "x86_64-unknown-linux-gnu") {
        println!(
            "cargo:rustc-link-arg-bin=scute=-Wl,--symbol-ordering-file={}",
            order.display()
        );
        // Names the binary no longer has (a dependency updated) only lay out less well.
        println!("cargo:rustc-link-arg-bin=scute=-Wl,--no-warn-symbol-ordering");
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    }
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(&["proto/runtime/v1/api.proto"], &["proto"])?;
    // scute's operator API (`scute pulls`), served beside CRI on the same socket.
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(&["proto/scute/admin/v1/admin.proto"], &["proto"])?;
    // The kubelet's device plugin API, for the tests' device plugin (tests/common/device_plugin.rs).
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(&["proto/deviceplugin/v1beta1/api.proto"], &["proto"])?;
    // The daemon <-> shim protocol: messages only (framed by src/shim_client, not gRPC).
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(false)
        .compile_protos(&["proto/shim/v1/shim.proto"], &["proto"])?;

    link_layout();
    build_identity();
    build_pause()?;
    Ok(())
}

/// The commit and date `scute --version` and `crictl info` show (VersionResponse keeps the plain
/// semver: the kubelet shows it as the node's runtime version). Outside a git checkout (a source
/// tarball) the commit is "unknown". The date is SOURCE_DATE_EPOCH's when set (reproducible
/// builds), else the commit's, so every build of one commit reports the same.
fn build_identity() {
    let run = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
            .filter(|s| !s.is_empty())
    };
    let commit = run("git", &["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let epoch = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .or_else(|| run("git", &["log", "-1", "--format=%ct"]));
    let date = epoch
        .and_then(|secs| run("date", &["-u", "-d", &format!("@{secs}"), "+%Y-%m-%d"]))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=SCUTE_COMMIT={commit}");
    println!("cargo:rustc-env=SCUTE_COMMIT_DATE={date}");
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    // A new commit moves HEAD's branch (or HEAD itself when detached). Only files that exist are
    // named: cargo reruns a build script on every build for a missing one.
    if let Some(git_dir) = run("git", &["rev-parse", "--absolute-git-dir"]) {
        let git_dir = PathBuf::from(git_dir);
        let mut watched = vec![git_dir.join("HEAD"), git_dir.join("packed-refs")];
        if let Some(branch) = run("git", &["symbolic-ref", "-q", "HEAD"]) {
            watched.push(git_dir.join(branch));
        }
        for path in watched.iter().filter(|p| p.exists()) {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
}

fn build_pause() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=images/pause");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let target = std::env::var("TARGET")?;
    let target_dir = out_dir.join("pause-target");
    let cargo = std::env::var("CARGO")?;
    let status = Command::new(cargo)
        .args([
            "build",
            "--release",
            "--locked",
            "--offline",
            "-p",
            "scute-pause",
            "--target",
            &target,
        ])
        .arg("--target-dir")
        .arg(&target_dir)
        .env("RUSTFLAGS", "-C target-feature=+crt-static -C strip=symbols")
        // Flags of the outer build (profile, coverage, …) must not leak into the static binary.
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("CARGO_TARGET_DIR")
        .status()?;
    if !status.success() {
        return Err("building the static pause binary failed".into());
    }
    let binary = target_dir.join(&target).join("release/pause");
    println!("cargo:rustc-env=SCUTE_PAUSE_BINARY={}", binary.display());
    Ok(())
}
