#!/usr/bin/env bash
# Runs Kubernetes' Conformance suite (e2e.test v1.36.2 from ../shared/tools) against the cluster
# hack/cluster.sh started, and prints "N passed, M failed, K skipped" with every skip and its
# reason.
#
#   hack/conformance.sh [--ci] [--procs N] [--focus REGEX]
#       (default)     every [Conformance] spec of this version (../shared/tools/
#                     conformance-specs.txt) but those hack/conformance/skip.txt names
#       --ci          only the specs hack/conformance/ci.txt selects: what touches the runtime
#                     (pods, containers, probes, hooks, exec/logs/port-forward, the kubelet's
#                     volumes, Services reaching pods, DNS), the cluster stage of hack/test.sh
#       --focus RE    only the selected specs matching RE (Go/RE2 syntax)
#       --procs N     parallel e2e.test processes (default 4)
#
# Parallel runs: the suite's own parallel mode needs the ginkgo CLI as its coordinator, which is
# not among the field's tools; instead the selected specs are dealt to N e2e.test processes,
# each focused on its own share, and the [Serial] ones run alone after them. Reports (JUnit per
# process, the suite's output) go to target/conformance/<date>/; the summary to summary.txt there.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
shared=$repo_root/../shared/tools
mode=all
procs=4
focus=""
while (($#)); do
	case $1 in
	--ci) mode=ci && shift ;;
	--procs) procs=${2:?} && shift 2 ;;
	--focus) focus=${2:?} && shift 2 ;;
	*)
		sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//' >&2
		exit 2
		;;
	esac
done

log() { echo "conformance.sh: $*" >&2; }
die() {
	log "$*"
	exit 1
}

[[ -f $shared/conformance-specs.txt ]] || die "the suite comes from ../shared/tools (e2e.test, conformance-specs.txt), which is not beside this checkout"
tools=${SCUTE_TEST_TOOLS:-}
[[ -n $tools && -x $tools/e2e.test ]] || tools=$("$shared/install.sh" /var/cache/scute-test-tools e2e.test kubectl)
# The suite runs `kubectl` from PATH: this version's, not whatever the host has.
export PATH=$tools:$PATH
kubeconfig=${KUBECONFIG:-$("$repo_root/hack/cluster.sh" kubeconfig)}
[[ -f $kubeconfig ]] || die "no cluster: $kubeconfig is missing (hack/cluster.sh up)"
"$tools/kubectl" --kubeconfig "$kubeconfig" get nodes >/dev/null || die "the cluster does not answer (hack/cluster.sh status)"

out=$repo_root/target/conformance/$(date +%Y%m%d-%H%M%S)
mkdir -p "$out"

# The selection: (name, shard or "serial") per spec, and the skips with their reasons.
python3 - "$shared/conformance-specs.txt" "$repo_root/hack/conformance/skip.txt" "$repo_root/hack/conformance/ci.txt" \
	"$mode" "$focus" "$procs" "$out" <<'PY'
import re, sys
specs_file, skip_file, ci_file, mode, focus, procs, out = sys.argv[1:]
procs = int(procs)

def rules(path):
    """Lines 'REGEX  # reason'; blank and comment lines skipped."""
    found = []
    for line in open(path):
        line = line.rstrip("\n")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        regex, _, reason = line.partition("  #")
        found.append((re.compile(regex.strip()), reason.strip()))
    return found

specs = [l.rstrip("\n") for l in open(specs_file) if l.strip() and not l.startswith("#")]
skips = rules(skip_file)
chosen = specs
if mode == "ci":
    ci = rules(ci_file)
    chosen = [s for s in specs if any(r.search(s) for r, _ in ci)]
if focus:
    chosen = [s for s in chosen if re.search(focus, s)]
run, skipped = [], []
for s in chosen:
    reason = next((why for r, why in skips if r.search(s)), None)
    (skipped.append((s, reason)) if reason else run.append(s))

def go_quote(text):
    # RE2 escapes for the punctuation in spec names (Python's re.escape also escapes spaces,
    # which RE2 refuses).
    return re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", text)

serial = [s for s in run if "[Serial]" in s or "[Disruptive]" in s]
parallel = [s for s in run if s not in serial]
shards = [parallel[i::procs] for i in range(procs)]
with open(f"{out}/selected.txt", "w") as f:
    f.write("\n".join(run) + "\n")
with open(f"{out}/skipped.txt", "w") as f:
    for s, why in skipped:
        f.write(f"{s}\t{why}\n")
for i, shard in enumerate(shards + [serial]):
    name = "serial" if i == len(shards) else f"shard-{i + 1}"
    if shard:
        with open(f"{out}/{name}.focus", "w") as f:
            # Ginkgo matches the focus against the spec's text followed by its labels.
            f.write("(" + "|".join(go_quote(s) for s in shard) + ")( |$)")
        with open(f"{out}/{name}.specs", "w") as f:
            f.write("\n".join(shard) + "\n")
print(f"conformance.sh: {len(run)} specs to run ({len(parallel)} in {procs} processes, {len(serial)} serial), {len(skipped)} skipped by hack/conformance/skip.txt", file=sys.stderr)
PY

run_suite() {
	local name=$1
	[[ -f $out/$name.focus ]] || return 0
	mkdir -p "$out/$name"
	"$tools/e2e.test" --kubeconfig="$kubeconfig" --provider=skeleton --report-dir="$out/$name" \
		--ginkgo.focus="$(cat "$out/$name.focus")" --ginkgo.no-color --ginkgo.timeout=24h \
		--ginkgo.junit-report="$out/$name/junit.xml" --allowed-not-ready-nodes=0 \
		--dump-logs-on-failure=false >"$out/$name.log" 2>&1
}

started=$SECONDS
pids=()
for ((i = 1; i <= procs; i++)); do
	run_suite "shard-$i" &
	pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
log "parallel specs done in $((SECONDS - started)) s"
run_suite serial || status=1

python3 - "$out" "$((SECONDS - started))" <<'PY' | tee "$out/summary.txt"
import glob, os, sys, xml.etree.ElementTree as ET
out, seconds = sys.argv[1], sys.argv[2]
# Each spec ran in exactly one process: read its result from that process's report only (every
# report also lists the suite's other specs, as skipped).
results = {}
for specs in glob.glob(f"{out}/*.specs"):
    name = os.path.basename(specs)[:-len(".specs")]
    mine = [l.rstrip("\n") for l in open(specs) if l.strip()]
    cases = {}
    junit = f"{out}/{name}/junit.xml"
    if os.path.exists(junit):
        for case in ET.parse(junit).iter("testcase"):
            cases[case.get("name", "")] = case.get("status", "")
    for spec in mine:
        # Ginkgo names a case "[It] <text> [<labels>]".
        status = next((st for n, st in cases.items() if n == f"[It] {spec}" or n.startswith(f"[It] {spec} [")), None)
        results[spec] = status or "no result"
by = lambda st: sorted(s for s, r in results.items() if r == st)
passed, failed, skipped_at_run = by("passed"), [s for s, r in results.items() if r in ("failed", "panicked", "timedout", "interrupted", "aborted")], by("skipped")
other = sorted(s for s, r in results.items() if s not in passed and s not in failed and s not in skipped_at_run)
skips = [l.rstrip("\n").split("\t") for l in open(f"{out}/skipped.txt") if l.strip()]
print(f"{len(passed)} passed, {len(failed)} failed, {len(skips) + len(skipped_at_run)} skipped"
      f" ({len(results)} run in {seconds} s; reports in {out})")
for s in sorted(failed):
    print(f"FAILED   {s}")
for s in other:
    print(f"NO RESULT {s}  ({results[s]}: see the logs)")
for s in skipped_at_run:
    print(f"SKIPPED  {s}  (by the suite itself at run time)")
for s, why in skips:
    print(f"SKIPPED  {s}  ({why})")
sys.exit(1 if failed or other or not passed else 0)
PY
summary_status=${PIPESTATUS[0]}
((summary_status == 0 && status == 0))
