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
#                                      busybox rootfs + /agnhost, ENTRYPOINT /agnhost, CMD pause,
#                                      and the tools upstream's image has from alpine and the
#                                      suite calls: bash, curl, nc (OpenBSD's), ip, dig and
#                                      nslookup, this host's binaries with their libraries
#   e2e-test-images/busybox:1.36.1-1, :1.37.0-1
#                                      busybox rootfs, CMD sh
#   e2e-test-images/nginx:1.27-0, :1.15-4
#                                      Debian's nginx on :80 (images/build.sh's rootfs)
#   e2e-test-images/glibc-dns-testing:2.0.0
#                                      busybox rootfs + dig and glibc's getent (the DNS specs'
#                                      querier)
#   e2e-test-images/nonroot:1.5        busybox rootfs, USER 1234
#   e2e-test-images/nonewprivs:1.4     images/build.sh's nonewprivs image (:1.3) under the
#                                      suite's tag
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
# copy_at_same_path, copy_libraries, build_and_push
source "$repo_root/images/lib.sh"

[[ -x $kit && -d $work/rootfs/busybox && -d $work/rootfs/nginx && -d $work/rootfs/pause ]] ||
	die "run images/build.sh $registry first (it builds the kit and the busybox, nginx and pause rootfs dirs)"
for t in coredns agnhost; do
	[[ -x $tools/$t ]] || die "$tools/$t missing (../shared/tools/install.sh DIR $t)"
done

# images/build.sh's lock: its rootfs dirs are not rebuilt under us.
exec 9>"$work/.lock"
flock 9

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
build_and_push cluster-coredns "$coredns" coredns/coredns:v1.14.2 -- \
	--entrypoint '["/coredns"]' --expose 53/tcp --expose 53/udp --label scute.test/image=coredns

agnhost=$(one_file_rootfs agnhost "$tools/agnhost" /agnhost)
for bin in /usr/bin/bash /usr/bin/curl /usr/bin/dig /usr/bin/nslookup /usr/bin/ip; do
	[[ -x $bin ]] || die "$bin missing: run hack/setup.sh"
	copy_at_same_path "$bin" "$agnhost"
	copy_libraries "$bin" "$agnhost"
done
[[ -x /bin/nc.openbsd ]] || die "/bin/nc.openbsd missing: run hack/setup.sh"
install -D -m 0755 /bin/nc.openbsd "$agnhost/usr/bin/nc"
copy_libraries /bin/nc.openbsd "$agnhost"
mkdir -p "$agnhost/bin"
ln -s /usr/bin/bash "$agnhost/bin/bash"
build_and_push cluster-agnhost "$bb" e2e-test-images/agnhost:2.63.0 --also-tag 2.55 -- --rootfs "$agnhost" \
	--env "$path" --entrypoint '["/agnhost"]' --cmd '["pause"]' --label scute.test/image=agnhost

# glibc-dns-testing: the DNS specs' querier runs dig and glibc's getent hosts.
dnsq=$work/rootfs/cluster-dns-testing
rm -rf "$dnsq"
mkdir -p "$dnsq"
for bin in /usr/bin/dig /usr/bin/getent; do
	[[ -x $bin ]] || die "$bin missing: run hack/setup.sh"
	copy_at_same_path "$bin" "$dnsq"
	copy_libraries "$bin" "$dnsq"
done
build_and_push cluster-glibc-dns-testing "$bb" e2e-test-images/glibc-dns-testing:2.0.0 -- --rootfs "$dnsq" \
	--env "$path" --cmd '["sh"]' --label scute.test/image=e2e-test-images/glibc-dns-testing

build_and_push cluster-busybox-1.36 "$bb" e2e-test-images/busybox:1.36.1-1 --also-tag 1.37.0-1 -- \
	--env "$path" --cmd '["sh"]' --label scute.test/image=e2e-test-images/busybox:1.36

build_and_push cluster-nginx-new "$work/rootfs/nginx" e2e-test-images/nginx:1.27-0 --also-tag 1.15-4 -- \
	--env "$path" --cmd '["nginx","-g","daemon off;"]' --expose 80/tcp \
	--stop-signal SIGQUIT --label scute.test/image=e2e-test-images/nginx:1.27

build_and_push cluster-nonroot "$bb" e2e-test-images/nonroot:1.5 -- \
	--env "$path" --cmd '["sh"]' --user 1234 --label scute.test/image=e2e-test-images/nonroot

# The suite's tag of images/build.sh's nonewprivs image (critest asks for :1.3).
"$kit" push --layout "$work/layouts/e2e-nonewprivs" --to "$registry/e2e-test-images/nonewprivs:1.4" --plain-http

build_and_push cluster-pause-3.10.2 "$work/rootfs/pause" pause:3.10.2 -- \
	--entrypoint '["/pause"]' --user 65535:65535 --label scute.test/image=pause:3.10.2
log "done"
