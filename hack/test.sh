#!/usr/bin/env bash
# Everything CI runs (.ci/run calls this). Needs root; installs its system packages itself.
#
#   hack/test.sh            lint, build, unit and integration tests (with the kubelet suite),
#                           critest, a 2-node cluster (tests/cluster.rs and Conformance specs)
#                           on the host; beside them, from the build on, the VM test node
#                           (hack/vm.sh test: systemd PID 1, pure cgroup v2, the systemd driver)
#   SCUTE_SKIP_VM=1 hack/test.sh      everything but the VM stage
#   SCUTE_FUZZ_SECONDS=N hack/test.sh also every fuzz target for N s under libFuzzer at the end
#                           (hack/fuzz.sh; nextest runs the targets over their corpus anyway)
#   hack/test.sh --quick    the inner loop (a few minutes warm): format, lint, unit tests and
#                           the fast integration suites (foundation, images, sandboxes,
#                           containers); no critest, no kubelet, no VM
#
# Which suite runs where, and why:
# - the host (cgroup v1 hybrid, no systemd, the cgroupfs driver, kernel 6.18): every unit and
#   integration test, the kubelet suite, critest whole, the cluster stage (Debian's CRIU fails
#   `criu check` on 6.18: the checkpoint tests check that answer here and dump nothing);
# - the VM node (pure cgroup v2, systemd PID 1, the systemd driver, kernel 6.1, run under TCG at
#   about a tenth of host speed): what depends on those: scute.service with its scopes, critest
#   without the specs that touch no cgroup or init system (image service, streaming, host
#   namespaces, seccomp, idempotence; hack/vm/node-tests.sh lists them),
#   the kubelet suite's cgroup, stats, restart, image-volume and checkpoint-endpoint tests, the
#   CDI suite, the cgroup update tests with each driver (hugetlb, swap and unified keys
#   included), the stats tests (PSI included) with cgroupfs, checkpoint and restore with CRIU
#   (tests/checkpoint.rs, crictl, checkpointctl), the .deb, a reboot, three power cuts under a
#   pull and pod workload with every listed image checked file by file after each (issue 40's
#   50-cut run is on demand: docs/development.md).
#
# Tests run under cargo nextest (.config/nextest.toml): every test a process of its own, the
# suites side by side, one kubelet at a time; one registry filled with the test images serves
# every test (SCUTE_TEST_IMAGES_REGISTRY). The slowest tests are listed after the run and the
# JUnit report is kept in target/nextest/ci/junit.xml.
#
# Integration tests start their own daemons and registries in temp dirs and remove them.
# crictl, critest and kubelet come from ../shared/tools (no registry has them): installed with
# its install.sh when it is beside the checkout; without it the kubelet suite and critest are
# skipped, and this says so. Each step's wall time is printed at the end.
set -euo pipefail

quick=0
case ${1:-} in
--quick) quick=1 ;;
"") ;;
*)
	sed -n '2,/^set -euo/p' "$0" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//' >&2
	exit 2
	;;
esac

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"

# Step timings: "name seconds" lines, printed at exit (also when a step fails).
timings=()
step_name=""
step_start=$SECONDS
step() {
	end_step
	step_name=$*
	step_start=$SECONDS
	printf '\n==> %s\n' "$*" >&2
}
end_step() {
	[[ -n $step_name ]] && timings+=("$(printf '%6ds  %s' $((SECONDS - step_start)) "$step_name")")
	step_name=""
}
print_timings() {
	end_step
	printf '\n==> where the time went\n' >&2
	printf '%s\n' "${timings[@]}" >&2
	printf '%6ds  total\n' "$SECONDS" >&2
	disk_report
}
# The tests' daemons keep their stores under the temp dir and stop a pull that would leave
# less than 5% of its filesystem free ([image] min_free_disk_percent): a disk filled by
# something else makes every pull fail with ResourceExhausted, so say how full it is.
tmp_fs=${TMPDIR:-/tmp}
free_percent() {
	df -P -B1 "$tmp_fs" | awk 'NR==2 { print ($3 + $4 > 0) ? int($4 * 100 / ($3 + $4)) : 100 }'
}
disk_report() {
	printf '==> disk: %s%% of %s free (%s available), target/ holds %s\n' "$(free_percent)" "$tmp_fs" \
		"$(df -P -h "$tmp_fs" | awk 'NR==2 { print $4 }')" "$(du -sh target 2>/dev/null | cut -f1)" >&2
}

if [[ $(id -u) -ne 0 ]]; then
	echo "test.sh: must run as root (namespaces, mounts, cgroups, registries)" >&2
	exit 1
fi

trap print_timings EXIT

if (($(free_percent 2>/dev/null || echo 100) < 8)); then
	disk_report
	echo "test.sh: warning: the tests' pulls stop at 5% free (a build adds several GiB): free space first" >&2
fi

step "system packages"
hack/setup.sh

# The VM stage runs beside the host stages, in a session of its own (so that an exit here stops
# all of it, qemu included) and at a lower priority: it builds the guest image now (mmdebstrap:
# downloads and unpacks, little CPU), waits for the build step below, then boots the guest while
# the host's tests run, which mostly wait on processes, sockets and sleeps; the guest, emulated
# (TCG), takes what CPU they leave. Its output goes to target/vm-stage.log and is printed at the
# end. Its host packages are installed first, so no two apt runs meet.
vm_stage_pid=""
vm_stage_log=$repo_root/target/vm-stage.log
host_built=$repo_root/target/.host-build-status
stop_vm_stage() {
	[[ -n $vm_stage_pid ]] && kill -0 "$vm_stage_pid" 2>/dev/null || return 0
	echo "test.sh: stopping the VM stage (its log: $vm_stage_log)" >&2
	kill -TERM -- "-$vm_stage_pid" 2>/dev/null || true
	for _ in $(seq 100); do kill -0 "$vm_stage_pid" 2>/dev/null || break; sleep 0.1; done
}
finish() {
	stop_vm_stage
	print_timings
}
trap finish EXIT

step "field tools: crictl, critest, kubelet, the control plane, e2e.test, checkpointctl (../shared/tools)"
shared_tools=$repo_root/../shared/tools
if [[ -x $shared_tools/install.sh ]]; then
	tools_dir=$("$shared_tools/install.sh" /var/cache/scute-test-tools crictl critest kubelet \
		kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubectl etcd coredns agnhost sample-apiserver e2e.test \
		checkpointctl kubeadm)
	export SCUTE_TEST_TOOLS=$tools_dir PATH=$tools_dir:$PATH
	echo "test.sh: $(kubelet --version), $(crictl --version), critest from $tools_dir" >&2
else
	echo "test.sh: $shared_tools not found: the kubelet suite and critest are SKIPPED" \
		"(they need crictl, critest and kubelet, which no package registry has)" >&2
fi

# (After the field tools: the guest is given them, SCUTE_TEST_TOOLS.)
if ((!quick)) && [[ -z ${SCUTE_SKIP_VM:-} ]]; then
	hack/vm.sh deps
	mkdir -p target
	rm -f "$host_built"
	# (Its images/build.sh runs after the build step, which makes this kit.)
	export SCUTE_IMAGEKIT=$repo_root/target/debug/scute-imagekit
	# The kubeadm step (about 20-35 minutes under TCG) runs when what it runs or is given has
	# changed since it last passed (hack/vm/kubeadm/passed), last, once the host stages are done
	# and the host no longer starves the guest; every run's host cluster stage covers scute under
	# a control plane.
	if [[ -n ${SCUTE_TEST_TOOLS:-} && -z ${SCUTE_VM_STEPS:-} ]] && [[ $(hack/vm.sh kubeadm-inputs) == *changed ]]; then
		export SCUTE_VM_STEPS="default kubeadm"
		echo "test.sh: the kubeadm step's inputs changed since it last passed ($(hack/vm.sh kubeadm-inputs)): the VM stage runs it too" >&2
	fi
	setsid nice -n 10 hack/vm.sh test --after "$host_built" >"$vm_stage_log" 2>&1 </dev/null &
	vm_stage_pid=$!
	vm_stage_started=$SECONDS
	echo "test.sh: the VM stage runs beside the host stages: tail -f $vm_stage_log" >&2
fi

step "format and lint"
# rustfmt and clippy ship with the machine's rustup toolchain; nothing can fetch them offline.
if cargo fmt --version >/dev/null 2>&1; then
	cargo fmt --all --check
else
	echo "test.sh: rustfmt not installed; format check skipped" >&2
fi
if cargo clippy --version >/dev/null 2>&1; then
	cargo clippy --workspace --all-targets --locked -- -D warnings
else
	echo "test.sh: clippy not installed; lint skipped" >&2
fi

step "build (every binary and test target)"
# Built once here: each test process then uses the binaries as they are (SCUTE_TEST_NO_BUILD)
# instead of each running cargo, which would queue on the target dir's lock.
cargo build --workspace --locked --bins --tests
# The images are built with the debug image kit just built (its hashing and compression crates
# are optimised in debug builds too): a release kit would compile every dependency again.
export SCUTE_TEST_NO_BUILD=1 SCUTE_IMAGEKIT=$repo_root/target/debug/scute-imagekit
echo ok >"$host_built"

step "test images: build with the image kit and push to a real local registry"
# One registry for every test of the run (and the kubelet suite): tests that need a registry of
# their own (stopped under a daemon, with auth, hostile) still start one.
registry_dir=$(mktemp -d -t scute-test-registry.XXXXXX)
cleanup() {
	hack/registry.sh stop --dir "$registry_dir" >/dev/null 2>&1 || true
	rm -rf "$registry_dir"
}
trap 'cleanup; finish' EXIT
# A free loopback port, so a developer's registry on :5000 is left alone.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
hack/registry.sh start --addr "127.0.0.1:$port" --dir "$registry_dir" >/dev/null
images/build.sh "127.0.0.1:$port"
catalog=$(curl -fsS "http://127.0.0.1:$port/v2/_catalog")
for repo in pause e2e-test-images/busybox e2e-test-images/httpd e2e-test-images/nginx \
	e2e-test-images/nonewprivs library/busybox docker/library/busybox \
	k8s-staging-cri-tools/test-image-tags k8s-staging-cri-tools/test-image-predefined-group \
	k8s-staging-cri-tools/hostnet-nginx-amd64; do
	grep -q "\"$repo\"" <<<"$catalog" || { echo "test.sh: $repo missing from registry catalog: $catalog" >&2; exit 1; }
done
export SCUTE_TEST_IMAGES_REGISTRY=127.0.0.1:$port

# Prints the slowest tests of the JUnit report nextest just wrote.
slowest_tests() {
	local junit=target/nextest/ci/junit.xml
	[[ -f $junit ]] || return 0
	printf '\n==> the slowest tests (seconds)\n' >&2
	python3 - "$junit" <<-'PY' >&2
		import sys, xml.etree.ElementTree as ET
		cases = [(float(c.get("time", 0)), c.get("classname", ""), c.get("name", ""))
		         for c in ET.parse(sys.argv[1]).iter("testcase")]
		total = sum(t for t, _, _ in cases)
		for t, binary, name in sorted(cases, reverse=True)[:25]:
		    print(f"{t:8.1f}  {binary} {name}")
		print(f"{total:8.1f}  in all, {len(cases)} tests (test time summed over the parallel runs)")
	PY
}

step "unit and integration tests (cargo nextest)"
if ((quick)); then
	cargo nextest run --workspace --locked --profile ci \
		-E 'kind(lib) | kind(bin) | binary(foundation) | binary(images) | binary(sandboxes) | binary(containers)'
	slowest_tests
	step "quick checks passed"
	exit 0
fi
status=0
cargo nextest run --workspace --locked --profile ci || status=$?
slowest_tests
((status == 0)) || exit "$status"
cleanup
trap finish EXIT

step "CRI conformance: critest"
# The debug build cargo test just built and tested (a release build would add minutes).
SCUTE_PROFILE=debug critest/run.sh

if [[ -n ${tools_dir:-} ]]; then
	# One cluster for the run: the cluster tests and the Conformance specs share it.
	step "cluster: hack/cluster.sh up (2 nodes, each its own scute, kubelet and kube-proxy)"
	trap 'hack/cluster.sh down || true; finish' EXIT
	SCUTE_PROFILE=debug hack/cluster.sh up
	export SCUTE_CLUSTER_KUBECONFIG
	SCUTE_CLUSTER_KUBECONFIG=$(hack/cluster.sh kubeconfig)
	# What docs/cluster.md shows a user first: the components, nodes and kube-system's pods.
	hack/cluster.sh status

	step "cluster tests (tests/cluster.rs, through kubectl)"
	status=0
	# --workspace: the features the build step unified (a root-only build would compile again)
	cargo nextest run --workspace --locked --profile ci --test cluster || status=$?
	slowest_tests
	((status == 0)) || exit "$status"

	step "Conformance: hack/conformance.sh --ci (the specs that go through the runtime)"
	hack/conformance.sh --ci

	step "cluster: hack/cluster.sh down, nothing left"
	hack/cluster.sh down
	trap finish EXIT
	left=$(ip netns list | grep -o '^scute-node[0-9]*' || true)
	left+=$(ip -br link show sctc0 2>/dev/null || true)
	left+=$(pgrep -af '/(kubelet|kube-proxy|kube-apiserver|etcd) ' || true)
	[[ -z $left ]] || { echo "test.sh: the cluster left: $left" >&2; exit 1; }
	unset SCUTE_CLUSTER_KUBECONFIG
else
	echo "test.sh: the cluster stage is SKIPPED (Kubernetes' binaries come from ../shared/tools)" >&2
fi

if ((!quick)) && [[ -n ${SCUTE_FUZZ_SECONDS:-} ]]; then
	# Opt-in: building the targets for libFuzzer (release, ASan, coverage) takes longer cold
	# than the whole host build, so CI's own share is nextest's scute::fuzz tests (every kept
	# input, and a fixed pass of mutations of each, through every target).
	step "fuzzing: every target for $SCUTE_FUZZ_SECONDS s under libFuzzer (hack/fuzz.sh --all)"
	hack/fuzz.sh --all "$SCUTE_FUZZ_SECONDS"
fi

if [[ -n $vm_stage_pid ]]; then
	step "VM test node: Debian 12, systemd PID 1, pure cgroup v2, systemd cgroup driver (hack/vm.sh test, beside the host stages since $((vm_stage_started))s)"
	status=0
	wait "$vm_stage_pid" || status=$?
	vm_stage_pid=""
	cat "$vm_stage_log" >&2
	timings+=("$(printf '%6ds  (the VM stage, from the start of its image build to its end, beside the host stages)' $((SECONDS - vm_stage_started)))")
	((status == 0)) || { echo "test.sh: the VM stage failed (status $status)" >&2; exit "$status"; }
elif ((!quick)); then
	echo "test.sh: SCUTE_SKIP_VM is set: the VM test node stage is SKIPPED" >&2
fi

step "all tests passed"
