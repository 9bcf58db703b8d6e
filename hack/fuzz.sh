#!/usr/bin/env bash
# Runs scute's fuzz targets (fuzz/, entries in src/fuzz.rs) with cargo fuzz and libFuzzer:
#
#   hack/fuzz.sh TARGET [SECONDS]     one target, 60 s by default (Ctrl-C stops it cleanly)
#   hack/fuzz.sh --all SECONDS        every target, SECONDS each (CI: hack/test.sh runs --all 5)
#   hack/fuzz.sh --list               the targets
#   hack/fuzz.sh --minimise [TARGET]  shrinks the kept corpus (cargo fuzz cmin), every target or one
#
# The corpus of each target is fuzz/corpus/<target>/: seeds (fuzz/seeds.py) and the inputs
# libFuzzer kept because they reached new code. A crash is copied there as crash-<hash> and the
# run fails: fix it, keep the file (`cargo test` runs every kept input through its target, see
# src/fuzz.rs), commit both. Overnight: `hack/fuzz.sh --all 3600`, then `--minimise`.
#
# The toolchain: cargo fuzz needs nightly's -Z flags (the sanitizer, libFuzzer's coverage
# passes); this machine has one stable toolchain and can fetch no other. RUSTC_BOOTSTRAP=1 lets
# that stable compiler take them, and its sysroot ships the AddressSanitizer runtime, so targets
# run under ASan with debug assertions on. cargo-fuzz itself comes from crates.io (installed on
# first use).
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root/fuzz"
export RUSTC_BOOTSTRAP=1

die() {
	echo "fuzz.sh: $*" >&2
	exit 1
}

if ! command -v cargo-fuzz >/dev/null; then
	echo "fuzz.sh: installing cargo-fuzz from crates.io" >&2
	cargo install --locked cargo-fuzz >&2
fi

targets() { sed -n 's/^name = "\(.*\)"$/\1/p' Cargo.toml | grep -v '^scute-fuzz$'; }

build() {
	local started=$SECONDS
	# -O: release with debug assertions, as cargo fuzz recommends; ASan (its default sanitizer).
	cargo fuzz build -O --debug-assertions "$@" >&2
	echo "fuzz.sh: built in $((SECONDS - started)) s" >&2
}

# run TARGET SECONDS: prints "TARGET runs execs/s corpus" and fails on a crash.
run() {
	local target=$1 seconds=$2 corpus=corpus/$1 log
	[[ -d $corpus ]] || die "no corpus dir $corpus (fuzz/seeds.py writes the seeds)"
	log=$(mktemp -t "scute-fuzz-$target.XXXXXX")
	local status=0
	# -rss_limit_mb: a parser that holds more than 2 GiB for any input is a finding too.
	# -timeout: one input taking over 10 s is a hang. New inputs go into the corpus dir.
	cargo fuzz run -O --debug-assertions "$target" "$corpus" -- \
		-max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -max_len=1048576 \
		-print_final_stats=1 >"$log" 2>&1 || status=$?
	local runs
	runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
	if ((status != 0)); then
		tail -n 60 "$log" >&2
		local crash
		for crash in artifacts/"$target"/*; do
			[[ -f $crash ]] || continue
			cp "$crash" "$corpus/$(basename "$crash")"
			echo "fuzz.sh: $target: kept $corpus/$(basename "$crash") (a regression input now)" >&2
		done
		rm -f "$log"
		return 1
	fi
	printf '%-20s %10s runs in %4d s, corpus %5d files\n' "$target" "${runs:-?}" "$seconds" "$(find "$corpus" -type f | wc -l)"
	rm -f "$log"
}

case ${1:-} in
--list) targets ;;
--all)
	seconds=${2:-5}
	build
	failed=()
	for t in $(targets); do
		run "$t" "$seconds" || failed+=("$t")
	done
	((${#failed[@]} == 0)) || die "crashes in: ${failed[*]}"
	;;
--minimise)
	for t in ${2:-$(targets)}; do
		before=$(find "corpus/$t" -type f | wc -l)
		cargo fuzz cmin -O --debug-assertions "$t" "corpus/$t" >/dev/null 2>&1
		echo "fuzz.sh: $t: $before -> $(find "corpus/$t" -type f | wc -l) files" >&2
	done
	;;
"" | -h | --help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' && exit 2 ;;
*)
	targets | grep -qx "$1" || die "no target $1 (hack/fuzz.sh --list)"
	build "$1"
	run "$1" "${2:-60}"
	;;
esac
