#!/usr/bin/env bash
# Everything CI runs (.ci/run calls this). Needs root; installs its system packages itself.
#
#   hack/test.sh            lint, unit tests, integration tests (with the kubelet suite),
#                           image kit end to end, critest, then the VM test node (hack/vm.sh
#                           test: systemd PID 1, pure cgroup v2, the systemd cgroup driver)
#   SCUTE_SKIP_VM=1 hack/test.sh      everything but the VM stage
#
# Integration tests start their own daemons and registries in temp dirs and remove them.
# crictl, critest and kubelet come from ../shared/tools (no registry has them): installed with
# its install.sh when it is beside the checkout; without it the kubelet suite and critest are
# skipped, and this says so. Each step's wall time is printed at the end.
set -euo pipefail

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

step "field tools: crictl, critest, kubelet (../shared/tools)"
shared_tools=$repo_root/../shared/tools
if [[ -x $shared_tools/install.sh ]]; then
	tools_dir=$("$shared_tools/install.sh")
	export SCUTE_TEST_TOOLS=$tools_dir PATH=$tools_dir:$PATH
	echo "test.sh: $(kubelet --version), $(crictl --version), critest from $tools_dir" >&2
else
	echo "test.sh: $shared_tools not found: the kubelet suite and critest are SKIPPED" \
		"(they need crictl, critest and kubelet, which no package registry has)" >&2
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

step "unit and integration tests"
# Two cores: the daemon tests are I/O bound, let them run in parallel.
cargo test --workspace --locked

step "test images: build with the image kit and push to a real local registry"
registry_dir=$(mktemp -d -t scute-test-registry.XXXXXX)
cleanup() {
	hack/registry.sh stop --dir "$registry_dir" >/dev/null 2>&1 || true
	rm -rf "$registry_dir"
}
trap 'cleanup; print_timings' EXIT
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
cleanup
trap print_timings EXIT

step "CRI conformance: critest"
# The debug build cargo test just built and tested (a release build would add minutes).
SCUTE_PROFILE=debug critest/run.sh

if [[ -n ${SCUTE_SKIP_VM:-} ]]; then
	echo "test.sh: SCUTE_SKIP_VM is set: the VM test node stage is SKIPPED" >&2
else
	step "VM test node: Debian 12, systemd PID 1, pure cgroup v2, systemd cgroup driver (hack/vm.sh test)"
	hack/vm.sh test
fi

step "all tests passed"
