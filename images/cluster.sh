#!/usr/bin/env bash
# Builds the images a Kubernetes cluster on scute needs (hack/cluster.sh) and the images the
# Conformance specs it runs ask for, from the field's binaries (../shared/tools) and the busybox
# and nginx rootfs dirs images/build.sh assembles, and pushes them to a registry:
#
#   images/cluster.sh REGISTRY_ADDR TOOLS_DIR       (after images/build.sh REGISTRY_ADDR)
#
# Images, as REGISTRY/PATH (the nodes' mirrors send registry.k8s.io/PATH here):
#   coredns/coredns:v1.14.2            /coredns (kubeadm 1.36's CoreDNS image name; the binary
#                                      is CoreDNS 1.13.1 with the kubernetes plugin)
#   e2e-test-images/agnhost:2.63.0, :2.55
#                                      busybox rootfs + /agnhost, ENTRYPOINT /agnhost, CMD pause
#                                      (as upstream's; its alpine tools are busybox's here)
#   e2e-test-images/busybox:1.36.1-1, :1.37.0-1
#                                      busybox rootfs, CMD sh
#   e2e-test-images/nginx:1.27-0, :1.15-4
#                                      Debian's nginx on :80 (images/build.sh's rootfs)
#   e2e-test-images/nonroot:1.5        busybox rootfs, USER 1234
#   pause:3.10.2                       the static /pause of this repo
# Pushing skips blobs the registry has: a re-run is quick.
set -euo pipefail

registry=${1:?usage: $0 REGISTRY_ADDR TOOLS_DIR}
tools=${2:?usage: $0 REGISTRY_ADDR TOOLS_DIR}

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
target_dir=${CARGO_TARGET_DIR:-$repo_root/target}
work=$target_dir/images
kit=$target_dir/release/scute-imagekit
umask 022

log() { echo "cluster.sh (images): $*" >&2; }
die() {
	log "$*"
	exit 1
}

[[ -x $kit && -d $work/rootfs/busybox && -d $work/rootfs/nginx && -d $work/rootfs/pause ]] ||
	die "run images/build.sh $registry first (it builds the kit and the busybox, nginx and pause rootfs dirs)"
for t in coredns agnhost; do
	[[ -x $tools/$t ]] || die "$tools/$t missing (../shared/tools/install.sh DIR $t)"
done

# images/build.sh's lock: its rootfs dirs are not rebuilt under us.
exec 9>"$work/.lock"
flock 9

push() {
	local name=$1 ref=$2
	shift 2
	local push_args=()
	while (($#)) && [[ $1 != -- ]]; do
		push_args+=("$1")
		shift
	done
	[[ ${1:-} == -- ]] && shift
	"$kit" build --out "$work/layouts/cluster-$name" "$@" >/dev/null
	"$kit" push --layout "$work/layouts/cluster-$name" --to "$registry/$ref" --plain-http "${push_args[@]}"
}

one_file_rootfs() {
	local dir=$work/rootfs/cluster-$1 src=$2 dest=$3
	rm -rf "$dir"
	mkdir -p "$dir$(dirname "$dest")"
	install -m 0755 "$src" "$dir$dest"
	echo "$dir"
}

path=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
bb=$work/rootfs/busybox

log "building and pushing to $registry"
coredns=$(one_file_rootfs coredns "$tools/coredns" /coredns)
mkdir -p "$coredns/etc/coredns"
push coredns coredns/coredns:v1.14.2 -- --rootfs "$coredns" \
	--entrypoint '["/coredns"]' --expose 53/tcp --expose 53/udp --label scute.test/image=coredns

agnhost=$(one_file_rootfs agnhost "$tools/agnhost" /agnhost)
push agnhost e2e-test-images/agnhost:2.63.0 --also-tag 2.55 -- --rootfs "$bb" --rootfs "$agnhost" \
	--env "$path" --entrypoint '["/agnhost"]' --cmd '["pause"]' --label scute.test/image=agnhost

push busybox-1.36 e2e-test-images/busybox:1.36.1-1 --also-tag 1.37.0-1 -- --rootfs "$bb" \
	--env "$path" --cmd '["sh"]' --label scute.test/image=e2e-test-images/busybox:1.36

push nginx-new e2e-test-images/nginx:1.27-0 --also-tag 1.15-4 -- --rootfs "$work/rootfs/nginx" \
	--env "$path" --cmd '["nginx","-g","daemon off;"]' --expose 80/tcp \
	--stop-signal SIGQUIT --label scute.test/image=e2e-test-images/nginx:1.27

push nonroot e2e-test-images/nonroot:1.5 -- --rootfs "$bb" \
	--env "$path" --cmd '["sh"]' --user 1234 --label scute.test/image=e2e-test-images/nonroot

push pause-3.10.2 pause:3.10.2 -- --rootfs "$work/rootfs/pause" \
	--entrypoint '["/pause"]' --user 65535:65535 --label scute.test/image=pause:3.10.2
log "done"
