//! The commands the README and docs/ show do what they say. Every shell block carries a tag
//! after its language:
//!
//! - `sh runnable`: run here, with bash -euo pipefail, against a test daemon: `scute` is the
//!   built binary, `SCUTE_CONFIG` names the daemon's config, and the default socket
//!   `unix:///run/scute/scute.sock` is replaced by the daemon's. A block that calls crictl is
//!   skipped, saying so, when crictl is not installed.
//! - `sh ci=FILE[,FILE]`: CI runs these commands in FILE; each line's program and subcommand must
//!   appear together on a line of one of the files, so a renamed script or subcommand fails here.
//! - `sh manual`: not run by any test (what builds a release or starts a service for good, a
//!   kubeadm bootstrap); listed by this test so the set stays visible.
//!
//! Every `toml` block must be a configuration `scute config show` accepts.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{repo_root, which, Daemon};

const DEFAULT_SOCKET: &str = "unix:///run/scute/scute.sock";

#[derive(Debug)]
struct Block {
    file: String,
    line: usize,
    lang: String,
    tag: String,
    body: String,
}

fn pages() -> Vec<PathBuf> {
    let root = repo_root();
    let mut pages = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

fn blocks(page: &Path) -> Vec<Block> {
    let text = std::fs::read_to_string(page).unwrap();
    let name = page.strip_prefix(repo_root()).unwrap().display().to_string();
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in text.lines().enumerate() {
        let Some(info) = line.strip_prefix("```") else {
            if let Some(block) = open.as_mut() {
                block.body.push_str(line);
                block.body.push('\n');
            }
            continue;
        };
        match open.take() {
            Some(block) => out.push(block),
            None => {
                let mut words = info.split_whitespace();
                open = Some(Block {
                    file: name.clone(),
                    line: i + 1,
                    lang: words.next().unwrap_or("").to_string(),
                    tag: words.collect::<Vec<_>>().join(" "),
                    body: String::new(),
                });
            }
        }
    }
    assert!(open.is_none(), "{name}: a code block is not closed");
    out
}

fn all_blocks() -> Vec<Block> {
    pages().iter().flat_map(|p| blocks(p)).collect()
}

fn shell(block: &Block) -> bool {
    matches!(block.lang.as_str(), "sh" | "bash" | "shell" | "console")
}

/// The command lines of a block: comments and continuations folded away.
fn commands(body: &str) -> Vec<String> {
    body.replace("\\\n", " ")
        .lines()
        .map(|l| l.split(" #").next().unwrap().trim().to_string())
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

#[test]
fn every_shell_block_says_how_it_is_run() {
    let mut untagged = Vec::new();
    let mut manual = Vec::new();
    for block in all_blocks().iter().filter(|b| shell(b)) {
        match block.tag.as_str() {
            "runnable" => {}
            "manual" => manual.push(format!("{}:{}", block.file, block.line)),
            t if t.starts_with("ci=") => {}
            _ => untagged.push(format!("{}:{} ({:?})", block.file, block.line, block.tag)),
        }
    }
    eprintln!("shell blocks no test runs (manual): {}", manual.join(", "));
    assert!(
        untagged.is_empty(),
        "shell blocks without `runnable`, `ci=FILE` or `manual` after the language: {untagged:?}"
    );
}

#[test]
fn ci_blocks_name_commands_their_files_run() {
    let root = repo_root();
    let mut missing = Vec::new();
    let mut checked = 0;
    for block in all_blocks().iter().filter(|b| shell(b)) {
        let Some(files) = block.tag.strip_prefix("ci=") else {
            continue;
        };
        let texts: Vec<String> = files
            .split(',')
            .map(|f| {
                std::fs::read_to_string(root.join(f))
                    .unwrap_or_else(|e| panic!("{}:{}: ci={f}: {e}", block.file, block.line))
            })
            .collect();
        for line in commands(&block.body) {
            // `export X=$(prog sub)` names prog sub; `a && b` is checked as a and b.
            let line = line.split("$(").last().unwrap().replace(')', " ");
            for command in line.split("&&").map(str::trim) {
                let words: Vec<&str> = command
                    .split_whitespace()
                    .filter(|w| !w.contains('=') || w.starts_with('-'))
                    .collect();
                let program = words[0];
                let sub = words.get(1).filter(|w| !w.starts_with('-') && !w.contains('/'));
                let found = texts.iter().any(|t| {
                    t.lines().any(|l| {
                        l.contains(program)
                            && sub.is_none_or(|s| l.split(|c: char| !c.is_alphanumeric() && c != '-').any(|w| w == *s))
                    })
                });
                checked += 1;
                if !found {
                    missing.push(format!("{}:{}: `{command}` in {files}", block.file, block.line));
                }
            }
        }
    }
    assert!(
        checked > 5,
        "only {checked} commands checked: the pages lost their ci= blocks"
    );
    assert!(
        missing.is_empty(),
        "commands the docs say CI runs, not found there: {missing:#?}"
    );
}

#[test]
fn toml_blocks_are_configurations_scute_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for block in all_blocks().iter().filter(|b| b.lang == "toml") {
        let path = dir.path().join("config.toml");
        std::fs::write(&path, &block.body).unwrap();
        let (code, _, stderr) = common::scute(&["config", "show", "--config", path.to_str().unwrap()]);
        assert_eq!(
            code, 0,
            "{}:{}: scute config show refuses it: {stderr}",
            block.file, block.line
        );
        checked += 1;
    }
    assert!(checked >= 2, "no toml block found in the docs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runnable_blocks_run_against_a_daemon() {
    // Debug logs name every RPC: the check below that the commands reached this daemon.
    let daemon = Daemon::start("[log]\nlevel = \"debug\"\n");
    let bin = tempfile::tempdir().unwrap();
    let scute = repo_root().join("target/debug/scute");
    std::os::unix::fs::symlink(&scute, bin.path().join("scute")).unwrap();
    let path = format!("{}:{}", bin.path().display(), std::env::var("PATH").unwrap_or_default());
    let crictl = which("crictl");
    let socket = format!("unix://{}", daemon.socket.display());
    let mut ran = 0;
    for block in all_blocks().iter().filter(|b| shell(b) && b.tag == "runnable") {
        if crictl.is_none() && block.body.contains("crictl") {
            eprintln!("SKIP {}:{}: crictl not on PATH", block.file, block.line);
            continue;
        }
        let script = block.body.replace(DEFAULT_SOCKET, &socket);
        let out = Command::new("bash")
            .args(["-euo", "pipefail", "-c", &script])
            .current_dir(repo_root())
            .env("PATH", &path)
            .env("SCUTE_CONFIG", &daemon.config_path)
            .env("CONTAINER_RUNTIME_ENDPOINT", &socket)
            .env("IMAGE_SERVICE_ENDPOINT", &socket)
            .output()
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(
            out.status.success(),
            "{}:{}: exited {:?}\n{script}\nstdout:\n{stdout}\nstderr:\n{stderr}",
            block.file,
            block.line,
            out.status.code()
        );
        eprintln!("ran {}:{} ({} bytes of output)", block.file, block.line, stdout.len());
        ran += 1;
    }
    assert!(ran >= 2, "only {ran} runnable blocks ran");
    // The commands talked to this daemon, not to one at the default socket.
    let log = daemon.log();
    for method in ["ListPulls", "Doctor"] {
        assert!(log.contains(method), "no {method} call reached the test daemon:\n{log}");
    }
    if crictl.is_some() {
        assert!(
            log.contains("Version"),
            "no Version call from crictl reached the test daemon"
        );
    }
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[test]
fn links_between_pages_resolve_to_a_file_and_heading() {
    let root = repo_root();
    let mut pages = pages();
    pages.push(root.join("CHANGELOG.md"));
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        // Markdown links `[text](target)`; targets in this project hold no spaces or parentheses.
        for piece in text.split("](").skip(1) {
            let Some(target) = piece.split(')').next().filter(|t| !t.contains(char::is_whitespace)) else {
                continue;
            };
            if target.starts_with("http://") || target.starts_with("https://") {
                continue;
            }
            let (file, fragment) = target.split_once('#').unwrap_or((target, ""));
            let path = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            checked += 1;
            let Ok(linked) = std::fs::read_to_string(&path) else {
                broken.push(format!("{}: {target}: no such file", page.display()));
                continue;
            };
            if !fragment.is_empty()
                && !linked
                    .lines()
                    .filter_map(|l| l.strip_prefix('#'))
                    .any(|h| anchor(h.trim_start_matches('#')) == fragment)
            {
                broken.push(format!("{}: {target}: no such heading", page.display()));
            }
        }
    }
    assert!(checked > 20, "only {checked} links found");
    assert!(broken.is_empty(), "broken links: {broken:#?}");
}

/// The version the binaries carry is a release CHANGELOG.md describes, and the package's Debian
/// changelog (hack/changelog.py, what hack/package.sh installs) starts with it.
#[test]
fn the_version_has_a_changelog_section_the_package_carries() {
    let version = env!("CARGO_PKG_VERSION");
    let script = repo_root().join("hack/changelog.py");
    let check = Command::new("python3")
        .arg(&script)
        .args(["check", version])
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    let debian = Command::new("python3")
        .arg(&script)
        .args([
            "debian",
            version,
            "0000000",
            "Sat, 28 Nov 2026 00:00:00 +0000",
            "t <t@example.org>",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8(debian.stdout).unwrap();
    assert!(
        text.starts_with(&format!("scute ({version}) unstable; urgency=medium\n\n  * ")),
        "{text}"
    );
    assert!(text.lines().all(|l| l.len() <= 80), "a line over 80 columns:\n{text}");
    let between = Command::new("python3")
        .arg(&script)
        .args([
            "debian",
            &format!("{version}+vm1"),
            "abc1234",
            "Sat, 28 Nov 2026 00:00:00 +0000",
            "t <t@example.org>",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8(between.stdout).unwrap();
    assert!(text.starts_with(&format!("scute ({version}+vm1) unstable")), "{text}");
    assert!(text.contains("Built from commit abc1234"), "{text}");
    assert!(text.contains(&format!("\nscute ({version}) unstable")), "{text}");
}
