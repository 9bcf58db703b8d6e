#!/usr/bin/env bash
# Builds the test images and pushes them to a registry (default: the one
# hack/registry.sh starts on 127.0.0.1:5000).
#
#   images/build.sh [REGISTRY_ADDR]
#
# Images (see /work/shared/critest-images.md for what each must contain):
#   e2e-test-images/busybox:1.29-2      busybox rootfs
#   library/busybox:latest, :1.36       busybox rootfs (one image, two tags)
#   e2e-test-images/httpd:2.4.39-4      busybox rootfs + busybox httpd on :80
#   pause:3.10                          the static /pause binary of this repo
#
# The busybox rootfs is Debian's dynamically linked busybox plus the shared
# libraries ldd lists, with every applet a hard link to /bin/busybox (a masked
# /bin/ls must not mask busybox itself). Images are reproducible, and pushing
# skips blobs the registry has, so a re-run is quick and pushes the same
# digests.
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
cargo build --release -p scute-imagekit
pause_bin=$target_dir/x86_64-unknown-linux-gnu/release/pause
kit=$target_dir/release/scute-imagekit
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

# Copies host file $1 to the same path under rootfs $2, following symlinks.
copy_at_same_path() {
	local src=$1 rootfs=$2
	mkdir -p "$rootfs$(dirname "$src")"
	cp -L "$src" "$rootfs$src"
}

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
	# Debian's busybox has no pgrep, pkill or ipcs; stand-ins come later.

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

busybox_path=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# build_and_push NAME ROOTFS REF [--also-tag T]... -- BUILD-ARGS...
build_and_push() {
	local name=$1 rootfs=$2 ref=$3
	shift 3
	local push_args=()
	while (($#)) && [[ $1 != -- ]]; do
		push_args+=("$1")
		shift
	done
	[[ ${1:-} == -- ]] && shift
	"$kit" build --rootfs "$rootfs" --out "$work/layouts/$name" "$@" >/dev/null
	"$kit" push --layout "$work/layouts/$name" --to "$registry/$ref" --plain-http "${push_args[@]}"
}

log "assembling rootfs dirs under $work"
make_busybox_rootfs "$work/rootfs/busybox"

# httpd: the busybox rootfs plus a page to serve (cp -a keeps the hard links).
# (Not `busybox --list | grep -q`: with pipefail, grep's early exit SIGPIPEs busybox at random.)
applets=$(/bin/busybox --list)
if ! grep -qx httpd <<<"$applets"; then
	die "Debian's busybox has no httpd applet; cannot build the httpd image"
fi
new_rootfs "$work/rootfs/httpd"
cp -a "$work/rootfs/busybox/." "$work/rootfs/httpd/"
echo '<html><body><h1>It works!</h1></body></html>' >"$work/rootfs/httpd/var/www/index.html"

new_rootfs "$work/rootfs/pause"
install -m 0755 "$pause_bin" "$work/rootfs/pause/pause"

log "building and pushing to $registry"
# Labels give each pushed image its own ID even where rootfs and command match.
build_and_push e2e-busybox "$work/rootfs/busybox" e2e-test-images/busybox:1.29-2 -- \
	--env "$busybox_path" --cmd '["sh"]' --label scute.test/image=e2e-test-images/busybox
build_and_push library-busybox "$work/rootfs/busybox" library/busybox:latest --also-tag 1.36 -- \
	--env "$busybox_path" --cmd '["sh"]' --label scute.test/image=library/busybox
build_and_push e2e-httpd "$work/rootfs/httpd" e2e-test-images/httpd:2.4.39-4 -- \
	--env "$busybox_path" --cmd '["httpd","-f","-p","80","-h","/var/www"]' --expose 80/tcp \
	--label scute.test/image=e2e-test-images/httpd
# As registry.k8s.io/pause: entrypoint /pause, user 65535:65535.
build_and_push pause "$work/rootfs/pause" pause:3.10 -- \
	--entrypoint '["/pause"]' --user 65535:65535 --label scute.test/image=pause
