#!/usr/bin/env bash
# A VM test node: a Debian 12 guest with systemd as PID 1 and pure cgroup v2, the kind of node
# production clusters run, booted with qemu on this host (which is cgroup v1 hybrid without
# systemd, and whose cgroup hierarchies must never be unmounted or moved, so it cannot become
# one itself).
#
#   hack/vm.sh deps                  install the host packages the VM needs (qemu, mmdebstrap)
#   hack/vm.sh build                 build the guest image (cached: reused while its inputs are
#                                    unchanged), print its dir
#   hack/vm.sh run [OPTIONS] -- COMMAND [ARGS...]
#                                    boot a throwaway copy of the image, run COMMAND as root in
#                                    the guest (cwd: this repo, shared at its host path), stream
#                                    its output here, power off, exit with COMMAND's status
#       --env NAME=VALUE             set in COMMAND's environment (repeatable)
#       --share DIR                  also share DIR at its host path (repeatable)
#       --mem MiB (6144)  --cpus N (2)  --timeout SECONDS (3600)
#   hack/vm.sh kubeadm-inputs        the hash of the kubeadm step's inputs (its step in
#                                    node-tests.sh, hack/vm/kubeadm/, images/kubeadm.sh), and
#                                    "passed" or "changed" against the hash its last pass recorded
#                                    in hack/vm/kubeadm/passed (hack/test.sh runs the step when
#                                    they changed)
#   hack/vm.sh shell [OPTIONS]       the same guest, interactive on its serial console (root, no
#                                    password; `poweroff` ends it)
#   hack/vm.sh test [--after FILE]   the VM stage of hack/test.sh: a host registry with the test
#                                    images, then hack/vm/node-tests.sh in the guest (its steps:
#                                    SCUTE_VM_STEPS; with "kubeadm" among them the registry also
#                                    gets the cluster's and kubeadm's images). --after:
#                                    build the guest image first, then wait until FILE exists
#                                    (hack/test.sh writes "ok" in it once the host's build of the
#                                    tested binaries is done; anything else ends the stage).
#                                    SCUTE_VM_TIMEOUT: the guest's limit (3600 s). The power-cut
#                                    test (issue 40), 50 cuts: SCUTE_VM_STEPS="facts powercut"
#                                    SCUTE_VM_POWERCUT_CUTS=50 SCUTE_VM_TIMEOUT=7200 hack/vm.sh test
#
# How it works:
# - The image is built from Debian's packages only (mmdebstrap, with the host's Debian mirror):
#   linux-image-amd64 (its initramfs mounts the virtio root), systemd, dbus, the CNI plugins,
#   iptables, docker-registry, the libraries scute links. An ext4 root image (mke2fs -d, no mount
#   needed), the kernel and the initrd go to /var/cache/scute-vm/<hash of the inputs>/.
# - Each run boots a qcow2 overlay of that image in a temp dir (removed at exit), so every run
#   starts from the same clean node. Networking is qemu's user mode: the guest reaches the host's
#   loopback as 10.0.2.2, which is how it reaches the host's registry; no tap device.
# - Acceleration: KVM when a probe boot of the kernel finishes within seconds (nested KVM hangs
#   at boot on this machine kind), else TCG (about a tenth of host speed).
# - The repo and each --share are virtio-9p mounts at the same absolute path in the guest (test
#   binaries hold absolute paths). A unit in the guest runs the job the host wrote into a per-run
#   9p dir (`job`), writes its output to `output` (tailed here) and its status to `status`, then
#   powers off.
# - Cleanup on exit, error or signal: qemu killed, temp dir removed.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache_root=${SCUTE_VM_CACHE:-/var/cache/scute-vm}
guest_files=$repo_root/hack/vm/guest

log() { echo "vm.sh: $*" >&2; }
die() {
	log "$*"
	exit 1
}

usage() {
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//' >&2
	exit 2
}

# The guest's packages (Debian 12).
packages=(
	linux-image-amd64 initramfs-tools systemd systemd-sysv dbus udev kmod
	iproute2 iptables iputils-ping containernetworking-plugins conntrack ethtool socat
	docker-registry apache2-utils busybox curl ca-certificates openssl file procps util-linux
	mount e2fsprogs python3 libseccomp2 libelf1 zlib1g criu
)
mirrors=(
	"deb http://deb.debian.org/debian bookworm main"
	"deb http://deb.debian.org/debian bookworm-updates main"
	"deb http://deb.debian.org/debian-security bookworm-security main"
)

install_host_packages() {
	local missing=() pkg round
	# Twice: a qemu-utils from bookworm-backports (some machine images have one) conflicts with
	# bookworm's qemu-system-x86, so installing that removes it; the second round puts back
	# bookworm's qemu-utils (qemu-img).
	for round in 1 2; do
		missing=()
		for pkg in mmdebstrap qemu-system-x86 qemu-utils e2fsprogs; do
			[[ $(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true) == "install ok installed" ]] || missing+=("$pkg")
		done
		((${#missing[@]})) || return 0
		log "installing ${missing[*]} (round $round)"
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 ||
			{ apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2; }
	done
	command -v qemu-img >/dev/null || die "qemu-img is missing after installing qemu-utils"
}

image_hash() {
	{
		printf '%s\n' "${packages[@]}" "${mirrors[@]}"
		sed -n '/^build_image()/,/^}/p' "${BASH_SOURCE[0]}"
		# Paths relative to the guest files: the same inputs hash the same in any checkout.
		(cd "$guest_files" && find . -type f -print0 | sort -z | xargs -0 sha256sum)
	} | sha256sum | cut -c1-16
}

image_dir() { echo "$cache_root/$(image_hash)"; }

build_image() {
	install_host_packages
	local dir started=$SECONDS
	dir=$(image_dir)
	if [[ -f $dir/root.img && -f $dir/vmlinuz && -f $dir/initrd.img ]]; then
		log "reusing the guest image $dir"
		echo "$dir"
		return 0
	fi
	mkdir -p "$cache_root"
	local tmp
	tmp=$(mktemp -d "$cache_root/.build.XXXXXX")
	# shellcheck disable=SC2064 # expand now: the trap must remove this build's dir
	trap "rm -rf --one-file-system '$tmp'" EXIT
	log "building the guest image (mmdebstrap: ${#packages[@]} packages)"
	local include
	include=$(
		IFS=,
		echo "${packages[*]}"
	)
	mmdebstrap --variant=minbase --include="$include" \
		--aptopt='Acquire::Retries "3"' \
		--dpkgopt='path-exclude=/usr/share/{doc,man,locale,info}/*' \
		--customize-hook="cp -a '$guest_files'/. \"\$1\"/" \
		--customize-hook='chroot "$1" /bin/sh /usr/local/sbin/scute-vm-setup' \
		bookworm "$tmp/rootfs" "${mirrors[@]}" >"$tmp/mmdebstrap.log" 2>&1 ||
		{
			tail -n 40 "$tmp/mmdebstrap.log" >&2
			die "mmdebstrap failed"
		}
	cp "$tmp"/rootfs/boot/vmlinuz-* "$tmp/vmlinuz"
	cp "$tmp"/rootfs/boot/initrd.img-* "$tmp/initrd.img"
	mke2fs -q -t ext4 -L scute-vm -d "$tmp/rootfs" "$tmp/root.img" 8G >&2
	rm -rf --one-file-system "$tmp/rootfs"
	# Older images go; a build in progress elsewhere (.build.*) is left alone.
	find "$cache_root" -mindepth 1 -maxdepth 1 -type d ! -name '.build.*' ! -path "$dir" -exec rm -rf {} +
	mv "$tmp" "$dir"
	trap - EXIT
	log "guest image built in $((SECONDS - started)) s: $dir ($(du -sh --apparent-size "$dir" | cut -f1) apparent, $(du -sh "$dir" | cut -f1) on disk)"
	echo "$dir"
}

# --- running the guest -------------------------------------------------------------------

mem=6144
cpus=2
timeout_s=3600
envs=()
shares=()
command_args=()

parse_run_args() {
	while (($#)); do
		case $1 in
		--env) envs+=("${2:?--env needs NAME=VALUE}") && shift 2 ;;
		--share) shares+=("$(cd "${2:?--share needs a dir}" && pwd)") && shift 2 ;;
		--mem) mem=${2:?} && shift 2 ;;
		--cpus) cpus=${2:?} && shift 2 ;;
		--timeout) timeout_s=${2:?} && shift 2 ;;
		--) shift && command_args=("$@") && return 0 ;;
		*) usage ;;
		esac
	done
}

run_dir=""
qemu_pid=""
cleanup_run() {
	local status=$?
	set +e
	if [[ -n $qemu_pid ]] && kill -0 "$qemu_pid" 2>/dev/null; then
		kill -TERM "$qemu_pid" 2>/dev/null
		for _ in $(seq 50); do kill -0 "$qemu_pid" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$qemu_pid" 2>/dev/null
		wait "$qemu_pid" 2>/dev/null
	fi
	[[ -n ${tail_pid:-} ]] && kill "$tail_pid" 2>/dev/null
	[[ -n $run_dir ]] && rm -rf --one-file-system "$run_dir"
	exit "$status"
}

# KVM if a bare kernel boot under it reaches its (expected) panic and reboot within seconds.
accel=""
probe_accel() {
	local image=$1
	accel=tcg
	[[ -w /dev/kvm ]] || return 0
	local started=$SECONDS
	# (The braces keep bash's "Aborted" note about qemu's abort under a hanging KVM quiet.)
	if { (timeout 20 qemu-system-x86_64 -accel kvm -cpu host -m 256 -display none -no-reboot \
		-kernel "$image/vmlinuz" -append "console=ttyS0 panic=-1 root=/dev/nonexistent" \
		-serial null -monitor none >/dev/null); } 2>/dev/null; then
		accel=kvm
	fi
	log "acceleration: $accel (KVM probe $((SECONDS - started)) s)"
}

# Boots the guest. $1: "job" (run the job in $run_dir/share, serial to a log) or "shell".
boot() {
	local mode=$1 image
	image=$(build_image)
	probe_accel "$image"
	run_dir=$(mktemp -d /tmp/scute-vm.XXXXXX)
	mkdir -p "$run_dir/share"
	qemu-img create -q -f qcow2 -F raw -b "$image/root.img" "$run_dir/root.qcow2"

	local args=(
		-machine q35 -accel "$accel" -cpu max -smp "$cpus" -m "$mem"
		-kernel "$image/vmlinuz" -initrd "$image/initrd.img"
		-drive "file=$run_dir/root.qcow2,if=virtio,format=qcow2,cache=unsafe,discard=unmap"
		-netdev user,id=n0 -device virtio-net-pci,netdev=n0
		-device virtio-rng-pci
		-display none
		-virtfs "local,path=$run_dir/share,mount_tag=scutevm,security_model=none"
	)
	[[ $accel == kvm ]] && args[5]=host
	local i=0 dir mounts=()
	for dir in "$repo_root" "${shares[@]}"; do
		args+=(-virtfs "local,path=$dir,mount_tag=share$i,security_model=none")
		mounts+=("share$i $dir")
		i=$((i + 1))
	done
	local append="root=/dev/vda rw console=ttyS0 systemd.unified_cgroup_hierarchy=1 quiet loglevel=3 systemd.show_status=false"
	printf '%s\n' "${mounts[@]}" >"$run_dir/share/mounts"
	if [[ $mode == shell ]]; then
		: >"$run_dir/share/shell"
		exec qemu-system-x86_64 "${args[@]}" -append "$append" -serial mon:stdio
	fi
	{
		echo "cd '$repo_root'"
		local e
		for e in "${envs[@]}"; do printf 'export %q\n' "$e"; done
		printf '%q ' "${command_args[@]}"
		echo
	} >"$run_dir/share/job"
	qemu-system-x86_64 "${args[@]}" -append "$append" -serial "file:$run_dir/console.log" -monitor none &
	qemu_pid=$!
}

run() {
	parse_run_args "$@"
	((${#command_args[@]})) || usage
	trap cleanup_run EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
	local started=$SECONDS
	boot job
	log "guest booting (qemu pid $qemu_pid, ${cpus} vCPUs, ${mem} MiB)"
	local ran_at="" deadline=$((SECONDS + timeout_s))
	: >"$run_dir/share/output"
	tail -n +1 -F "$run_dir/share/output" 2>/dev/null &
	tail_pid=$!
	while kill -0 "$qemu_pid" 2>/dev/null; do
		if [[ -z $ran_at && -e $run_dir/share/started ]]; then
			ran_at=$SECONDS
			log "boot took $((ran_at - started)) s; running: ${command_args[*]}"
		fi
		if ((SECONDS > deadline)); then
			log "timed out after ${timeout_s} s; console tail:"
			tail -n 30 "$run_dir/console.log" >&2
			die "killed the guest"
		fi
		sleep 0.5
	done
	wait "$qemu_pid" || true
	qemu_pid=""
	sleep 0.3
	kill "$tail_pid" 2>/dev/null || true
	if [[ ! -f $run_dir/share/status ]]; then
		log "the guest stopped without running the command to its end; console tail:"
		tail -n 40 "$run_dir/console.log" >&2 2>/dev/null
		die "no status from the guest"
	fi
	local status
	status=$(<"$run_dir/share/status")
	local finished_at
	finished_at=$(stat -c %Y "$run_dir/share/status")
	log "command exited $status after $((SECONDS - ${ran_at:-$started})) s; total with boot and poweroff $((SECONDS - started)) s ($(date -d @"$finished_at" +%T) status written)"
	return "$status"
}

shell() {
	parse_run_args "$@" --
	trap cleanup_run EXIT
	boot shell
}

# The VM stage: the host's registry with the test images; node-tests.sh in the guest.
vm_test() {
	[[ $(id -u) -eq 0 ]] || die "must run as root"
	local started=$SECONDS registry_dir port
	if [[ ${1:-} == --after ]]; then
		local after=${2:?--after needs a file}
		build_image >/dev/null
		log "guest image ready in $((SECONDS - started)) s; waiting for the host's build ($after)"
		while [[ ! -s $after ]]; do sleep 2; done
		[[ $(<"$after") == ok ]] || die "the host's build did not finish ($(<"$after")): no VM stage"
		log "the host's build is done: the VM stage starts $((SECONDS - started)) s after its image build did"
		started=$SECONDS
	fi
	registry_dir=$(mktemp -d -t scute-vm-registry.XXXXXX)
	# shellcheck disable=SC2064
	trap "'$repo_root/hack/registry.sh' stop --dir '$registry_dir' >/dev/null 2>&1; rm -rf '$registry_dir'" EXIT
	port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
	"$repo_root/hack/registry.sh" start --addr "127.0.0.1:$port" --dir "$registry_dir" >/dev/null
	"$repo_root/images/build.sh" "127.0.0.1:$port" >"$registry_dir/build.log" 2>&1 ||
		{ tail -n 20 "$registry_dir/build.log" >&2; die "images/build.sh failed"; }
	if [[ " ${SCUTE_VM_STEPS:-} " == *" kubeadm "* ]]; then
		# kubeadm's control plane and add-ons: its images, made from the field's binaries.
		[[ -n ${SCUTE_TEST_TOOLS:-} ]] || die "the kubeadm step needs SCUTE_TEST_TOOLS (../shared/tools/install.sh DIR kubeadm kubelet kubectl kube-apiserver kube-controller-manager kube-scheduler kube-proxy etcd coredns agnhost sample-apiserver)"
		{ "$repo_root/images/cluster.sh" "127.0.0.1:$port" "$SCUTE_TEST_TOOLS" &&
			"$repo_root/images/kubeadm.sh" "127.0.0.1:$port" "$SCUTE_TEST_TOOLS"; } >>"$registry_dir/build.log" 2>&1 ||
			{ tail -n 20 "$registry_dir/build.log" >&2; die "images/cluster.sh or images/kubeadm.sh failed"; }
	fi
	log "host registry 127.0.0.1:$port (10.0.2.2:$port in the guest) with the test images, $((SECONDS - started)) s"
	# Two versions of the package from the tested debug binaries, for the guest's install and
	# upgrade (target/debian/vm is shared with the guest at its host path).
	local base pkg_dir=$repo_root/target/debian/vm
	base=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo_root/Cargo.toml" | head -n 1)
	rm -rf "$pkg_dir"
	for v in "$base+vm1" "$base+vm2"; do
		"$repo_root/hack/package.sh" --profile debug --version "$v" --out "$pkg_dir" >/dev/null
	done
	log "packages $base+vm1 and $base+vm2 built in $pkg_dir"
	local args=(--env "SCUTE_TEST_REGISTRY=10.0.2.2:$port" --env SCUTE_TEST_NO_BUILD=1)
	if [[ -n ${SCUTE_TEST_TOOLS:-} ]]; then
		args+=(--share "$SCUTE_TEST_TOOLS" --env "SCUTE_TEST_TOOLS=$SCUTE_TEST_TOOLS")
	fi
	local e
	for e in SCUTE_VM_KUBELET_TESTS SCUTE_VM_INTEGRATION SCUTE_VM_CRITEST_ARGS SCUTE_VM_LOG_LEVEL SCUTE_VM_POWERCUT_CUTS; do
		[[ -n ${!e+set} ]] && args+=(--env "$e=${!e}")
	done
	# (Not `(run ...) || status=$?`: errexit is off inside a `||` list, even in a subshell.)
	set +e
	# shellcheck disable=SC2086 # the step names
	(
		set -e
		run "${args[@]}" --timeout "${SCUTE_VM_TIMEOUT:-3600}" -- hack/vm/node-tests.sh ${SCUTE_VM_STEPS:-}
	)
	local status=$?
	set -e
	log "VM stage: $((SECONDS - started)) s, status $status"
	return "$status"
}

# The kubeadm step's inputs: what it runs and what it is given, not scute itself (every run's
# host cluster stage covers scute under a control plane).
kubeadm_inputs() {
	local hash recorded
	hash=$(
		cd "$repo_root"
		{
			sed -n '/^step_kubeadm()/,/^}/p' hack/vm/node-tests.sh
			sha256sum images/kubeadm.sh hack/vm/kubeadm/*.service hack/vm/kubeadm/*.conf hack/vm/kubeadm/*.yaml hack/vm/kubeadm/patches/*
		} | sha256sum | cut -c1-16
	)
	recorded=$(cut -d' ' -f1 "$repo_root/hack/vm/kubeadm/passed" 2>/dev/null || true)
	if [[ $hash == "$recorded" ]]; then echo "$hash passed"; else echo "$hash changed"; fi
}

case ${1:-} in
kubeadm-inputs) kubeadm_inputs && exit 0 ;;
esac
[[ $(id -u) -eq 0 ]] || die "must run as root (qemu's 9p shares as root, the image build)"
case ${1:-} in
deps) install_host_packages ;;
build) build_image >/dev/null ;;
run) shift && run "$@" ;;
shell) shift && shell "$@" ;;
test) shift && vm_test "$@" ;;
*) usage ;;
esac
