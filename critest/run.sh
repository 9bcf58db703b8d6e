#!/usr/bin/env bash
# Runs critest (cri-tools' CRI conformance suite) against scute.
#
#   critest/run.sh [extra critest flags...]
#
# critest is in no package registry; build it from cri-tools yourself and put it on PATH.
# Without it this script says so and exits 0. With it, the script starts a scute daemon in
# temp dirs (or uses SCUTE_ENDPOINT=unix:///path if set), runs critest with the skip list
# in critest/skip.txt (one regex per line, each with its reason), prints the pass/fail/skip
# counts and exits with critest's status.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

if ! command -v critest >/dev/null 2>&1; then
	echo "critest/run.sh: critest not on PATH; skipping the CRI conformance suite" >&2
	exit 0
fi

# Skip list: lines "regex  # reason"; blank lines and comment lines ignored.
skip=$(sed -e 's/[[:space:]]*#.*$//' -e '/^[[:space:]]*$/d' "$repo_root/critest/skip.txt" | paste -sd'|' -)

work=$(mktemp -d -t scute-critest.XXXXXX)
daemon_pid=""
cleanup() {
	if [[ -n $daemon_pid ]]; then
		kill -TERM "$daemon_pid" 2>/dev/null || true
		wait "$daemon_pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

endpoint=${SCUTE_ENDPOINT:-}
if [[ -z $endpoint ]]; then
	(cd "$repo_root" && cargo build --release --locked -p scute -p scute-shim)
	"$repo_root/target/release/scute" serve --root "$work/root" --state "$work/state" \
		--address "$work/state/scute.sock" >"$work/scute.log" 2>&1 &
	daemon_pid=$!
	for _ in $(seq 100); do [[ -S $work/state/scute.sock ]] && break; sleep 0.1; done
	[[ -S $work/state/scute.sock ]] || { cat "$work/scute.log" >&2; exit 1; }
	endpoint=unix://$work/state/scute.sock
fi

args=(--runtime-endpoint "$endpoint" --image-endpoint "$endpoint" --ginkgo.no-color)
[[ -n $skip ]] && args+=(--ginkgo.skip "$skip")
status=0
critest "${args[@]}" "$@" 2>&1 | tee "$work/critest.out" || status=$?
echo "critest/run.sh: $(grep -Eo 'Ran [0-9]+ of [0-9]+ Specs.*' "$work/critest.out" | tail -1)" >&2
grep -Eo '[0-9]+ Passed \| [0-9]+ Failed \| [0-9]+ Pending \| [0-9]+ Skipped' "$work/critest.out" | tail -1 >&2 || true
exit "$status"
