#!/usr/bin/env bash
# Builds scute's Debian package with dpkg-deb (Debian's own tool; nothing to install):
#
#   hack/package.sh [--profile release|debug] [--version V] [--out DIR]
#
# release (the default) builds the binaries first; debug packages the ones `cargo test` built
# (the VM test node installs that). The package holds:
#   /usr/bin/scute, /usr/bin/scute-shim
#   /lib/systemd/system/scute.service   contrib/systemd/scute.service, ExecStart=/usr/bin/scute
#   /etc/scute/config.toml              `scute config default` (a conffile: kept on upgrade)
#   /etc/scute/certs.d/                 registry hosts and mirrors (hosts.toml per registry)
#   /usr/share/man/man8/scute.8.gz      from --help by help2man (when installed)
#   /usr/share/doc/scute/               README.md, copyright
# Maintainer scripts: install enables and starts scute.service; upgrade restarts only the
# daemon (KillMode=process: shims and containers keep running); remove stops and disables it;
# purge also drops /etc/scute. /var/lib/scute (images, pods' records) is never deleted: remove
# the pods first, then the directory, if the node is done with it.
# Prints the path of the .deb.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"

profile=release
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
out=$repo_root/target/debian
while (($#)); do
	case $1 in
	--profile) profile=$2 && shift 2 ;;
	--version) version=$2 && shift 2 ;;
	--out) out=$2 && shift 2 ;;
	*) echo "package.sh: unknown argument $1" >&2 && exit 2 ;;
	esac
done
case $profile in
release) cargo build --release --locked -p scute -p scute-shim >&2 ;;
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
# The staging root becomes the package's "./": 0755 like /, not mktemp's 0700.
chmod 0755 "$stage"
install -d "$stage/DEBIAN" "$stage/usr/bin" "$stage/lib/systemd/system" "$stage/etc/scute/certs.d" \
	"$stage/usr/share/doc/scute"
# Stripped: the same code without its debug info (a debug build's is 90% of its size).
install -m 0755 --strip "$bin/scute" "$bin/scute-shim" "$stage/usr/bin/"
sed 's|/usr/local/bin/scute|/usr/bin/scute|g' contrib/systemd/scute.service >"$stage/lib/systemd/system/scute.service"
chmod 0644 "$stage/lib/systemd/system/scute.service"
"$bin/scute" config default >"$stage/etc/scute/config.toml"
chmod 0644 "$stage/etc/scute/config.toml"
install -m 0644 README.md "$stage/usr/share/doc/scute/README.md"
printf 'scute\nCopyright: the scute authors\nLicense: Apache-2.0 (/usr/share/common-licenses/Apache-2.0)\n' \
	>"$stage/usr/share/doc/scute/copyright"
if command -v help2man >/dev/null; then
	install -d "$stage/usr/share/man/man8"
	help2man --no-info --section 8 --name "Kubernetes CRI container runtime" "$bin/scute" |
		gzip -9n >"$stage/usr/share/man/man8/scute.8.gz"
else
	echo "package.sh: help2man not installed; no man page" >&2
fi

# Depends: the packages of the shared libraries the binaries load (as dpkg-shlibdeps would say,
# without needing dpkg-dev).
depends=$(for b in scute scute-shim; do ldd "$bin/$b"; done | awk '/=> \//{print $3}' | sort -u |
	while read -r lib; do dpkg -S "$(readlink -f "$lib")" 2>/dev/null || dpkg -S "$lib" 2>/dev/null || true; done |
	cut -d: -f1 | sort -u | paste -sd, | sed 's/,/, /g')
installed_kib=$(du -sk "$stage" | cut -f1)
cat >"$stage/DEBIAN/control" <<EOF
Package: scute
Version: $version
Architecture: $arch
Maintainer: scute developers <scute@localhost>
Installed-Size: $installed_kib
Depends: ${depends:-libc6}
Recommends: containernetworking-plugins, iptables
Section: admin
Priority: optional
Description: Kubernetes CRI v1 container runtime
 scute serves the kubelet's CRI (RuntimeService and ImageService) on
 unix:///run/scute/scute.sock, pulls OCI images, runs one pause-backed sandbox
 per pod and the pod's containers under a per-pod shim.
EOF
echo /etc/scute/config.toml >"$stage/DEBIAN/conffiles"

cat >"$stage/DEBIAN/postinst" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = configure ] && [ -d /run/systemd/system ]; then
	systemctl daemon-reload
	if [ -z "$2" ]; then
		systemctl enable --now scute.service
	else
		# An upgrade: the daemon only; shims and containers keep running (KillMode=process).
		systemctl try-restart scute.service
	fi
fi
EOF
cat >"$stage/DEBIAN/prerm" <<'EOF'
#!/bin/sh
set -e
# Stopping scute never stops containers; on upgrade postinst restarts it.
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
	systemctl disable --now scute.service || true
fi
EOF
cat >"$stage/DEBIAN/postrm" <<'EOF'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
fi
if [ "$1" = purge ]; then
	# dpkg removes the conffile; what scute or the operator added there goes too.
	rm -rf /etc/scute
fi
EOF
chmod 0755 "$stage/DEBIAN/postinst" "$stage/DEBIAN/prerm" "$stage/DEBIAN/postrm"

mkdir -p "$out"
deb=$out/scute_${version}_${arch}.deb
# A debug package is for the test node: fast gzip rather than xz's few MB less.
compression=(-Zxz)
[[ $profile == debug ]] && compression=(-Zgzip -z1)
dpkg-deb --root-owner-group "${compression[@]}" --build "$stage" "$deb" >&2
echo "$deb"
