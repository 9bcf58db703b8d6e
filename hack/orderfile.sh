#!/usr/bin/env bash
# Writes the daemon's order file: its functions a node runs, for the linker to lay out side by
# side (build.rs passes the file named by SCUTE_LAYOUT to lld's --symbol-ordering-file).
#
#   hack/orderfile.sh [OUT]            (default target/layout/scute.order)
#
# hack/package.sh (release) and hack/bench.sh link the daemon with target/layout/scute.order
# when it exists: run this first when making a release or measuring memory. The file is made
# where it is used, not kept in the repository: its names carry hashes that change with the
# code (below), so a committed file went stale with every change and nothing noticed.
#
# Why: the kernel maps a binary's text 64 KiB around each page fault, and the ~2 MB of
# functions a daemon runs (start, idle, pulls, pods, containers, exec, stats, lists) lie spread
# over its 17 MB of text: left where rustc and lld put them they keep ~9 MB of it resident.
# Grouped, the same functions fill a few MB.
#
# How: a uprobe on the entry of every function of target/release/scute counts its calls while
# the benchmarks (scute only, small sizes) run that binary; every function called at least
# once goes in the file, in the order of the binary that was profiled. No maintained tool
# records which functions a Rust binary ran without rebuilding it (valgrind stops at openat2,
# which the unpacker needs), hence this script.
#
# The names are mangled symbols. Their hashes change when a dependency's version or features
# change, and features depend on what is built together: the file fits `cargo build --release
# -p scute -p scute-shim` (hack/run.sh, hack/package.sh, critest/run.sh) and `cargo bench -p
# scute -p scute-shim` (hack/bench.sh), which build the same daemon; a plain `cargo build
# --release` unifies fewer features. About a sixth of the names also carry the `.llvm.<hash>`
# that ThinLTO gives a local function it promotes, and that hash follows the code of its
# codegen unit: a small change to the daemon made 451 of them stale (idle RSS 12.7 -> 14.0
# MiB). A stale file only lays out less well: the linker ignores names it does not know. The
# script, hack/package.sh and hack/bench.sh print how many of the file's names the binary has.
#
# Needs root (tracefs uprobes), a release build, and what the benchmarks need (CNI plugins,
# docker-registry); takes about ten minutes.
set -euo pipefail

cd "$(dirname "$0")/.."
out=${1:-target/layout/scute.order}
binary=$PWD/target/release/scute
# The binary profiled is the one built without a layout (names are the same either way but for
# the few a layout itself moves); the benchmarks below build it the same way.
unset SCUTE_LAYOUT

step() { printf '\n== %s: %s\n' "$(date +%T)" "$*"; }

step "release build"
cargo build --locked --release -p scute -p scute-shim
# The benches are built now, so that their build is not traced (its output stays quiet but for errors).
cargo bench --locked -p scute -p scute-shim --no-run --quiet

tracefs=/sys/kernel/tracing
if [[ ! -w $tracefs/uprobe_events ]]; then
	tracefs=$(mktemp -d -t scute-tracefs.XXXXXX)
	mount -t tracefs none "$tracefs"
	unmount_tracefs=1
fi
group=scute_layout
work=$(mktemp -d -t scute-orderfile.XXXXXX)
cleanup() {
	echo 0 >"$tracefs/events/$group/enable" 2>/dev/null || true
	python3 hack/orderfile.py remove "$tracefs" "$group" || true
	if [[ -n ${unmount_tracefs:-} ]]; then umount "$tracefs" && rmdir "$tracefs"; fi
	rm -rf "$work"
}
trap cleanup EXIT

if [[ -f $out ]]; then
	python3 hack/orderfile.py coverage "$binary" "$out"
fi

step "a uprobe on every function of $binary"
# Probes an interrupted run left in the group would add their counts to this run's.
python3 hack/orderfile.py remove "$tracefs" "$group"
python3 hack/orderfile.py add "$tracefs" "$group" "$binary" "$work/probes"
echo 1 >"$tracefs/events/$group/enable"

# The benchmarks run scute only: a PATH without containerd.
mkdir "$work/bin"
for dir in /usr/local/sbin /usr/local/bin /usr/sbin /usr/bin /sbin /bin; do
	for tool in "$dir"/*; do
		name=${tool##*/}
		[[ $name == containerd* || -e $work/bin/$name ]] || ln -s "$tool" "$work/bin/$name"
	done
done
ln -sf "$(command -v cargo)" "$work/bin/cargo"

step "the workload: the benchmarks, scute only, small sizes"
PATH=$work/bin SCUTE_BENCH_PODS=20 SCUTE_BENCH_CONTAINERS=20 SCUTE_BENCH_STATS_CONTAINERS=5 \
	SCUTE_BENCH_DENSITY_PODS=5 SCUTE_BENCH_LIST_OBJECTS=100 SCUTE_BENCH_CALLS=200 SCUTE_BENCH_STREAMING=10 \
	SCUTE_BENCH_PULLS=1 SCUTE_BENCH_PULL_COMPRESSIONS=gzip,zstd \
	cargo bench --locked -p scute -p scute-shim --bench daemon --bench sandbox --bench containers \
	--bench streaming --bench pull

step "writing $out"
mkdir -p "${out%/*}"
python3 hack/orderfile.py write "$tracefs" "$work/probes" "$out"
