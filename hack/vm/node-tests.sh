#!/usr/bin/env bash
# The VM test node's suites, run INSIDE the guest by `hack/vm.sh test` (systemd PID 1, pure
# cgroup v2; the repo and the field's tools are shared at their host paths; the host's registry,
# filled with the test images, is SCUTE_TEST_REGISTRY).
#
#   hack/vm/node-tests.sh [STEP...]      steps: facts service critest kubelet integration
#                                        checkpoint bench package reboot powercut (default: all,
#                                        in that order; "default" names them among others), and
#                                        kubeadm (on demand: SCUTE_VM_STEPS="facts kubeadm";
#                                        hack/test.sh: "default kubeadm" when its inputs changed),
#                                        powercut: SCUTE_VM_POWERCUT_CUTS power cuts (3; issue 40's
#                                        run: 50, SCUTE_VM_STEPS="facts powercut")
#
# A step that passed is recorded in /var/lib/scute-vm-tests and not run again: `reboot` reboots
# the guest, whose job unit then runs this script again to check what came back.
#
# scute runs as an operator installs it: the debug binaries the host just tested in
# /usr/local/bin, contrib/systemd/scute.service as is, /etc/scute/config.toml with
# cgroup_driver = "systemd". Prints each step's wall time at the end.
#
# Passed from the host by hack/vm.sh when set: SCUTE_VM_KUBELET_TESTS, SCUTE_VM_INTEGRATION and
# SCUTE_VM_CRITEST_ARGS (narrow those steps), SCUTE_VM_LOG_LEVEL (scute.service's [log] level).
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo_root"
registry=${SCUTE_TEST_REGISTRY:?SCUTE_TEST_REGISTRY (the host registry with the test images) is required}
tools=${SCUTE_TEST_TOOLS:-}
[[ -n $tools ]] && export PATH=$tools:$PATH
endpoint=unix:///run/scute/scute.sock

log() { echo "node-tests: $*" >&2; }
fail() {
	log "FAIL: $*"
	exit 1
}

state=/var/lib/scute-vm-tests
mkdir -p "$state"
step_name=""
step_start=$EPOCHSECONDS
# A step that reboots (reboot, powercut) runs again in the next boot: its start is kept on the
# guest's disk, so its time spans its boots, and its line in the timings is rewritten each boot.
step() {
	end_step
	step_name=$*
	local saved_start saved_name
	if [[ -e $state/step.start ]] && read -r saved_start saved_name <"$state/step.start" &&
		[[ $saved_name == "$step_name" ]]; then
		step_start=$saved_start
	else
		step_start=$EPOCHSECONDS
		echo "$step_start $step_name" >"$state/step.start"
	fi
	printf '\n==> [vm] %s\n' "$*" >&2
}
end_step() {
	[[ -n $step_name ]] || return 0
	{
		# Not yet there for the first step; grep's status 1 (no other line) is no error either.
		grep -vF "  [vm] $step_name" "$state/timings" 2>/dev/null || true
		printf '%6ds  [vm] %s\n' $((EPOCHSECONDS - step_start)) "$step_name"
	} >"$state/timings.new"
	mv "$state/timings.new" "$state/timings"
	step_name=""
}
print_timings() {
	end_step
	printf '\n==> [vm] where the time went\n' >&2
	cat "$state/timings" >&2
}
trap print_timings EXIT

crictl() { command crictl --runtime-endpoint "$endpoint" --image-endpoint "$endpoint" --timeout 60s "$@"; }

# The newest test binary of tests/<name>.rs that cargo built on the host.
test_binary() {
	local found
	found=$(find "$repo_root/target/debug/deps" -maxdepth 1 -type f -executable -name "$1-*" -printf '%T@ %p\n' |
		sort -rn | head -n 1 | cut -d' ' -f2)
	[[ -n $found ]] || fail "no test binary for tests/$1.rs in target/debug/deps (run cargo test --no-run on the host)"
	echo "$found"
}

# Units scute made (container scopes, shim scopes), loaded or not.
scute_units() { systemctl list-units --all --no-legend --plain 'scute-*.scope' | awk '{print $1}'; }

wait_no_scute_units() {
	for _ in $(seq 100); do
		[[ -z $(scute_units) ]] && return 0
		sleep 0.1
	done
	# What systemd thinks of each, and what it logged: a unit active with no cgroup left is one
	# whose cgroup someone removed before systemd saw it empty.
	local unit
	for unit in $(scute_units); do
		systemctl status --no-pager --full "$unit" >&2 || true
		journalctl --no-pager -o short-precise -u "$unit" >&2 || true
	done
	fail "scopes left after every pod was removed: $(scute_units | tr '\n' ' ')"
}

step_facts() {
	step "node facts"
	[[ $(cat /proc/1/comm) == systemd ]] || fail "PID 1 is $(cat /proc/1/comm), not systemd"
	[[ $(stat -fc %T /sys/fs/cgroup) == cgroup2fs ]] || fail "/sys/fs/cgroup is not cgroup v2 only"
	log "PID 1 systemd $(systemctl --version | head -n 1 | awk '{print $2}'), cgroup v2 ($(cat /sys/fs/cgroup/cgroup.controllers)), kernel $(uname -r)"
}

install_scute() {
	install -m 0755 target/debug/scute target/debug/scute-shim /usr/local/bin/
	install -m 0644 contrib/systemd/scute.service /etc/systemd/system/scute.service
	mkdir -p /etc/scute
	# crictl waits as long as the kubelet's runtimeRequestTimeout (2 min) for each RPC. Under TCG
	# the first sandbox after tests/checkpoint.rs once took 28 s and once outlasted 60 s, with
	# the host idle: what stalls there is not known yet (run_pod prints the journal when it fails).
	printf 'runtime-endpoint: %s\nimage-endpoint: %s\ntimeout: 120\n' "$endpoint" "$endpoint" >/etc/crictl.yaml
	hack/mirrors.sh "$registry" /etc/scute/certs.d 2>/dev/null
	cat >/etc/scute/config.toml <<-EOF
		[log]
		level = "${SCUTE_VM_LOG_LEVEL:-info}"

		[runtime]
		cgroup_driver = "systemd"

		[registry]
		config_path = "/etc/scute/certs.d"
	EOF
	systemctl daemon-reload
	systemctl start scute
	[[ -S /run/scute/scute.sock ]] || fail "scute.service is up but /run/scute/scute.sock is missing"
}

# scute.service installed (once) and running.
ensure_scute() {
	[[ -e /etc/systemd/system/scute.service ]] || install_scute
	systemctl is-active -q scute || systemctl start scute
}

# A pod with one sleeping busybox container (crictl run); prints "<pod id> <container id>".
run_pod() {
	local dir
	dir=$(mktemp -d)
	cat >"$dir/pod.json" <<-EOF
		{"metadata": {"name": "$1", "namespace": "vm", "uid": "$1-uid"}, "log_directory": "$dir/logs",
		 "linux": {}}
	EOF
	cat >"$dir/ctr.json" <<-EOF
		{"metadata": {"name": "main"}, "image": {"image": "registry.k8s.io/e2e-test-images/busybox:1.29-2"},
		 "command": ["sleep", "3600"], "log_path": "main.log",
		 "linux": {"resources": {"memory_limit_in_bytes": 67108864, "cpu_quota": 20000, "cpu_period": 100000}}}
	EOF
	local ctr pod started=$EPOCHSECONDS
	ctr=$(crictl run --with-pull "$dir/ctr.json" "$dir/pod.json") || {
		# What scute and the pod's shim were doing (a create that outlasted crictl's timeout).
		journalctl -u scute --no-pager -n 60 -o short-precise 2>&1 | cut -c1-300 >&2
		tail -n 30 /run/scute/shims/*/shim.log 2>&1 | cut -c1-300 >&2
		fail "crictl run of pod $1"
	}
	if ((EPOCHSECONDS - started > 20)); then
		# Slow even for TCG (a pod and a pull take 5-10 s): say where the time went.
		log "crictl run of pod $1 took $((EPOCHSECONDS - started)) s; scute's journal meanwhile:"
		journalctl -u scute --no-pager --since "@$started" -o short-precise 2>&1 | cut -c1-300 | tail -n 80 >&2
	fi
	pod=$(crictl ps -o json --id "$ctr" | python3 -c 'import json,sys; print(json.load(sys.stdin)["containers"][0]["podSandboxId"])')
	rm -f "$dir"/*.json # (the logs stay until the throwaway guest goes)
	echo "$pod $ctr"
}

step_service() {
	step "scute.service with the systemd cgroup driver: scopes, limits, restart, teardown"
	install_scute
	log "scute.service active (MainPID $(systemctl show -p MainPID --value scute))"

	read -r pod ctr < <(run_pod vm-svc)
	local pid cgroup shim_pid shim_cgroup
	pid=$(crictl inspect -o go-template --template '{{.info.pid}}' "$ctr")
	cgroup=$(sed -n 's/^0:://p' "/proc/$pid/cgroup")
	[[ $cgroup == "/system.slice/scute-$ctr.scope" ]] || fail "container $ctr is in $cgroup, not /system.slice/scute-$ctr.scope"
	[[ $(systemctl show -p Delegate --value "scute-$ctr.scope") == yes ]] || fail "scute-$ctr.scope is not Delegate=yes"
	[[ $(cat "/sys/fs/cgroup$cgroup/memory.max") == 67108864 ]] || fail "memory.max is $(cat "/sys/fs/cgroup$cgroup/memory.max"), not 64 MiB"
	[[ $(cat "/sys/fs/cgroup$cgroup/cpu.max") == "20000 100000" ]] || fail "cpu.max is $(cat "/sys/fs/cgroup$cgroup/cpu.max")"
	# The container sees its own cgroup as / (a cgroup namespace).
	[[ $(crictl exec "$ctr" cat /proc/self/cgroup) == "0::/" ]] || fail "the container does not see / as its cgroup"
	shim_pid=$(pgrep -f "scute-shim --id $pod" | head -n 1)
	shim_cgroup=$(sed -n 's/^0:://p' "/proc/$shim_pid/cgroup")
	# Beside the pod's containers (a pod without a cgroup parent is in system.slice), in a scope
	# of its own, so that restarting scute.service leaves it alone.
	[[ $shim_cgroup == "/system.slice/scute-shim-${pod:0:32}.scope" ]] || fail "the shim is in $shim_cgroup, not a scope of its own beside the pod's containers"
	log "container in $cgroup (memory.max 64 MiB, cpu.max 20000 100000, cgroupns /), shim in $shim_cgroup"

	log "systemctl restart scute under a running pod"
	systemctl restart scute
	kill -0 "$pid" || fail "the container died with scute's restart"
	kill -0 "$shim_pid" || fail "the shim died with scute's restart"
	[[ $(crictl inspect -o go-template --template '{{.status.state}}' "$ctr") == CONTAINER_RUNNING ]] ||
		fail "after the restart crictl does not see $ctr running"
	[[ $(crictl exec "$ctr" echo alive) == alive ]] || fail "exec after the restart"

	crictl stopp "$pod" >/dev/null
	crictl rmp "$pod" >/dev/null
	kill -0 "$shim_pid" 2>/dev/null && fail "the shim outlived its pod"
	wait_no_scute_units
	log "pod removed: no scute-*.scope left"
}

step_critest() {
	step "critest against scute.service (systemd driver, cgroup v2)"
	command -v critest >/dev/null || {
		log "SKIPPED: critest not available (no ../shared/tools)"
		return 0
	}
	ensure_scute
	# What goes through no cgroup, scope or init system runs on the host only (there whole), not
	# again here at a tenth of the speed: the image service (pulls, lists, status, removal),
	# streaming (exec, attach, port-forward: exec joining the container's scope is in the basic
	# operations' ExecSync), host namespaces, seccomp profiles, idempotent stops and removals, the
	# runtime's info. What stays: lifecycles, resources and stats, OOM, pods, several containers,
	# privileges and devices, user namespaces, mounts and their propagation (systemd's / is shared),
	# networking and host ports (nftables-backed iptables here).
	local host_only='Image Manager|Image Identifier Consistency|Image Consistency|Streaming|NamespaceOption|SeccompProfilePath|Idempotence|Runtime info'
	# Its reports beside the host's (the two stages run at the same time).
	# shellcheck disable=SC2086 # extra critest flags, e.g. --ginkgo.focus=OOM
	CRITEST_LOGS=$repo_root/target/critest-vm CRITEST_ENDPOINT=$endpoint \
		critest/run.sh --ginkgo.skip "$host_only" ${SCUTE_VM_CRITEST_ARGS:-}
	wait_no_scute_units
}

step_kubelet() {
	step "kubelet suite (cgroupDriver: systemd, default failCgroupV1) on the test harness's own daemons"
	[[ -x $tools/kubelet ]] || {
		log "SKIPPED: no kubelet (no ../shared/tools)"
		return 0
	}
	# The harness starts its own daemons: the service's pods would confuse nothing, but one
	# runtime on a node is what a kubelet expects.
	systemctl stop scute 2>/dev/null || true
	# Under TCG (a tenth of host speed) the whole suite would take hours: lifecycle, resources
	# and OOM, probes, stats and restarts, the tests whose answers depend on the cgroup driver
	# and hierarchy, image volumes (overlay views on the guest's kernel 6.1), and the kubelet's
	# checkpoint endpoint (CRIU works on this kernel, not on the host's).
	# SCUTE_VM_KUBELET_TESTS="" runs them all.
	local tests=${SCUTE_VM_KUBELET_TESTS-a_pod_runs_ready requests_and_limits stats_summary pods_survive probes_drive image_volumes checkpoint_endpoint}
	# shellcheck disable=SC2086 # test name filters
	# Waits scaled by 3: an emulated guest on a busy host took over 120 s to start a pod's
	# container once (tests/kubelet.rs start()).
	SCUTE_TEST_TIME_SCALE=${SCUTE_TEST_TIME_SCALE:-3} SCUTE_TEST_CGROUP_DRIVER=systemd \
		"$(test_binary kubelet)" --test-threads 1 $tests
	wait_no_scute_units
	# CDI devices through the CRI and from a device plugin through the kubelet; a container
	# without a device cannot open it (the shim's device filter on the container's scope).
	log "tests/cdi.rs, systemd driver"
	SCUTE_TEST_CGROUP_DRIVER=systemd "$(test_binary cdi)" --test-threads 1
	wait_no_scute_units
}

# Each entry: a test file and the drivers it runs with here. tests/container_update.rs writes
# limits, which each driver applies its own way (systemd's unit properties, and what the shim
# writes beside them); tests/stats.rs reads them back, the same files under either driver, so
# one driver is enough (its pod cgroup-parent test makes a cgroupfs parent).
step_integration() {
	step "cgroup integration tests on cgroup v2"
	local entry t drivers driver
	for entry in ${SCUTE_VM_INTEGRATION:-container_update:systemd,cgroupfs stats:cgroupfs}; do
		t=${entry%%:*} drivers=${entry#*:}
		[[ $drivers == "$entry" ]] && drivers=systemd,cgroupfs
		for driver in ${drivers//,/ }; do
			log "tests/$t.rs, $driver driver"
			SCUTE_TEST_CGROUP_DRIVER=$driver "$(test_binary "$t")" --test-threads 1
		done
	done
	wait_no_scute_units
}

# CRIU works on this kernel (6.1), not on the host's (newer than Debian's CRIU): the checkpoint
# tests that need it run here (on the host they check the FailedPrecondition and skip).
step_checkpoint() {
	step "CheckpointContainer with CRIU $(criu --version 2>/dev/null | sed -n 's/^Version: //p') (tests/checkpoint.rs; crictl on scute.service)"
	criu check >/dev/null 2>&1 || fail "criu check fails in the guest: $(criu check 2>&1 | tail -n 3)"
	"$(test_binary checkpoint)" --test-threads 1 --nocapture
	wait_no_scute_units

	# As an operator would, on scute.service (systemd driver): crictl checkpoint, the archive
	# read by checkpointctl, then restored with crictl into a new pod.
	ensure_scute
	local pod ctr archive=/var/tmp/vm-checkpoint.tar dir
	read -r pod ctr < <(run_pod vm-ckpt)
	crictl checkpoint --export="$archive" "$ctr" >/dev/null || fail "crictl checkpoint $ctr"
	[[ $(crictl inspect -o go-template --template '{{.status.state}}' "$ctr") == CONTAINER_RUNNING ]] ||
		fail "$ctr is not running after crictl checkpoint"
	if command -v checkpointctl >/dev/null; then
		checkpointctl show "$archive" | grep scute >/dev/null || fail "checkpointctl show: $(checkpointctl show "$archive" 2>&1)"
		# Its deeper reading: CRIU's process tree and files (with crit), and the rootfs diff.
		checkpointctl inspect --ps-tree --files "$archive" >/dev/null ||
			fail "checkpointctl inspect: $(checkpointctl inspect --ps-tree --files "$archive" 2>&1 | tail -n 5)"
	fi
	dir=$(mktemp -d)
	printf '{"metadata": {"name": "vm-ckpt-restored", "namespace": "vm", "uid": "vm-ckpt-restored-uid"}, "log_directory": "%s", "linux": {}}\n' \
		"$dir" >"$dir/pod.json"
	printf '{"metadata": {"name": "main"}, "image": {"image": "%s"}, "log_path": "main.log", "linux": {}}\n' \
		"$archive" >"$dir/ctr.json"
	local pod2 ctr2
	pod2=$(crictl runp "$dir/pod.json")
	ctr2=$(crictl create "$pod2" "$dir/ctr.json" "$dir/pod.json") || fail "crictl create from the archive"
	crictl start "$ctr2" >/dev/null || fail "crictl start of the restored container"
	[[ $(crictl inspect -o go-template --template '{{.status.state}}' "$ctr2") == CONTAINER_RUNNING ]] ||
		fail "the restored container is not running"
	[[ $(crictl exec "$ctr2" echo alive) == alive ]] || fail "crictl exec into the restored container"
	local cgroup
	cgroup=$(sed -n 's/^0:://p' "/proc/$(crictl inspect -o go-template --template '{{.info.pid}}' "$ctr2")/cgroup")
	[[ $cgroup == "/system.slice/scute-$ctr2.scope" ]] || fail "the restored container is in $cgroup, not its scope"
	log "crictl checkpoint, checkpointctl show, crictl create/start of the archive: restored in $cgroup"
	crictl stopp "$pod" "$pod2" >/dev/null
	crictl rmp "$pod" "$pod2" >/dev/null
	rm -rf "$dir" "$archive"
	wait_no_scute_units
}

# Pods through a reboot: they come back NotReady (their processes, netns and mounts are gone
# with the old boot) and are removed without error or leftovers.
step_reboot() {
	step "reboot with a pod: it comes back NotReady and goes cleanly"
	if [[ ! -e $state/reboot.ids ]]; then
		ensure_scute
		systemctl enable -q scute
		run_pod vm-reboot >"$state/reboot.ids"
		log "pod $(cut -d' ' -f1 "$state/reboot.ids") running; rebooting"
		sync
		systemctl reboot
		sleep infinity
	fi
	local pod ctr
	read -r pod ctr <"$state/reboot.ids"
	for _ in $(seq 300); do
		[[ -S /run/scute/scute.sock ]] && break
		sleep 0.2
	done
	systemctl is-active -q scute || fail "scute.service did not come up at boot: $(systemctl status scute --no-pager | tail -n 5)"
	local pod_state ctr_state
	pod_state=$(crictl inspectp -o go-template --template '{{.status.state}}' "$pod")
	ctr_state=$(crictl inspect -o go-template --template '{{.status.state}}' "$ctr")
	[[ $pod_state == SANDBOX_NOTREADY ]] || fail "after the reboot the pod is $pod_state"
	[[ $ctr_state == CONTAINER_EXITED ]] || fail "after the reboot the container is $ctr_state"
	log "after the reboot: pod $pod_state, container $ctr_state"
	crictl stopp "$pod" >/dev/null || fail "StopPodSandbox after the reboot"
	crictl rmp "$pod" >/dev/null || fail "RemovePodSandbox after the reboot"
	wait_no_scute_units
	local left
	left=$(awk '$5 ~ "^/var/lib/scute/" || $5 ~ "^/run/scute/" {print $5}' /proc/self/mountinfo)
	[[ -z $left ]] || fail "mounts left: $left"
	[[ -z $(ls -A /run/scute/netns 2>/dev/null) ]] || fail "netns left: $(ls /run/scute/netns)"
	log "removed: no scope, mount or netns left"
}

# Power cuts (issue 40): SCUTE_VM_POWERCUT_CUTS of them (3 in every run; 50 with
# SCUTE_VM_STEPS="facts powercut" SCUTE_VM_POWERCUT_CUTS=50 SCUTE_VM_TIMEOUT=7200 hack/vm.sh
# test). Each boot checks what the last cut left, then runs a
# pull and pod workload until this boot's cut: the kernel restarts at once
# (/proc/sysrq-trigger "b": no sync, no unmount; the page cache, and with it every write the
# disk was not given, is gone, as at a power cut; qemu's cache=unsafe disk keeps only what it
# was given). Two in three cuts come at a random moment of the workload; every third comes
# right after an RPC returned (pull, run pod, create, start, remove image in turn), with the
# daemon SIGKILLed first, so that "returned" is checked to mean "on the disk". The test's own
# records are in the job's dir on the host (9p), which no cut touches.
pc_dir=/run/scute-vm/powercut
pc_images=(
	registry.k8s.io/e2e-test-images/nginx:1.14-2 registry.k8s.io/e2e-test-images/busybox:1.29-2
	registry.k8s.io/e2e-test-images/httpd:2.4.39-4 registry.k8s.io/e2e-test-images/nonewprivs:1.3
	docker.io/docker/library/busybox:1-musl
)
pc_returned_kinds=(pull runp create start rmi)

pc_fail() {
	echo "$*" >"$pc_dir/failed"
	fail "$*"
}

step_powercut() {
	step "power cuts: images, snapshots and records after each (issue 40)"
	local cuts=${SCUTE_VM_POWERCUT_CUTS:-3} n
	mkdir -p "$pc_dir"
	[[ ! -e $pc_dir/failed ]] || fail "an earlier boot failed: $(<"$pc_dir/failed")"
	n=$(cat "$pc_dir/count" 2>/dev/null || echo 0)
	if ((n == 0)); then
		ensure_scute
		systemctl enable -q scute
		sync
	else
		powercut_check "$n"
	fi
	if ((n >= cuts)); then
		log "$n cuts, each followed by the checks above; where they fell:"
		sed 's/^/    /' "$pc_dir/log" >&2
		log "by phase: $(sed -n 's/^cut [0-9]*: \([a-z]*\) \([a-z]*\).*/\1 \2/p' "$pc_dir/log" | sort | uniq -c | awk '{printf "%s%s %s %d", (NR > 1 ? ", " : ""), $2, $3, $1}')"
		return 0
	fi
	n=$((n + 1))
	echo "$n" >"$pc_dir/count"
	powercut_work "$n"
	pc_fail "cut $n: the workload ended without its cut"
}

# What a cut may leave and must not: run after each boot that follows one.
powercut_check() {
	local n=$1 started=$SECONDS last
	last=$(cat "$pc_dir/last" 2>/dev/null || true)
	for _ in $(seq 900); do
		[[ -S /run/scute/scute.sock ]] && crictl version >/dev/null 2>&1 && break
		sleep 0.2
	done
	systemctl is-active -q scute || pc_fail "after cut $n ($last) scute.service did not come up: $(systemctl status scute --no-pager 2>&1 | tail -n 8)"
	# scute saw the machine go down, and what its start repaired.
	local journal repaired
	journal=$(journalctl -b -u scute --no-pager -o cat 2>&1)
	grep -q 'the last run ended unclean.*machine_went_down=true' <<<"$journal" ||
		pc_fail "after cut $n scute did not see that the machine went down under it"
	repaired=$(grep 'after an unclean stop' <<<"$journal" | grep -v 'checked the store' | sed 's/^.*kind=/kind=/' || true)
	# What is left after the start's repair: nothing that breaks an image or a record.
	local doctor
	doctor=$(scute doctor 2>&1 || true)
	if grep -E '^(corrupt-blob|damaged-snapshot|damaged-image|missing-snapshot|broken-chain)[[:space:]]' <<<"$doctor"; then
		pc_fail "after cut $n ($last) scute doctor finds, after the start's repair: $doctor"
	fi
	# Every image listed matches its layers' digests, file for file.
	local verified
	verified=$(python3 hack/vm/verify-images.py "$registry" --cache "$state/layer-cache" 2>&1) ||
		pc_fail "after cut $n ($last) an image is listed that is not whole: $verified"
	# What an RPC returned before the cut is there (or, for a removal, gone).
	local kind what
	read -r _ kind what <<<"$last"
	case $last in
	"returned pull "* | "returned rmi "*)
		local listed=0
		crictl inspecti "$what" >/dev/null 2>&1 && listed=1
		[[ $kind == pull && $listed == 1 ]] || [[ $kind == rmi && $listed == 0 ]] ||
			pc_fail "after cut $n: RemoveImage/PullImage of $what had returned, yet it is $( ((listed)) && echo listed || echo not listed)"
		;;
	"returned runp "*)
		crictl inspectp "$what" >/dev/null 2>&1 || pc_fail "after cut $n: RunPodSandbox had returned $what, which is not listed"
		;;
	"returned create "* | "returned start "*)
		crictl inspect "$what" >/dev/null 2>&1 || pc_fail "after cut $n: CreateContainer had returned $what, which is not listed"
		;;
	esac
	# The pods from before the cut are NotReady and go without error or leftovers.
	local pod ctr
	for pod in $(crictl pods -q); do
		[[ $(crictl inspectp -o go-template --template '{{.status.state}}' "$pod") == SANDBOX_NOTREADY ]] ||
			pc_fail "after cut $n pod $pod is not NotReady"
		crictl stopp "$pod" >/dev/null && crictl rmp "$pod" >/dev/null || pc_fail "after cut $n removing pod $pod"
	done
	[[ -z $(crictl ps -a -q) ]] || pc_fail "after cut $n containers outlived their pods: $(crictl ps -a)"
	# A container from each of the workload's images listed starts (the pod proves the sandbox
	# image; every image listed was checked above, those of earlier steps too).
	local dir image ids=()
	dir=$(mktemp -d)
	cat >"$dir/pod.json" <<-EOF
		{"metadata": {"name": "pc-check-$n", "namespace": "vm", "uid": "pc-check-$n"}, "log_directory": "$dir/logs", "linux": {}}
	EOF
	pod=$(crictl runp "$dir/pod.json" 2> >(grep -v 'cgroup_parent is not set' >&2)) || pc_fail "after cut $n RunPodSandbox failed"
	mapfile -t ids < <(crictl images -o json | python3 -c '
import json, sys
for i in json.load(sys.stdin)["images"]:
    if set(i.get("repoTags") or []) & set(sys.argv[1:]):
        print(i["id"])' "${pc_images[@]}")
	local i=0 started_ok=0
	for image in "${ids[@]}"; do
		i=$((i + 1))
		cat >"$dir/ctr-$i.json" <<-EOF
			{"metadata": {"name": "c$i"}, "image": {"image": "$image"}, "command": ["sh", "-c", "echo started-$i"], "log_path": "c$i.log", "linux": {}}
		EOF
		ctr=$(crictl create "$pod" "$dir/ctr-$i.json" "$dir/pod.json") && crictl start "$ctr" >/dev/null ||
			pc_fail "after cut $n a container from image $image did not start"
		for _ in $(seq 300); do
			[[ $(crictl inspect -o go-template --template '{{.status.state}}' "$ctr") == CONTAINER_EXITED ]] && break
			sleep 0.1
		done
		[[ $(crictl inspect -o go-template --template '{{.status.exitCode}}' "$ctr") == 0 ]] &&
			grep -q "started-$i" "$dir/logs/c$i.log" ||
			pc_fail "after cut $n the container from image $image did not run: $(crictl inspect "$ctr" | tail -n 20)"
		started_ok=$((started_ok + 1))
	done
	crictl stopp "$pod" >/dev/null && crictl rmp "$pod" >/dev/null || pc_fail "after cut $n removing the check's pod"
	rm -rf "$dir"
	wait_no_scute_units
	local left
	left=$(awk '$5 ~ "^/var/lib/scute/" || $5 ~ "^/run/scute/" {print $5}' /proc/self/mountinfo)
	[[ -z $left ]] || pc_fail "after cut $n mounts are left: $left"
	log "after cut $n ($last): scute up $((SECONDS - started)) s into the check; start repaired: ${repaired:-nothing}; $(tail -n 1 <<<"$verified"); $started_ok container(s), one per image, ran; pods from before removed, nothing left"
}

# The workload of cut $1 until its cut (never returns).
powercut_work() {
	local n=$1 mode kind="" delay dir
	echo "start of the workload" >"$pc_dir/phase"
	if ((n % 3 == 0)); then
		mode=returned
		kind=${pc_returned_kinds[$(((n / 3 - 1) % ${#pc_returned_kinds[@]}))]}
	else
		mode=timed
		# Milliseconds into the workload: one to two rounds of it under TCG.
		delay=$(printf '%d.%03d' $((RANDOM % 30)) $((RANDOM % 1000)))
		(
			sleep "$delay"
			[[ -e $pc_dir/failed ]] && exit 0
			echo "timed $(cat "$pc_dir/phase")" >"$pc_dir/last"
			echo "cut $n: timed $(cat "$pc_dir/phase") (${delay} s in)" >>"$pc_dir/log"
			echo b >/proc/sysrq-trigger
		) &
	fi
	log "cut $n: $mode${kind:+ after $kind} ${delay:+at ${delay} s}"
	dir=$(mktemp -d)
	local round=0 image pod ctr main_pid
	main_pid=$(systemctl show -p MainPID --value scute)
	# $1: the RPC's kind, $2: what it returned or acted on. Cuts here when it is this cut's kind.
	returned() {
		[[ $mode == returned && $1 == "$kind" ]] || return 0
		echo "returned $1 $2" >"$pc_dir/last"
		echo "cut $n: returned $1 $2" >>"$pc_dir/log"
		kill -KILL "$main_pid"
		echo b >/proc/sysrq-trigger
		sleep infinity
	}
	phase() { echo "$*" >"$pc_dir/phase"; }
	while :; do
		image=${pc_images[$(((n + round) % ${#pc_images[@]}))]}
		round=$((round + 1))
		cat >"$dir/pod.json" <<-EOF
			{"metadata": {"name": "pc-$n-$round", "namespace": "vm", "uid": "pc-$n-$round"}, "log_directory": "$dir/logs", "linux": {}}
		EOF
		cat >"$dir/ctr.json" <<-EOF
			{"metadata": {"name": "main"}, "image": {"image": "$image"}, "command": ["sh", "-c", "echo $n-$round; sleep 1"], "log_path": "main.log", "linux": {}}
		EOF
		if crictl inspecti "$image" >/dev/null 2>&1; then
			phase "rmi $image"
			crictl rmi "$image" >/dev/null || pc_fail "cut $n: RemoveImage $image"
			returned rmi "$image"
		fi
		phase "pull $image"
		crictl pull "$image" >/dev/null || pc_fail "cut $n: PullImage $image (after the earlier cuts)"
		returned pull "$image"
		phase "runp pc-$n-$round"
		pod=$(crictl runp "$dir/pod.json" 2> >(grep -v 'cgroup_parent is not set' >&2)) || pc_fail "cut $n: RunPodSandbox"
		returned runp "$pod"
		phase "create in $pod"
		ctr=$(crictl create "$pod" "$dir/ctr.json" "$dir/pod.json") || pc_fail "cut $n: CreateContainer"
		returned create "$ctr"
		phase "start $ctr"
		crictl start "$ctr" >/dev/null || pc_fail "cut $n: StartContainer"
		returned start "$ctr"
		phase "stop $ctr"
		crictl stop "$ctr" >/dev/null || pc_fail "cut $n: StopContainer"
		phase "rm $ctr"
		crictl rm "$ctr" >/dev/null || pc_fail "cut $n: RemoveContainer"
		phase "stopp $pod"
		crictl stopp "$pod" >/dev/null || pc_fail "cut $n: StopPodSandbox"
		phase "rmp $pod"
		crictl rmp "$pod" >/dev/null || pc_fail "cut $n: RemovePodSandbox"
	done
}

step_bench() {
	step "benchmark: pod + container cycle in the VM, each cgroup driver"
	ensure_scute
	local driver i start end
	for driver in systemd cgroupfs; do
		sed -i "s/^cgroup_driver = .*/cgroup_driver = \"$driver\"/" /etc/scute/config.toml
		systemctl restart scute
		for i in 1 2 3; do
			start=$(date +%s%N)
			read -r pod _ < <(run_pod "vm-bench-$driver-$i")
			crictl stopp "$pod" >/dev/null
			crictl rmp "$pod" >/dev/null
			end=$(date +%s%N)
			echo "figure: [vm, TCG, $driver driver] run pod + create/start container + stop + remove, cycle $i: $(((end - start) / 1000000)) ms" >&2
		done
	done
	sed -i 's/^cgroup_driver = .*/cgroup_driver = "systemd"/' /etc/scute/config.toml
	systemctl restart scute
	wait_no_scute_units
	[[ -z $(ls -A /sys/fs/cgroup/scute 2>/dev/null) ]] || fail "cgroupfs pods left cgroups: $(ls /sys/fs/cgroup/scute)"
}

step_package() {
	step "Debian package (hack/package.sh): install, upgrade under a running pod, remove, purge"
	local packages=$repo_root/target/debian/vm first second
	first=$(ls "$packages"/scute_*+vm1_*.deb) || fail "no package in $packages (hack/vm.sh test builds them)"
	second=$(ls "$packages"/scute_*+vm2_*.deb)
	# From a node without scute: the hand install goes, its config kept aside.
	systemctl disable --now scute 2>/dev/null || true
	rm -f /etc/systemd/system/scute.service /usr/local/bin/scute /usr/local/bin/scute-shim
	systemctl daemon-reload
	rm -rf /etc/scute.hand
	[[ ! -e /etc/scute ]] || mv /etc/scute /etc/scute.hand

	DEBIAN_FRONTEND=noninteractive dpkg -i "$first" >/dev/null
	systemctl is-active -q scute || fail "the package did not start scute.service"
	systemctl is-enabled -q scute || fail "the package did not enable scute.service"
	[[ $(systemctl show -p FragmentPath --value scute) == /lib/systemd/system/scute.service ]] ||
		fail "scute.service comes from $(systemctl show -p FragmentPath --value scute)"
	[[ -f /usr/share/man/man8/scute.8.gz && -f /usr/share/man/man8/scute-shim.8.gz ]] || fail "no man pages"
	cmp -s /etc/scute/config.toml <(/usr/bin/scute config default) || fail "/etc/scute/config.toml is not the default config"
	log "installed $(dpkg-query -W -f '${Version}' scute): active, enabled, /etc/scute/config.toml the default"

	# The operator's edits: the systemd driver and the test registry's mirrors.
	sed -i 's/^cgroup_driver = .*/cgroup_driver = "systemd"/' /etc/scute/config.toml
	hack/mirrors.sh "$registry" /etc/scute/certs.d 2>/dev/null
	systemctl restart scute
	read -r pod ctr < <(run_pod vm-pkg)
	local pid shim_pid daemon_pid
	pid=$(crictl inspect -o go-template --template '{{.info.pid}}' "$ctr")
	shim_pid=$(pgrep -f "scute-shim --id $pod" | head -n 1)
	daemon_pid=$(systemctl show -p MainPID --value scute)

	DEBIAN_FRONTEND=noninteractive dpkg -i "$second" >/dev/null
	[[ $(dpkg-query -W -f '${Version}' scute) == *+vm2 ]] || fail "the upgrade did not install +vm2"
	[[ $(systemctl show -p MainPID --value scute) != "$daemon_pid" ]] || fail "the upgrade did not restart the daemon"
	systemctl is-active -q scute || fail "scute.service is not active after the upgrade"
	kill -0 "$pid" || fail "the container died with the upgrade"
	kill -0 "$shim_pid" || fail "the shim died with the upgrade"
	[[ $(crictl inspect -o go-template --template '{{.status.state}}' "$ctr") == CONTAINER_RUNNING ]] ||
		fail "after the upgrade crictl does not see $ctr running"
	[[ $(crictl exec "$ctr" echo alive) == alive ]] || fail "exec after the upgrade"
	grep -q '^cgroup_driver = "systemd"' /etc/scute/config.toml || fail "the upgrade replaced the edited config"
	log "upgraded to $(dpkg-query -W -f '${Version}' scute): daemon $daemon_pid -> $(systemctl show -p MainPID --value scute), container $pid and shim $shim_pid untouched, config kept"

	crictl stopp "$pod" >/dev/null
	crictl rmp "$pod" >/dev/null
	wait_no_scute_units
	dpkg -r scute >/dev/null
	systemctl is-active -q scute && fail "scute.service still active after dpkg -r"
	[[ ! -e /usr/bin/scute && -f /etc/scute/config.toml ]] || fail "dpkg -r: binaries must go, the config stay"
	dpkg -P scute >/dev/null
	[[ ! -e /etc/scute ]] || fail "dpkg -P left /etc/scute"
	dpkg-query -W scute >/dev/null 2>&1 && [[ $(dpkg-query -W -f '${Status}' scute) != *not-installed* ]] &&
		fail "scute is still known to dpkg after the purge"
	log "removed (config kept) and purged (config gone); /var/lib/scute kept: $(ls /var/lib/scute | tr '\n' ' ')"

	# Back to the hand install for the steps after this one.
	rm -rf /etc/scute.hand
	install_scute
}

# The operator's path to a cluster (docs/getting-started.md): scute from its .deb with the
# systemd driver, the kubelet and kubeadm as the Kubernetes packages install them, `kubeadm
# init` with scute's socket. The control plane then runs as static pods on scute itself, and
# kube-proxy and CoreDNS as kubeadm deploys them; a Service answers by DNS name from a pod, and
# `kubectl exec` and `logs` go through the API server. `kubeadm reset` leaves scute empty.
step_kubeadm() {
	step "kubeadm init on scute (.deb, systemd driver): static-pod control plane, kube-proxy, CoreDNS, a Service"
	[[ -x $tools/kubeadm && -x $tools/kubelet && -x $tools/kubectl ]] || {
		log "SKIPPED: no kubeadm, kubelet or kubectl (no ../shared/tools)"
		return 0
	}
	local deb started=$SECONDS
	deb=$(ls "$repo_root"/target/debian/vm/scute_*+vm1_*.deb) || fail "no package in target/debian/vm (hack/vm.sh test builds it)"
	systemctl disable --now scute 2>/dev/null || true
	rm -f /etc/systemd/system/scute.service /usr/local/bin/scute /usr/local/bin/scute-shim
	rm -rf /etc/scute.hand
	[[ ! -e /etc/scute ]] || mv /etc/scute /etc/scute.hand
	DEBIAN_FRONTEND=noninteractive dpkg -i "$deb" >/dev/null
	# The operator's edits (docs/getting-started.md): the systemd driver, as kubeadm configures
	# the kubelet, and (offline here) mirrors for registry.k8s.io.
	sed -i 's/^cgroup_driver = .*/cgroup_driver = "systemd"/' /etc/scute/config.toml
	hack/mirrors.sh "$registry" /etc/scute/certs.d 2>/dev/null
	systemctl restart scute

	install -m 0755 "$tools/kubelet" "$tools/kubeadm" "$tools/kubectl" /usr/bin/
	printf 'runtime-endpoint: %s\nimage-endpoint: %s\ntimeout: 60\n' "$endpoint" "$endpoint" >/etc/crictl.yaml
	install -D -m 0644 hack/vm/kubeadm/kubelet.service /usr/lib/systemd/system/kubelet.service
	install -D -m 0644 hack/vm/kubeadm/10-kubeadm.conf /usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf
	systemctl daemon-reload
	systemctl enable -q kubelet
	# kubeadm's prerequisites for a node (its preflight checks them).
	sysctl -q -w net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
	# CoreDNS forwards to the node's resolv.conf (qemu's resolver; nothing outside answers).
	[[ -s /etc/resolv.conf ]] || echo 'nameserver 10.0.2.3' >/etc/resolv.conf
	# The pod network a network add-on would install: Debian's bridge plugin on the pod range the
	# controller-manager gives this node (the first /24 of podSubnet).
	mkdir -p /etc/cni/net.d
	cat >/etc/cni/net.d/10-kubeadm-bridge.conflist <<-EOF
		{"cniVersion": "1.0.0", "name": "kubeadm-bridge", "plugins": [
		 {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
		  "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
		 {"type": "portmap", "capabilities": {"portMappings": true}}]}
	EOF

	local node
	node=$(hostname | tr '[:upper:]' '[:lower:]')
	# What the kubelet runs on scute while kubeadm waits, once a minute.
	(
		while sleep 60; do
			echo "--- $(date +%T) crictl ps -a:" >&2
			crictl ps -a 2>&1 | cut -c1-150 >&2
			for id in $(crictl ps -q --state exited 2>/dev/null); do
				echo "--- exited container $id ($(crictl inspect -o go-template --template '{{.status.exitCode}} {{.status.reason}} {{.status.finishedAt}}' "$id" 2>&1)), the end of its log:" >&2
				crictl logs --tail 8 "$id" 2>&1 | cut -c1-300 >&2
			done
		done
	) &
	local watcher=$!
	# kubeadm init, in its phases: emulated, the API server missed its fixed 30-second window to
	# create the bootstrap RBAC roles (PostStartHook "rbac/bootstrap-roles" failed, at every
	# restart) while the controller-manager and the scheduler started beside it and listed
	# everything. So the API server starts alone, and the rest of `kubeadm init` follows once it
	# is ready. On a node at native speed plain `kubeadm init` does the same in one go.
	local config=hack/vm/kubeadm/init.yaml phase
	for phase in preflight "certs all" "kubeconfig all" "etcd local" "control-plane apiserver" kubelet-start; do
		# shellcheck disable=SC2086 # a phase and its sub-phase
		kubeadm init phase $phase --config "$config" 2>&1 | tee -a "$state/kubeadm-init.log" >&2 ||
			{ kill "$watcher"; fail "kubeadm init phase $phase failed"; }
	done
	for _ in $(seq 900); do
		[[ $(curl -ks --max-time 5 https://127.0.0.1:6443/readyz 2>/dev/null) == ok ]] && break
		sleep 2
	done
	[[ $(curl -ks --max-time 5 https://127.0.0.1:6443/readyz) == ok ]] || { kill "$watcher"; fail "the API server never became ready"; }
	log "the API server is ready: $((SECONDS - started)) s"
	if ! kubeadm init --config "$config" --skip-phases=preflight,certs,kubeconfig,etcd,control-plane/apiserver,kubelet-start \
		2>&1 | tee -a "$state/kubeadm-init.log" >&2; then
		kill "$watcher"
		journalctl -u kubelet --no-pager | tail -n 30 >&2
		fail "kubeadm init failed"
	fi
	kill "$watcher"
	log "kubeadm init: $((SECONDS - started)) s"
	export KUBECONFIG=/etc/kubernetes/admin.conf
	# kubectl's cache goes to $HOME/.kube: the guest's root, not the shared repo (the job has no HOME).
	export HOME=/root
	# What the cluster looked like, before a failure's message.
	# kube-proxy's view: its log and the Service rules it wrote (nftables-backed iptables).
	proxy_dump() {
		crictl logs --tail 20 "$(crictl ps -q --name '^kube-proxy$' | sed -n 1p)" 2>&1 | cut -c1-250 >&2 || true
		iptables-nft-save -t nat 2>/dev/null | grep -E 'KUBE-(SERVICES|SVC|SEP)' | head -n 20 >&2 || true
		sysctl net.bridge.bridge-nf-call-iptables net.ipv4.ip_forward >&2 || true
	}
	dump() {
		kubectl get pods -A -o wide >&2 || true
		kubectl get events -A --sort-by=.lastTimestamp 2>&1 | tail -n 25 | cut -c1-250 >&2 || true
		crictl ps -a 2>&1 | cut -c1-150 >&2
	}

	kubectl wait --for=condition=Ready "node/$node" --timeout=600s >/dev/null ||
		{ dump; fail "node $node not Ready: $(kubectl describe node "$node" | sed -n '/Conditions/,/Addresses/p')"; }
	local runtime
	runtime=$(kubectl get node "$node" -o jsonpath='{.status.nodeInfo.containerRuntimeVersion}')
	[[ $runtime == scute://* ]] || { dump; fail "the node's container runtime is $runtime"; }
	kubectl get nodes -o wide >&2

	# The control plane's static pods, kube-proxy and CoreDNS, all on scute.
	local component pod
	for component in etcd kube-apiserver kube-controller-manager kube-scheduler; do
		kubectl -n kube-system wait --for=condition=Ready "pod/$component-$node" --timeout=600s >/dev/null ||
			{ dump; fail "$component-$node is not Ready"; }
	done
	kubectl -n kube-system rollout status daemonset/kube-proxy --timeout=600s >/dev/null || { dump; fail "kube-proxy did not roll out"; }
	kubectl -n kube-system rollout status deployment/coredns --timeout=600s >/dev/null || { dump; fail "CoreDNS did not roll out"; }
	kubectl -n kube-system get pods -o wide >&2
	# Each of them is scute's: a running container whose process sits in the kubelet's
	# kubepods.slice (the systemd driver), not in system.slice.
	local id pid cgroup
	for component in etcd kube-apiserver kube-controller-manager kube-scheduler kube-proxy coredns; do
		# (sed reads all of it: `head -n 1` left crictl a SIGPIPE, which pipefail made a failure)
		id=$(crictl ps -q --name "^$component\$" --state running | sed -n 1p)
		[[ -n $id ]] || { dump; fail "crictl ps shows no running $component container"; }
		pid=$(crictl inspect -o go-template --template '{{.info.pid}}' "$id")
		cgroup=$(sed -n 's/^0:://p' "/proc/$pid/cgroup")
		[[ $cgroup == /kubepods.slice/* ]] || { dump; fail "$component ($pid) is in $cgroup, not under kubepods.slice"; }
	done
	log "control plane, kube-proxy and CoreDNS running on scute under kubepods.slice: $((SECONDS - started)) s"

	# A workload on the control-plane node: a Deployment behind a Service, reached by its DNS
	# name (CoreDNS) through its ClusterIP (kube-proxy) from another pod.
	kubectl taint nodes --all node-role.kubernetes.io/control-plane- >/dev/null
	# With a readiness probe: under TCG agnhost takes tens of seconds to listen after it starts,
	# and without one the Deployment counts it available (and the Service sends to it) at once.
	kubectl apply -f - >/dev/null <<-EOF
		{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "labels": {"app": "web"}},
		 "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
		  "template": {"metadata": {"labels": {"app": "web"}},
		   "spec": {"containers": [{"name": "agnhost", "image": "registry.k8s.io/e2e-test-images/agnhost:2.63.0",
		    "args": ["netexec", "--http-port=8080"], "ports": [{"containerPort": 8080}],
		    "readinessProbe": {"httpGet": {"path": "/hostname", "port": 8080}, "periodSeconds": 2, "timeoutSeconds": 5}}]}}}}
	EOF
	kubectl expose deployment web --port=80 --target-port=8080 >/dev/null
	kubectl rollout status deployment/web --timeout=300s >/dev/null || { dump; fail "the web Deployment did not roll out"; }
	local web_pod answer web_ip cluster_ip dns_ip
	web_pod=$(kubectl get pods -l app=web -o jsonpath='{.items[0].metadata.name}')
	web_ip=$(kubectl get pod "$web_pod" -o jsonpath='{.status.podIP}')
	cluster_ip=$(kubectl get service web -o jsonpath='{.spec.clusterIP}')
	dns_ip=$(kubectl -n kube-system get service kube-dns -o jsonpath='{.spec.clusterIP}')
	# Each hop on its own first, so a failure says which one: the pod network, kube-proxy's rules,
	# CoreDNS (from the node), then all of them from a pod.
	curl -sf -m 10 "http://$web_ip:8080/hostname" >/dev/null || { dump; fail "the web pod does not answer at $web_ip:8080 from the node"; }
	curl -sf -m 10 "http://$cluster_ip/hostname" >/dev/null ||
		{ dump; proxy_dump; fail "the Service's ClusterIP $cluster_ip does not answer from the node (kube-proxy's rules)"; }
	busybox nslookup web.default.svc.cluster.local "$dns_ip" >/dev/null 2>&1 ||
		{ dump; proxy_dump; fail "CoreDNS ($dns_ip) does not resolve web.default.svc.cluster.local from the node: $(busybox nslookup web.default.svc.cluster.local "$dns_ip" 2>&1 | tail -n 3)"; }
	# `timeout 10 wget`, not `wget -T 10`: Debian 12's busybox (1.35.0-4+deb12u1, which the
	# stand-in image carries) segfaults on -T, on any host. Not `kubectl run -i`: its attach gave
	# up on the emulated API server ("couldn't fetch pre-attach logs: context deadline exceeded")
	# after the client had run.
	kubectl run client --image=registry.k8s.io/e2e-test-images/busybox:1.36.1-1 --restart=Never \
		-- sh -c "cat /etc/resolv.conf; nslookup web.default.svc.cluster.local; echo '-- by ClusterIP:'; \
			timeout 10 wget -q -O - http://$cluster_ip/hostname; echo; echo '-- by name:'; \
			timeout 10 wget -q -O - http://web.default.svc.cluster.local/hostname" >/dev/null
	kubectl wait --for=jsonpath='{.status.phase}'=Succeeded pod/client --timeout=300s >/dev/null ||
		{ dump; proxy_dump; fail "a pod could not reach the Service by name: $(crictl logs "$(crictl ps -a -q --name '^client$' | sed -n 1p)" 2>&1 | tail -n 20)"; }
	answer=$(kubectl logs client | tail -n 1)
	kubectl delete pod client --wait=false >/dev/null
	[[ $answer == "$web_pod" ]] || { dump; fail "http://web.default.svc.cluster.local/hostname answered '$answer', not $web_pod"; }
	[[ $(kubectl exec "$web_pod" -- cat /etc/hostname) == "$web_pod" ]] || { dump; fail "kubectl exec through the API server"; }
	kubectl logs "$web_pod" | grep 'GET /hostname' >/dev/null || { dump; fail "kubectl logs does not show the request: $(kubectl logs "$web_pod" | tail -n 5)"; }
	log "Service web reached by DNS name from a pod; kubectl exec and logs through the API server: $((SECONDS - started)) s"

	# kubeadm reset removes every pod through scute's CRI.
	kubeadm reset -f --cri-socket unix:///run/scute/scute.sock >"$state/kubeadm-reset.log" 2>&1 ||
		{ tail -n 20 "$state/kubeadm-reset.log" >&2 && fail "kubeadm reset failed"; }
	if [[ -n $(crictl pods -q) ]]; then
		# (kubeadm reset only warns when its StopPodSandbox/RemovePodSandbox calls fail.)
		grep -iE 'fail|error|warn' "$state/kubeadm-reset.log" | tail -n 20 >&2 || true
		journalctl -u scute --no-pager -o short-precise --since "-10min" 2>&1 |
			grep -E 'PodSandbox|WARN|ERROR' | cut -c1-300 | tail -n 40 >&2
		fail "pods left after kubeadm reset: $(crictl pods)"
	fi
	wait_no_scute_units
	log "kubeadm reset: no pod or scope left; the step took $((SECONDS - started)) s"
	# The pass, recorded in the repo (shared read-write): hack/test.sh runs this step again when
	# its inputs change (hack/vm.sh kubeadm-inputs).
	echo "$(hack/vm.sh kubeadm-inputs | cut -d' ' -f1) $(date -u +%Y-%m-%d) $((SECONDS - started))s $(git -C "$repo_root" rev-parse --short HEAD 2>/dev/null || echo '?')" \
		>hack/vm/kubeadm/passed

	systemctl disable -q --now kubelet
	dpkg -P scute >/dev/null
	rm -rf /etc/cni/net.d/10-kubeadm-bridge.conflist /etc/scute
	[[ ! -e /etc/scute.hand ]] || mv /etc/scute.hand /etc/scute
	install_scute
}

# No step named, or "default" among them: the default steps (there, in their order).
default_steps=(facts service critest kubelet integration checkpoint bench package reboot powercut)
steps=()
for s in "${@:-default}"; do
	if [[ $s == default ]]; then
		steps+=("${default_steps[@]}")
	else
		steps+=("$s")
	fi
done
for s in "${steps[@]}"; do
	if [[ -e $state/$s.done ]]; then
		continue
	fi
	"step_$s"
	: >"$state/$s.done"
	# On the disk before a later step's power cut can take it.
	sync
done
end_step
log "all VM node steps passed"
