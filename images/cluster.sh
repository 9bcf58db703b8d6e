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
#                                      nslookup, getent, this host's binaries with their
#                                      libraries; /agnhost-2, /localhost.crt and .key
#   e2e-test-images/nautilus:1.8, kitten:1.8
#                                      agnhost with /data.json, CMD test-webserver (:80)
#   e2e-test-images/sample-apiserver:1.29.2, etcd:3.6.8-0
#                                      the field's sample-apiserver and etcd binaries (the
#                                      Aggregator spec's pod)
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
kit=${SCUTE_IMAGEKIT:-$target_dir/release/scute-imagekit}
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
for t in coredns agnhost sample-apiserver etcd; do
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
# The Containers specs run /agnhost-2 (upstream's image links it); two DNS specs resolve with
# `getent hosts` (busybox has no getent: glibc's, which reads /etc/hosts first as nsswitch.conf
# says); porter serves TLS with ./localhost.crt and .key from the working dir /, and the
# StatefulSet specs probe GET /localhost.crt through test-webserver and move it away and back.
# The key pair is made once here (upstream ships its own; any self-signed pair serves).
ln -s agnhost "$agnhost/agnhost-2"
copy_at_same_path /usr/bin/getent "$agnhost"
copy_libraries /usr/bin/getent "$agnhost"
mkdir -p "$agnhost/etc"
printf 'hosts: files dns\n' >"$agnhost/etc/nsswitch.conf"
tls=$work/cluster-agnhost-tls
if [[ ! -f $tls/localhost.key ]]; then
	mkdir -p "$tls"
	openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj /CN=localhost \
		-addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
		-keyout "$tls/localhost.key" -out "$tls/localhost.crt" 2>/dev/null
fi
install -m 0644 "$tls/localhost.crt" "$tls/localhost.key" "$agnhost/"
agnhost_config=(--env "$path" --entrypoint '["/agnhost"]' --workdir / --label scute.test/image=agnhost)
build_and_push cluster-agnhost "$bb" e2e-test-images/agnhost:2.63.0 --also-tag 2.55 -- --rootfs "$agnhost" \
	"${agnhost_config[@]}" --cmd '["pause"]'

# nautilus and kitten: agnhost serving their data.json (the Update Demo specs read it through the
# API server's pod proxy). kitten is only mounted, as an image volume: the ImageVolume spec reads
# its data.json and /etc/os-release, where it expects upstream's base, Alpine; this stand-in is
# busybox and agnhost from this host, and carries that file's words for the spec to find.
for animal in nautilus kitten; do
	layer=$work/rootfs/cluster-$animal
	rm -rf "$layer"
	mkdir -p "$layer/etc"
	printf '{"image": "%s.jpg"}\n' "$animal" >"$layer/data.json"
	if [[ $animal == kitten ]]; then
		printf '%s\n' 'NAME="Alpine Linux"' 'ID=alpine' \
			'PRETTY_NAME="Alpine Linux (a stand-in: busybox and agnhost, built by scute'"'"'s images/cluster.sh)"' \
			>"$layer/etc/os-release"
	fi
	build_and_push "cluster-$animal" "$bb" "e2e-test-images/$animal:1.8" -- --rootfs "$agnhost" --rootfs "$layer" \
		"${agnhost_config[@]}" --cmd '["test-webserver"]' --expose 80/tcp
done

# The Aggregator spec's pod: the sample API server (its binary as the entrypoint, given only
# arguments) beside etcd (run as /usr/local/bin/etcd with no data dir: it writes ./default.etcd
# under its working dir /).
sample=$(one_file_rootfs sample-apiserver "$tools/sample-apiserver" /sample-apiserver)
build_and_push cluster-sample-apiserver "$bb" e2e-test-images/sample-apiserver:1.29.2 -- --rootfs "$sample" \
	--env "$path" --entrypoint '["/sample-apiserver"]' --label scute.test/image=e2e-test-images/sample-apiserver
etcd_root=$(one_file_rootfs etcd "$tools/etcd" /usr/local/bin/etcd)
build_and_push cluster-etcd "$bb" etcd:3.6.8-0 -- --rootfs "$etcd_root" \
	--env "$path" --workdir / --expose 2379/tcp --expose 2380/tcp --label scute.test/image=etcd

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

# The suite's busybox is upstream's image, with every applet in /bin (the Sysctls spec runs
# /bin/sysctl). Its shell is Debian's busybox ash, which drops environment variables whose
# names are no shell identifiers (Debian reverts busybox's commit 9c143ce52 that keeps them):
# hack/conformance/skip.txt names the four specs that need upstream's behaviour.
bb_e2e=$work/rootfs/cluster-busybox-e2e
rm -rf "$bb_e2e"
mkdir -p "$bb_e2e/bin"
while read -r applet; do
	[[ $applet == bin/* || -z $applet ]] && continue
	ln -sf busybox "$bb_e2e/bin/${applet##*/}"
done < <(/bin/busybox --list-full)
build_and_push cluster-busybox-1.36 "$bb" e2e-test-images/busybox:1.36.1-1 --also-tag 1.37.0-1 -- --rootfs "$bb_e2e" \
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
