#!/usr/bin/env bash
# Every benchmark in one run: scute's figures, and beside them those of containerd 1.6 (Debian's,
# when `containerd` and `runc` are on PATH) and containerd 2.3 (../shared/tools), each with its
# CRI plugin and runc shim, and scute's ratio to each. Figures are printed, never asserted.
#
#   hack/bench.sh            daemon idle RSS and RPC latency, pull time and peak/settled RSS (200 MB,
#                            gzip and zstd; a 1 MB image), pod cycle and container cycle latency, lists with 100
#                            and 1000 objects, 110-pod density, per-pod shim RSS, streaming, then
#                            the 1000-cycle pod + container churn with its leak checks
#
# Knobs (environment): SCUTE_BENCH_PODS, SCUTE_BENCH_CONTAINERS, SCUTE_BENCH_STATS_CONTAINERS,
# SCUTE_BENCH_DENSITY_PODS, SCUTE_BENCH_LIST_OBJECTS, SCUTE_BENCH_PULLS,
# SCUTE_BENCH_PULL_COMPRESSIONS, SCUTE_BENCH_SMALL_PULLS, SCUTE_BENCH_CALLS, SCUTE_BENCH_STREAMING (see each bench's
# header), SCUTE_CHURN_CYCLES (default 1000 here; the CI test runs fewer), SCUTE_BENCH_ANCHORS=none
# (scute alone, for a before/after check of a change). Needs root, like the
# tests. A whole run takes about 30 minutes here.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"

if [[ $(id -u) -ne 0 ]]; then
	echo "bench.sh: must run as root (namespaces, mounts, cgroups)" >&2
	exit 1
fi
hack/setup.sh

# The anchors, each measured beside scute when found: Debian's containerd 1.6 (apt-get install
# containerd runc: not installed here, as it enables a system service) and containerd 2.3 from
# ../shared/tools (unpacked into the tools cache; it uses Debian's runc too).
if command -v containerd >/dev/null 2>&1 && command -v runc >/dev/null 2>&1; then
	echo "bench.sh: containerd $(containerd --version | awk '{print $3}') found" >&2
else
	echo "bench.sh: containerd or runc not on PATH (apt-get install containerd runc): no containerd 1.6 figures" >&2
fi
install=$repo_root/../shared/tools/install.sh
if [[ -z ${SCUTE_TEST_TOOLS:-} && -x $install ]]; then
	SCUTE_TEST_TOOLS=$("$install" /var/cache/scute-test-tools containerd2 containerd2-shim-runc-v2 crictl) || SCUTE_TEST_TOOLS=""
fi
if [[ -n ${SCUTE_TEST_TOOLS:-} && -x $SCUTE_TEST_TOOLS/containerd2 ]]; then
	export SCUTE_TEST_TOOLS
	echo "bench.sh: containerd $("$SCUTE_TEST_TOOLS/containerd2" --version | awk '{print $3}') found in $SCUTE_TEST_TOOLS" >&2
else
	echo "bench.sh: no containerd2 (../shared/tools is not beside this checkout): no containerd 2.3 figures" >&2
fi

# Built with the shim, as hack/run.sh and hack/package.sh build it: the same features, so the
# same daemon binary; laid out as a release package is when hack/orderfile.sh has made
# target/layout/scute.order for this code.
layout=$PWD/target/layout/scute.order
if [[ -f $layout ]]; then
	export SCUTE_LAYOUT=$layout
	cargo bench --locked -p scute -p scute-shim --no-run >/dev/null
	python3 hack/orderfile.py coverage target/release/scute "$layout"
else
	echo "bench.sh: no $layout: the daemon is measured without its layout (hack/orderfile.sh makes it, as before a release)" >&2
	cargo bench --locked -p scute -p scute-shim --no-run >/dev/null
fi
for bench in daemon pull sandbox containers streaming; do
	printf '\n==> cargo bench -p scute -p scute-shim --bench %s\n' "$bench"
	cargo bench --locked -p scute -p scute-shim --bench "$bench"
done

printf '\n==> churn: %s pod + container create/start/stop/remove cycles (leaks and RSS)\n' "${SCUTE_CHURN_CYCLES:-1000}"
SCUTE_CHURN_CYCLES=${SCUTE_CHURN_CYCLES:-1000} \
	cargo test --locked --release -p scute -p scute-shim --test robustness churn -- --nocapture --test-threads 1
