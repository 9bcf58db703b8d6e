#!/usr/bin/env bash
# Builds scute's Debian package with dpkg-deb (Debian's own tool; nothing to install):
#
#   hack/package.sh [--profile release|debug] [--version V] [--out DIR] [--maintainer "N <E>"]
#                   [--layout FILE]
#
# release (the default) builds the binaries first; debug packages the ones `cargo test` built
# (the VM test node installs that). A release daemon is laid out with the order file
# hack/orderfile.sh made (--layout, default target/layout/scute.order, when it exists: about a
# third less of the binary resident; run hack/orderfile.sh before a release). The package holds:
#   /usr/bin/scute, /usr/bin/scute-shim
#   /lib/systemd/system/scute.service   contrib/systemd/scute.service, ExecStart=/usr/bin/scute
#   /etc/scute/config.toml              `scute config default` (a conffile: kept on upgrade)
#   /etc/scute/certs.d/                 registry hosts and mirrors (hosts.toml per registry)
#   /usr/share/man/man8/                scute.8.gz and scute-shim.8.gz, from --help by help2man
#   /usr/share/doc/scute/               README.md, CHANGELOG.md, docs/, copyright (DEP-5), changelog.gz
#                                       (Debian's, from CHANGELOG.md: hack/changelog.py)
#   /usr/share/lintian/overrides/scute  what lintian flags in a Rust binary on purpose
# Maintainer scripts are what dh_installsystemd writes (deb-systemd-helper, deb-systemd-invoke:
# policy-rc.d and an admin's disable or mask are honoured): install enables and starts
# scute.service; upgrade restarts only the daemon (KillMode=process: shims and containers keep
# running); remove stops it; purge also drops /etc/scute. /var/lib/scute (images, pods'
# records) is never deleted: remove the pods first, then the directory, if the node is done
# with it.
# The package is checked with lintian when it is installed (hack/setup.sh installs it): an error
# or a warning fails the build. Prints the path of the .deb.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"

profile=release
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
out=$repo_root/target/debian
explicit_version=false
# The project has no mail host yet: a documentation domain until it does (--maintainer).
maintainer="scute developers <scute@example.org>"
while (($#)); do
	case $1 in
	--profile) profile=$2 && shift 2 ;;
	--version) version=$2 explicit_version=true && shift 2 ;;
	--out) out=$2 && shift 2 ;;
	--maintainer) maintainer=$2 && shift 2 ;;
	--layout) layout=$2 && shift 2 ;;
	*) echo "package.sh: unknown argument $1" >&2 && exit 2 ;;
	esac
done
layout=${layout:-$repo_root/target/layout/scute.order}
# Cargo.toml's version is a release: CHANGELOG.md must say what it holds (--version V builds
# between releases get an entry of their own).
if ! $explicit_version; then
	python3 hack/changelog.py check "$version"
fi
case $profile in
release)
	if [[ -f $layout ]]; then
		SCUTE_LAYOUT=$(realpath "$layout") cargo build --release --locked -p scute -p scute-shim >&2
		python3 hack/orderfile.py coverage target/release/scute "$layout" >&2
	else
		echo "package.sh: no order file at $layout: the daemon is not laid out (hack/orderfile.sh makes one)" >&2
		cargo build --release --locked -p scute -p scute-shim >&2
	fi
	;;
debug) ;;
*) echo "package.sh: --profile is release or debug" >&2 && exit 2 ;;
esac
bin=$repo_root/target/$profile
for b in scute scute-shim; do
	[[ -x $bin/$b ]] || { echo "package.sh: $bin/$b is missing (cargo build${profile/debug/} first)" >&2 && exit 1; }
done

arch=$(dpkg --print-architecture)
stage=$(mktemp -d -t scute-package.XXXXXX)
trap 'rm -rf "$stage"' EXIT
[[ -d $stage ]] || exit 1
# The staging root becomes the package's "./": 0755 like /, not mktemp's 0700.
chmod 0755 "$stage"
install -d "$stage/DEBIAN" "$stage/usr/bin" "$stage/lib/systemd/system" "$stage/etc/scute/certs.d" \
	"$stage/usr/share/doc/scute" "$stage/usr/share/lintian/overrides"
# Stripped: the same code without its debug info (a debug build's is 90% of its size).
install -m 0755 --strip "$bin/scute" "$bin/scute-shim" "$stage/usr/bin/"
sed 's|/usr/local/bin/scute|/usr/bin/scute|g' contrib/systemd/scute.service >"$stage/lib/systemd/system/scute.service"
chmod 0644 "$stage/lib/systemd/system/scute.service"
"$bin/scute" config default >"$stage/etc/scute/config.toml"
chmod 0644 "$stage/etc/scute/config.toml"
install -m 0644 README.md CHANGELOG.md "$stage/usr/share/doc/scute/"
install -d "$stage/usr/share/doc/scute/docs"
install -m 0644 docs/*.md "$stage/usr/share/doc/scute/docs/"
cat >"$stage/usr/share/doc/scute/copyright" <<'COPYRIGHT'
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: scute

Files: *
Copyright: 2026 the scute authors
License: Apache-2.0
 On Debian systems, the full text of the Apache License, Version 2.0 is in
 /usr/share/common-licenses/Apache-2.0.
COPYRIGHT
# A native package's changelog: CHANGELOG.md's versions (hack/changelog.py); a version between
# them (--version 0.1.0+vm1) gets an entry of its own, dated by its commit (the same bytes every
# time for one commit).
date=$(git log -1 --format=%aD 2>/dev/null || date -R)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
python3 hack/changelog.py debian "$version" "$commit" "$date" "$maintainer" |
	gzip -9n >"$stage/usr/share/doc/scute/changelog.gz"
# unsafe-libyaml (serde_yaml's parser, a Rust translation of libyaml) is linked in, as every
# Rust crate is; Debian's own Rust programs carry the same override.
echo "scute: embedded-library libyaml [usr/bin/scute]" >"$stage/usr/share/lintian/overrides/scute"
if command -v help2man >/dev/null; then
	install -d "$stage/usr/share/man/man8"
	help2man --no-info --section 8 --name "Kubernetes CRI container runtime" "$bin/scute" |
		gzip -9n >"$stage/usr/share/man/man8/scute.8.gz"
	help2man --no-info --section 8 --name "per-pod shim of the scute container runtime" "$bin/scute-shim" |
		gzip -9n >"$stage/usr/share/man/man8/scute-shim.8.gz"
else
	echo "package.sh: help2man not installed; no man pages" >&2
fi
find "$stage/usr/share" -type f -exec chmod 0644 {} +

# Depends: the packages of the shared libraries the binaries load (as dpkg-shlibdeps would say,
# without needing dpkg-dev).
depends=$(for b in scute scute-shim; do ldd "$bin/$b"; done | awk '/=> \//{print $3}' | sort -u |
	while read -r lib; do dpkg -S "$(readlink -f "$lib")" 2>/dev/null || dpkg -S "$lib" 2>/dev/null || true; done |
	cut -d: -f1 | sort -u | paste -sd, | sed 's/,/, /g')
# Packed relative relocations (build.rs, shim/build.rs) need glibc 2.36 (GLIBC_ABI_DT_RELR).
depends=$(sed -E 's/(^|, )libc6(,|$)/\1libc6 (>= 2.36)\2/' <<<"${depends:-libc6}")
installed_kib=$(du -sk "$stage" | cut -f1)
cat >"$stage/DEBIAN/control" <<CONTROL
Package: scute
Version: $version
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $installed_kib
Depends: ${depends:-libc6}
Recommends: containernetworking-plugins, iptables
Section: admin
Priority: optional
Description: Kubernetes CRI v1 container runtime
 scute serves the kubelet's CRI (RuntimeService and ImageService) on
 unix:///run/scute/scute.sock, pulls OCI images, runs one pause-backed sandbox
 per pod and the pod's containers under a per-pod shim.
CONTROL
echo /etc/scute/config.toml >"$stage/DEBIAN/conffiles"

cat >"$stage/DEBIAN/postinst" <<'POSTINST'
#!/bin/sh
set -e
if [ "$1" = configure ] || [ "$1" = abort-upgrade ] || [ "$1" = abort-deconfigure ] || [ "$1" = abort-remove ]; then
	# Removes only a mask deb-systemd-helper made at removal.
	deb-systemd-helper unmask scute.service >/dev/null || true
	# was-enabled is true on a first install: enabled then; an admin's choice is kept after.
	if deb-systemd-helper --quiet was-enabled scute.service; then
		deb-systemd-helper enable scute.service >/dev/null || true
	else
		deb-systemd-helper update-state scute.service >/dev/null || true
	fi
	if [ -d /run/systemd/system ]; then
		systemctl --system daemon-reload >/dev/null || true
		if [ -n "$2" ]; then
			# An upgrade: the daemon only; shims and containers keep running (KillMode=process).
			deb-systemd-invoke try-restart scute.service >/dev/null || true
		else
			deb-systemd-invoke start scute.service >/dev/null || true
		fi
	fi
fi
POSTINST
cat >"$stage/DEBIAN/prerm" <<'PRERM'
#!/bin/sh
set -e
# Stopping scute never stops containers; on upgrade postinst restarts it.
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
	deb-systemd-invoke stop scute.service >/dev/null || true
fi
PRERM
cat >"$stage/DEBIAN/postrm" <<'POSTRM'
#!/bin/sh
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
	systemctl --system daemon-reload >/dev/null || true
fi
if [ "$1" = remove ] && command -v deb-systemd-helper >/dev/null; then
	deb-systemd-helper mask scute.service >/dev/null || true
fi
if [ "$1" = purge ]; then
	if command -v deb-systemd-helper >/dev/null; then
		deb-systemd-helper purge scute.service >/dev/null || true
		deb-systemd-helper unmask scute.service >/dev/null || true
	fi
	# dpkg removes the conffile; what scute or the operator added there goes too.
	rm -rf /etc/scute
fi
POSTRM
chmod 0755 "$stage/DEBIAN/postinst" "$stage/DEBIAN/prerm" "$stage/DEBIAN/postrm"

mkdir -p "$out"
deb=$out/scute_${version}_${arch}.deb
# A debug package is for the test node: fast gzip rather than xz's few MB less.
compression=(-Zxz)
[[ $profile == debug ]] && compression=(-Zgzip -z1)
dpkg-deb --root-owner-group "${compression[@]}" --build "$stage" "$deb" >&2
if command -v lintian >/dev/null; then
	lintian --fail-on error,warning --allow-root "$deb" >&2 || {
		echo "package.sh: lintian found errors or warnings in $deb (above)" >&2
		exit 1
	}
else
	echo "package.sh: lintian not installed; the package is not checked" >&2
fi
echo "$deb"
