#!/usr/bin/env bash
# Builds the control-plane images kubeadm v1.36 asks for (../shared/tools/kubeadm-images.txt)
# from the field's binaries, and pushes them to a registry:
#
#   images/kubeadm.sh REGISTRY_ADDR TOOLS_DIR       (after images/build.sh and images/cluster.sh,
#                                                   which push coredns, etcd and pause)
#
# Images, as REGISTRY/PATH (a node's mirrors send registry.k8s.io/PATH here):
#   kube-apiserver:v1.36.2, kube-controller-manager:v1.36.2, kube-scheduler:v1.36.2
#                          busybox rootfs + /usr/local/bin/<binary> (kubeadm's static pods run
#                          the command by name, found on the image's PATH)
#   kube-proxy:v1.36.2     the same with Debian's nftables-backed iptables (xtables-nft-multi,
#                          its extensions and libraries; the iptables mode runs iptables-restore
#                          and iptables-save, on the same backend as the node's own iptables)
# Upstream's images are distroless; these carry busybox too, as the rest of the kit's images do.
set -euo pipefail

registry=${1:?usage: $0 REGISTRY_ADDR TOOLS_DIR}
tools=${2:?usage: $0 REGISTRY_ADDR TOOLS_DIR}

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
target_dir=${CARGO_TARGET_DIR:-$repo_root/target}
work=$target_dir/images
kit=${SCUTE_IMAGEKIT:-$target_dir/release/scute-imagekit}
version=v1.36.2
umask 022

log() { echo "kubeadm.sh (images): $*" >&2; }
die() {
	log "$*"
	exit 1
}
# copy_at_same_path, copy_libraries, build_and_push
source "$repo_root/images/lib.sh"

[[ -x $kit && -d $work/rootfs/busybox ]] || die "run images/build.sh $registry first (it builds the kit and the busybox rootfs)"
for t in kube-apiserver kube-controller-manager kube-scheduler kube-proxy; do
	[[ -x $tools/$t ]] || die "$tools/$t missing (../shared/tools/install.sh DIR $t)"
done

exec 9>"$work/.lock"
flock 9

bb=$work/rootfs/busybox
path=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

log "building and pushing to $registry"
for component in kube-apiserver kube-controller-manager kube-scheduler kube-proxy; do
	dir=$work/rootfs/kubeadm-$component
	rm -rf "$dir"
	install -D -m 0755 "$tools/$component" "$dir/usr/local/bin/$component"
	if [[ $component == kube-proxy ]]; then
		xt=/usr/sbin/xtables-nft-multi
		[[ -x $xt && -d /usr/lib/x86_64-linux-gnu/xtables ]] || die "$xt missing: run hack/setup.sh (iptables)"
		copy_at_same_path "$xt" "$dir"
		copy_libraries "$xt" "$dir"
		for ext in /usr/lib/x86_64-linux-gnu/xtables/*.so; do
			copy_at_same_path "$ext" "$dir"
			copy_libraries "$ext" "$dir"
		done
		for name in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
			ln -s xtables-nft-multi "$dir/usr/sbin/$name"
		done
	fi
	build_and_push "kubeadm-$component" "$bb" "$component:$version" -- --rootfs "$dir" \
		--env "$path" --label "scute.test/image=$component"
done
log "done"
