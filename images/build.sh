#!/usr/bin/env bash
# Builds the test images and pushes them to a registry (default: the one
# hack/registry.sh starts on 127.0.0.1:5000).
#
#   images/build.sh [REGISTRY_ADDR]
#   SCUTE_IMAGEKIT=PATH images/build.sh ...   use that scute-imagekit instead of building the
#                                            release one (hack/test.sh: its debug build's)
#
# Images (see /work/shared/critest-images.md for what each must contain), as
# REGISTRY/PATH: a node's mirrors (hack/mirrors.sh) send registry.k8s.io/PATH,
# docker.io/PATH, gcr.io/PATH and public.ecr.aws/PATH here.
#   e2e-test-images/busybox:1.29-2      busybox rootfs
#   library/busybox:latest, :1.36       busybox rootfs (one image, two tags)
#   e2e-test-images/httpd:2.4.39-4      busybox rootfs + busybox httpd on :80 (httpd-foreground)
#   e2e-test-images/nginx:1.14-2        busybox rootfs + Debian's nginx on :80
#   e2e-test-images/nonewprivs:1.3      busybox rootfs + setuid-root /usr/local/bin/nnp
#   pause:3.10, pause:3.9               the static /pause binary of this repo (two images;
#                                       critest/run.sh mirrors k8s.gcr.io here too)
#   k8s-staging-cri-tools/ (critest's gcr.io/k8s-staging-cri-tools/ images)
#     test-image-tag:test, :all         busybox + marker /test, /all (two images)
#     test-image-latest:latest          busybox + marker /latest
#     test-image-1, -2, -3 (:latest)    busybox + markers (three images)
#     test-image-tags:1, :2, :3         busybox + marker /tags (ONE image, three tags)
#     test-image-user-uid               USER 1002
#     test-image-user-username          USER www-data
#     test-image-user-uid-group         USER 1003:1004
#     test-image-user-username-group    USER www-data:1004
#     test-image-predefined-group       user default-user 1000 in group
#                                       group-defined-in-image 50000; USER 1000
#     hostnet-nginx-amd64               nginx listening on :12003
#   docker/library/busybox:1.35.0-glibc, :1-uclibc, :1, :1-glibc, :1-musl
#                                       busybox rootfs, one image per tag (image benchmarks)
# Not built: gcr.io/k8s-staging-cri-tools/test-image-digest@sha256:9700f9a2…,
# which is pinned to upstream's bytes.
#
# The busybox rootfs is Debian's dynamically linked busybox plus the shared
# libraries ldd lists, with every applet a hard link to /bin/busybox (a masked
# /bin/ls must not mask busybox itself), plus shell stand-ins for pgrep, pkill
# and ipcs (images/busybox-extras). nginx comes from Debian's nginx package,
# fetched with `apt-get download` into $target_dir/images/debs (apt-get update
# only when apt does not know the package or its .deb is gone from the mirror)
# and unpacked there, never installed
# on the host; its libraries are the host's (hack/setup.sh). Images are
# reproducible, and pushing skips blobs the registry has, so a re-run is quick
# and pushes the same digests.
set -euo pipefail

registry=${1:-127.0.0.1:5000}

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
target_dir=${CARGO_TARGET_DIR:-$repo_root/target}
work=$target_dir/images

# Modes of created files must not depend on the caller's umask.
umask 022

log() { echo "build.sh: $*" >&2; }
die() { log "$*"; exit 1; }

[[ $(id -u) -eq 0 ]] || die "must run as root (rootfs files are owned by root)"
[[ -x /bin/busybox ]] || die "/bin/busybox missing; run hack/setup.sh"
if [[ $(file -L /bin/busybox) != *'dynamically linked'* ]]; then
	die "/bin/busybox is not dynamically linked (busybox-static installed?); install Debian's busybox package"
fi

cd "$repo_root"

# pause must be static: it is the only file of its image. crt-static is set for
# an explicit --target only, so the flag does not reach host builds and the
# workspace's other crates stay dynamically linked (target/<triple>/ is a
# separate cache and does not invalidate target/release/).
log "building pause (static) and scute-imagekit"
RUSTFLAGS='-C target-feature=+crt-static -C strip=symbols' \
	cargo build --release -p scute-pause --target x86_64-unknown-linux-gnu
pause_bin=$target_dir/x86_64-unknown-linux-gnu/release/pause
# SCUTE_IMAGEKIT: a kit already built (hack/test.sh passes the debug one its build step made: a
# release build would compile every dependency again, 4 minutes on a fresh machine).
kit=${SCUTE_IMAGEKIT:-$target_dir/release/scute-imagekit}
[[ -n ${SCUTE_IMAGEKIT:-} ]] || cargo build --release -p scute-imagekit
[[ -x $kit ]] || die "$kit is missing"
if [[ $(file "$pause_bin") != *static* ]]; then
	die "$pause_bin is not statically linked: $(file -b "$pause_bin")"
fi

mkdir -p "$work"
# One build at a time: concurrent runs (parallel tests, a benchmark) share this work dir.
exec 9>"$work/.lock"
flock 9

# Fresh copy of a rootfs dir each run: cheap, and no leftovers from older runs.
new_rootfs() {
	local dir=$1
	rm -rf "$dir"
	mkdir -p "$dir"
}

# copy_at_same_path, copy_libraries, build_and_push
source "$repo_root/images/lib.sh"

make_busybox_rootfs() {
	local rootfs=$1
	new_rootfs "$rootfs"
	mkdir -p "$rootfs"/{bin,sbin,usr/bin,usr/sbin,etc,root,home,tmp,var/www,var/spool/mail}
	chmod 1777 "$rootfs/tmp"
	chmod 0700 "$rootfs/root"

	copy_at_same_path /bin/busybox "$rootfs"
	chmod 0755 "$rootfs/bin/busybox"

	# Exactly the libraries the dynamic busybox needs, at the paths ldd
	# reports, including the loader (the line without "=>").
	local lib
	while read -r lib; do
		copy_at_same_path "$lib" "$rootfs"
	done < <(ldd /bin/busybox | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }')

	# Every applet at its path, as a hard link to the one binary.
	local applet
	while read -r applet; do
		[[ -n $applet && $applet != bin/busybox ]] || continue
		mkdir -p "$rootfs/$(dirname "$applet")"
		ln -f "$rootfs/bin/busybox" "$rootfs/$applet"
	done < <(/bin/busybox --list-full)
	# Debian's busybox has no pgrep, pkill or ipcs: shell stand-ins (pkill is
	# the pgrep script under another name, as procps installs them).
	install -m 0755 "$repo_root/images/busybox-extras/pgrep" "$rootfs/usr/bin/pgrep"
	ln -f "$rootfs/usr/bin/pgrep" "$rootfs/usr/bin/pkill"
	install -m 0755 "$repo_root/images/busybox-extras/ipcs" "$rootfs/usr/bin/ipcs"

	# Users and groups of the upstream busybox image.
	cat >"$rootfs/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/bin/false
bin:x:2:2:bin:/bin:/bin/false
sys:x:3:3:sys:/dev:/bin/false
sync:x:4:100:sync:/bin:/bin/sync
mail:x:8:8:mail:/var/spool/mail:/bin/false
www-data:x:33:33:www-data:/var/www:/bin/false
operator:x:37:37:Operator:/var:/bin/false
nobody:x:65534:65534:nobody:/home:/bin/false
EOF
	cat >"$rootfs/etc/group" <<'EOF'
root:x:0:
daemon:x:1:
bin:x:2:
sys:x:3:
adm:x:4:
tty:x:5:
disk:x:6:
lp:x:7:
mail:x:8:
kmem:x:9:
wheel:x:10:root
cdrom:x:11:
dialout:x:18:
floppy:x:19:
video:x:28:
audio:x:29:
tape:x:32:
www-data:x:33:
operator:x:37:
utmp:x:43:
plugdev:x:46:
staff:x:50:
lock:x:54:
netdev:x:82:
users:x:100:
nogroup:x:65534:
EOF
}

# Prints the path of a .deb of package $1 in $work/debs, downloading it with
# `apt-get download` when none is there. apt-get update runs only when apt
# does not know the package (or its .deb is gone from the mirror), so a machine
# with the .deb cached needs no network for it.
fetch_deb() {
	local pkg=$1 dir=$work/debs deb
	mkdir -p "$dir"
	deb=$(find "$dir" -maxdepth 1 -name "${pkg}_*.deb" | sort -V | tail -n 1)
	if [[ -z $deb ]]; then
		command -v apt-get >/dev/null || die "no $pkg .deb in $dir and no apt-get to fetch one"
		if [[ -z $(apt-cache policy "$pkg" 2>/dev/null | awk '$1 == "Candidate:" && $2 != "(none)"') ]]; then
			log "apt does not know $pkg; running apt-get update"
			apt-get update -q >&2
		fi
		# Sandbox user root: the download dir is not _apt's to write. Stale
		# lists name a .deb the mirror no longer has: update once and retry.
		if ! (cd "$dir" && apt-get download -q -o APT::Sandbox::User=root "$pkg" >&2); then
			log "apt-get download $pkg failed; running apt-get update and retrying"
			apt-get update -q >&2
			(cd "$dir" && apt-get download -q -o APT::Sandbox::User=root "$pkg" >&2) ||
				die "apt-get download $pkg failed"
		fi
		deb=$(find "$dir" -maxdepth 1 -name "${pkg}_*.deb" | sort -V | tail -n 1)
		[[ -n $deb ]] || die "apt-get download $pkg left no ${pkg}_*.deb in $dir"
	fi
	echo "$deb"
}

# nginx rootfs $1 listening on port $2: the busybox rootfs plus Debian's
# /usr/sbin/nginx (from $nginx_bin), its libraries, a config and a page.
make_nginx_rootfs() {
	local rootfs=$1 port=$2
	new_rootfs "$rootfs"
	cp -a "$work/rootfs/busybox/." "$rootfs/"
	install -D -m 0755 "$nginx_bin" "$rootfs/usr/sbin/nginx"
	copy_libraries "$nginx_bin" "$rootfs"
	mkdir -p "$rootfs"/{run,var/log/nginx,var/lib/nginx,usr/share/nginx/html}
	ln -sfn ../run "$rootfs/var/run"
	mkdir -p "$rootfs/etc/nginx"
	sed "s/^\(\t\tlisten \)80;/\1$port;/" "$repo_root/images/nginx/nginx.conf" >"$rootfs/etc/nginx/nginx.conf"
	chmod 0644 "$rootfs/etc/nginx/nginx.conf"
	grep -q "listen $port;" "$rootfs/etc/nginx/nginx.conf" || die "could not set nginx's port to $port"
	install -m 0644 "$repo_root/images/nginx/index.html" "$rootfs/usr/share/nginx/html/index.html"
}

busybox_path=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

log "assembling rootfs dirs under $work"
make_busybox_rootfs "$work/rootfs/busybox"

# httpd: the busybox rootfs plus a page to serve and httpd-foreground, which
# logs a line naming httpd (as Apache does) and execs busybox httpd
# (cp -a keeps the hard links).
# (Not `busybox --list | grep -q`: with pipefail, grep's early exit SIGPIPEs busybox at random.)
applets=$(/bin/busybox --list)
if ! grep -qx httpd <<<"$applets"; then
	die "Debian's busybox has no httpd applet; cannot build the httpd image"
fi
new_rootfs "$work/rootfs/httpd"
cp -a "$work/rootfs/busybox/." "$work/rootfs/httpd/"
echo '<html><body><h1>It works!</h1></body></html>' >"$work/rootfs/httpd/var/www/index.html"
install -D -m 0755 "$repo_root/images/httpd/httpd-foreground" "$work/rootfs/httpd/usr/local/bin/httpd-foreground"

new_rootfs "$work/rootfs/pause"
install -m 0755 "$pause_bin" "$work/rootfs/pause/pause"

# nginx: Debian's binary, unpacked from its .deb (not installed on the host).
nginx_deb=$(fetch_deb nginx)
nginx_unpacked=$work/nginx-deb
if [[ ! -x $nginx_unpacked/usr/sbin/nginx || $nginx_deb -nt $nginx_unpacked/usr/sbin/nginx ]]; then
	rm -rf "$nginx_unpacked"
	dpkg-deb -x "$nginx_deb" "$nginx_unpacked"
	touch "$nginx_unpacked/usr/sbin/nginx"
fi
nginx_bin=$nginx_unpacked/usr/sbin/nginx
[[ -x $nginx_bin ]] || die "$nginx_deb has no usr/sbin/nginx"
make_nginx_rootfs "$work/rootfs/nginx" 80
make_nginx_rootfs "$work/rootfs/hostnet-nginx" 12003

# nonewprivs: the busybox rootfs plus nnp, static, setuid root (the kit's
# layers keep mode bits and ownership).
command -v gcc >/dev/null || die "gcc missing; run hack/setup.sh"
nnp_bin=$work/nnp
if [[ ! -x $nnp_bin || $repo_root/images/nonewprivs/nnp.c -nt $nnp_bin ]]; then
	gcc -static -Os -s -o "$nnp_bin.tmp" "$repo_root/images/nonewprivs/nnp.c"
	mv "$nnp_bin.tmp" "$nnp_bin"
fi
new_rootfs "$work/rootfs/nonewprivs"
cp -a "$work/rootfs/busybox/." "$work/rootfs/nonewprivs/"
install -D -o root -g root -m 4755 "$nnp_bin" "$work/rootfs/nonewprivs/usr/local/bin/nnp"

# One-file layers on top of the busybox layer: /NAME, empty, as cri-tools'
# image-test Dockerfile adds them. Distinct files give distinct image IDs.
marker_layer() {
	local name=$1
	new_rootfs "$work/rootfs/marker-$name"
	: >"$work/rootfs/marker-$name/$name"
	chmod 0644 "$work/rootfs/marker-$name/$name"
	echo "$work/rootfs/marker-$name"
}

# test-image-predefined-group: as `adduser -u 1000 -D default-user; addgroup
# -g 50000 group-defined-in-image; addgroup default-user group-defined-in-image`.
new_rootfs "$work/rootfs/predefined-group"
cp -a "$work/rootfs/busybox/." "$work/rootfs/predefined-group/"
echo 'default-user:x:1000:1000:Linux User,,,:/home/default-user:/bin/sh' >>"$work/rootfs/predefined-group/etc/passwd"
printf '%s\n' 'default-user:x:1000:' 'group-defined-in-image:x:50000:default-user' >>"$work/rootfs/predefined-group/etc/group"
install -d -o 1000 -g 1000 -m 0755 "$work/rootfs/predefined-group/home/default-user"

log "building and pushing to $registry"
# Labels give each pushed image its own ID even where rootfs and command match.
bb=$work/rootfs/busybox
build_and_push e2e-busybox "$bb" e2e-test-images/busybox:1.29-2 -- \
	--env "$busybox_path" --cmd '["sh"]' --label scute.test/image=e2e-test-images/busybox
build_and_push library-busybox "$bb" library/busybox:latest --also-tag 1.36 -- \
	--env "$busybox_path" --cmd '["sh"]' --label scute.test/image=library/busybox
build_and_push e2e-httpd "$work/rootfs/httpd" e2e-test-images/httpd:2.4.39-4 -- \
	--env "$busybox_path" --cmd '["httpd-foreground"]' --expose 80/tcp \
	--label scute.test/image=e2e-test-images/httpd
# As the upstream nginx image: nginx -g 'daemon off;', so PID 1 is the master
# process ("nginx: master process nginx -g daemon off;" in /proc/1/cmdline).
build_and_push e2e-nginx "$work/rootfs/nginx" e2e-test-images/nginx:1.14-2 -- \
	--env "$busybox_path" --cmd '["nginx","-g","daemon off;"]' --expose 80/tcp \
	--label scute.test/image=e2e-test-images/nginx
build_and_push e2e-nonewprivs "$work/rootfs/nonewprivs" e2e-test-images/nonewprivs:1.3 -- \
	--env "$busybox_path" --entrypoint '["/usr/local/bin/nnp"]' \
	--label scute.test/image=e2e-test-images/nonewprivs
# As registry.k8s.io/pause: entrypoint /pause, user 65535:65535.
build_and_push pause "$work/rootfs/pause" pause:3.10 -- \
	--entrypoint '["/pause"]' --user 65535:65535 --label scute.test/image=pause
build_and_push pause-3.9 "$work/rootfs/pause" pause:3.9 -- \
	--entrypoint '["/pause"]' --user 65535:65535 --label scute.test/image=pause:3.9

# critest's gcr.io/k8s-staging-cri-tools/ images.
cri=k8s-staging-cri-tools
bb_args=(--env "$busybox_path" --cmd '["sh"]')
build_and_push test-image-tag-test "$bb" "$cri/test-image-tag:test" -- \
	--rootfs "$(marker_layer test)" "${bb_args[@]}" --label scute.test/image=test-image-tag:test
build_and_push test-image-tag-all "$bb" "$cri/test-image-tag:all" -- \
	--rootfs "$(marker_layer all)" "${bb_args[@]}" --label scute.test/image=test-image-tag:all
build_and_push test-image-latest "$bb" "$cri/test-image-latest:latest" -- \
	--rootfs "$(marker_layer latest)" "${bb_args[@]}" --label scute.test/image=test-image-latest
for n in 1 2 3; do
	build_and_push "test-image-$n" "$bb" "$cri/test-image-$n:latest" -- \
		--rootfs "$(marker_layer "$n")" "${bb_args[@]}" --label "scute.test/image=test-image-$n"
done
build_and_push test-image-tags "$bb" "$cri/test-image-tags:1" --also-tag 2 --also-tag 3 -- \
	--rootfs "$(marker_layer tags)" "${bb_args[@]}" --label scute.test/image=test-image-tags
build_and_push test-image-user-uid "$bb" "$cri/test-image-user-uid:latest" -- \
	"${bb_args[@]}" --user 1002 --label scute.test/image=test-image-user-uid
build_and_push test-image-user-username "$bb" "$cri/test-image-user-username:latest" -- \
	"${bb_args[@]}" --user www-data --label scute.test/image=test-image-user-username
build_and_push test-image-user-uid-group "$bb" "$cri/test-image-user-uid-group:latest" -- \
	"${bb_args[@]}" --user 1003:1004 --label scute.test/image=test-image-user-uid-group
build_and_push test-image-user-username-group "$bb" "$cri/test-image-user-username-group:latest" -- \
	"${bb_args[@]}" --user www-data:1004 --label scute.test/image=test-image-user-username-group
build_and_push test-image-predefined-group "$work/rootfs/predefined-group" "$cri/test-image-predefined-group:latest" -- \
	"${bb_args[@]}" --user 1000 --label scute.test/image=test-image-predefined-group
build_and_push hostnet-nginx "$work/rootfs/hostnet-nginx" "$cri/hostnet-nginx-amd64:latest" -- \
	--env "$busybox_path" --cmd '["nginx","-g","daemon off;"]' --expose 12003/tcp \
	--label scute.test/image=hostnet-nginx-amd64

# public.ecr.aws/docker/library/busybox variants of critest's image benchmarks.
for tag in 1.35.0-glibc 1-uclibc 1 1-glibc 1-musl; do
	build_and_push "ecr-busybox-$tag" "$bb" "docker/library/busybox:$tag" -- \
		"${bb_args[@]}" --label "scute.test/image=docker/library/busybox:$tag"
done
log "done"
