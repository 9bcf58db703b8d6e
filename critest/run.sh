#!/usr/bin/env bash
# Runs critest (cri-tools' CRI conformance suite) against scute, self-contained and offline.
#
#   critest/run.sh [extra critest flags...]        (as root)
#
# critest is in no package registry; build it from cri-tools yourself and put it on PATH (with
# crictl, used to remove the pods a failed spec leaves behind; ../shared/tools/install.sh unpacks
# both where there is a ../shared). Without critest this script says so and exits 0. With it,
# the script
#   1. builds scute and scute-shim (release; SCUTE_PROFILE=debug uses the debug build, which
#      hack/test.sh has just built and tested, and saves a release build in CI),
#   2. starts a registry on a free loopback port (hack/registry.sh) and fills it with every
#      image critest pulls (images/build.sh),
#   3. writes mirrors sending registry.k8s.io, docker.io, gcr.io, k8s.gcr.io, public.ecr.aws
#      and quay.io to that registry (hack/mirrors.sh) and a scute config using them,
#   4. starts `scute serve` with its root, state, socket and CNI config dir in a temp dir,
#   5. runs critest with critest/images.yaml and the skip list critest/skip.txt (one regex
#      per line, each with its reason), prints the pass/fail/skip counts and the failed specs,
#   6. removes every pod left (crictl rmp -fa), stops scute, kills shims it left, unmounts
#      whatever is still mounted under the temp dir, stops the registry, removes the temp dir,
# and exits with critest's status. critest's output and scute's log are kept in
# target/critest/ (CRITEST_LOGS=DIR: there instead). critest needs host ports 12000-12003 free.
#
# CRITEST_ENDPOINT=unix:///run/scute/scute.sock runs critest against a scute already serving
# there (the VM test node's, under systemd, whose mirrors point at a filled registry): steps 1-4
# are skipped and step 6 only removes the pods left.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
target_dir=${CARGO_TARGET_DIR:-$repo_root/target}

log() { echo "critest/run.sh: $*" >&2; }
die() { log "$*"; exit 1; }

if ! command -v critest >/dev/null 2>&1; then
	log "critest not on PATH; skipping the CRI conformance suite"
	exit 0
fi
[[ $(id -u) -eq 0 ]] || die "must run as root (scute creates namespaces, mounts and cgroups)"
for tool in curl ss; do
	command -v "$tool" >/dev/null || die "$tool missing; run hack/setup.sh"
done

# critest's port-mapping and port-forward specs bind these on the host.
busy=$(ss -Htln 'sport >= :12000 and sport <= :12003' || true)
[[ -z $busy ]] || die "host ports 12000-12003 must be free for critest; in use:"$'\n'"$busy"

# Skip list: lines "regex  # reason"; blank lines and comment lines ignored.
skip=$(sed -e 's/[[:space:]]*#.*$//' -e '/^[[:space:]]*$/d' "$repo_root/critest/skip.txt" | paste -sd'|' -)

# A short path: shim sockets live at <state>/shims/<64 hex id>/shim.sock, and a unix socket
# path has at most 107 bytes.
work=$(mktemp -d /tmp/sct.XXXXXX)
# mktemp makes it 0700; scute's root (0711) must be reachable for the mapped root of pods with
# their own user namespace, as under /var/lib.
chmod 0711 "$work"
logs=${CRITEST_LOGS:-$target_dir/critest}
mkdir -p "$logs"
endpoint=${CRITEST_ENDPOINT:-unix://$work/run/scute.sock}
daemon_pid=""
registry_started=0

cleanup() {
	local status=$?
	set +e
	trap - EXIT INT TERM
	if [[ -n ${CRITEST_ENDPOINT:-} ]] || { [[ -n $daemon_pid ]] && kill -0 "$daemon_pid" 2>/dev/null; }; then
		if command -v crictl >/dev/null; then
			log "removing the pods left behind"
			crictl --runtime-endpoint "$endpoint" --image-endpoint "$endpoint" --timeout 60s \
				rmp --all --force >>"$work/cleanup.log" 2>&1 ||
				log "crictl rmp -fa failed (see $logs/cleanup.log)"
		else
			log "crictl not on PATH: cannot remove leftover pods before stopping scute"
		fi
	fi
	if [[ -n $daemon_pid ]] && kill -0 "$daemon_pid" 2>/dev/null; then
		kill -TERM "$daemon_pid" 2>/dev/null
		local waited=0
		while kill -0 "$daemon_pid" 2>/dev/null && ((waited < 200)); do
			sleep 0.1
			waited=$((waited + 1))
		done
		if kill -0 "$daemon_pid" 2>/dev/null; then
			log "scute ignored SIGTERM for 20s; sending SIGKILL"
			kill -KILL "$daemon_pid" 2>/dev/null
		fi
		wait "$daemon_pid" 2>/dev/null
	fi
	# Shims this daemon started (their --state-dir is under $work) outlive it by design.
	local proc pid comm cmdline
	for proc in /proc/[0-9]*; do
		pid=${proc#/proc/}
		{ read -r comm <"$proc/comm"; } 2>/dev/null || continue
		[[ $comm == scute-shim ]] || continue
		cmdline=$(tr '\0' ' ' <"$proc/cmdline" 2>/dev/null) || continue
		if [[ $cmdline == *" $work/"* ]]; then
			log "killing leftover shim $pid ($cmdline)"
			kill -KILL "$pid" 2>/dev/null
		fi
	done
	# Anything still mounted under $work (rootfs overlays, netns pins, ...), deepest first.
	local mnt
	while read -r mnt; do
		log "unmounting leftover $mnt"
		umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null
	done < <(awk -v w="$work/" 'index($5, w) == 1 { print $5 }' /proc/self/mountinfo | sort -r)
	if ((registry_started)); then
		"$repo_root/hack/registry.sh" stop --dir "$work/registry"
	fi
	for f in scute.log critest.out junit.xml build.log cleanup.log; do
		[[ -f $work/$f ]] && cp "$work/$f" "$logs/$f"
	done
	rm -rf --one-file-system "$work"
	exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [[ -n ${CRITEST_ENDPOINT:-} ]]; then
	log "using the scute serving $CRITEST_ENDPOINT"
else
	profile=${SCUTE_PROFILE:-release}
	case $profile in
	release) build_flags=(--release) ;;
	debug) build_flags=() ;;
	*) die "SCUTE_PROFILE must be release or debug, not $profile" ;;
	esac
	log "building scute and scute-shim ($profile)"
	(cd "$repo_root" && cargo build "${build_flags[@]}" --locked -p scute -p scute-shim)

	# A free loopback port for the registry: random picks until one starts (registry.sh refuses
	# a port something answers on, and fails when docker-registry cannot bind).
	registry_addr=""
	for _ in $(seq 20); do
		port=$((20000 + RANDOM % 30000))
		[[ -z $(ss -Htln "sport = :$port") ]] || continue
		if out=$("$repo_root/hack/registry.sh" start --addr "127.0.0.1:$port" --dir "$work/registry" 2>>"$work/build.log"); then
			registry_started=1
			registry_addr=$(sed -n 's/^REGISTRY_ADDR=//p' <<<"$out")
			break
		fi
	done
	[[ -n $registry_addr ]] || die "could not start a registry (see $logs/build.log)"
	log "registry on $registry_addr; building and pushing the test images"
	"$repo_root/images/build.sh" "$registry_addr" >>"$work/build.log" 2>&1 ||
		die "images/build.sh failed (see $logs/build.log)"

	certs=$work/certs.d
	"$repo_root/hack/mirrors.sh" "$registry_addr" "$certs" 2>>"$work/build.log"
	# An empty CNI config dir: scute's embedded default bridge network.
	mkdir -p "$work/net.d"
	cat >"$work/config.toml" <<-EOF
	root = "$work/root"
	state = "$work/run"

	[grpc]
	address = "$work/run/scute.sock"

	[cni]
	conf_dir = "$work/net.d"

	[registry]
	config_path = "$certs"
	EOF

	log "starting scute"
	"$target_dir/$profile/scute" serve --config "$work/config.toml" </dev/null >"$work/scute.log" 2>&1 &
	daemon_pid=$!
	for _ in $(seq 200); do
		[[ -S $work/run/scute.sock ]] && break
		kill -0 "$daemon_pid" 2>/dev/null || break
		sleep 0.1
	done
	if [[ ! -S $work/run/scute.sock ]]; then
		cat "$work/scute.log" >&2
		die "scute did not open its socket"
	fi
fi

args=(
	--runtime-endpoint "$endpoint"
	--image-endpoint "$endpoint"
	--test-images-file "$repo_root/critest/images.yaml"
	--ginkgo.no-color
	--ginkgo.junit-report "$work/junit.xml"
)
[[ -n $skip ]] && args+=(--ginkgo.skip "$skip")
log "running critest ${args[*]} $*"
status=0
critest "${args[@]}" "$@" 2>&1 | tee "$work/critest.out" || status=$?

echo >&2
log "$(grep -Eo 'Ran [0-9]+ of [0-9]+ Specs.*' "$work/critest.out" | tail -n 1 || echo 'no summary from critest')"
grep -Eo '[0-9]+ Passed \| [0-9]+ Failed \| [0-9]+ Pending \| [0-9]+ Skipped' "$work/critest.out" | tail -n 1 >&2 || true
if grep -q '^Summarizing [0-9]* Failure' "$work/critest.out"; then
	sed -n '/^Summarizing [0-9]* Failure/,$p' "$work/critest.out" | grep -E '^\s*\[(FAIL|PANICKED|TIMEDOUT|INTERRUPTED)\]' >&2 || true
fi
# Every spec not run, from the junit report: the skip list, critest's own benchmark filter, or
# a Skip() in the spec (a feature the host lacks).
if [[ -f $work/junit.xml ]]; then
	awk '
		/<testcase / { match($0, /name="[^"]*"/); name = substr($0, RSTART + 6, RLENGTH - 7) }
		/<skipped message="/ { match($0, /message="[^"]*"/); print "  [SKIPPED] " name ": " substr($0, RSTART + 9, RLENGTH - 10) }
	' "$work/junit.xml" | sed -e 's/&#34;/"/g' -e 's/&#39;/'"'"'/g' -e 's/&amp;/\&/g' -e 's/&lt;/</g' -e 's/&gt;/>/g' >&2 || true
fi
log "critest output, junit report and scute's log: $logs/"
exit "$status"
