#!/usr/bin/env bash
# Installs the Debian packages scute needs to build and test. Idempotent: when
# everything is already installed it only runs dpkg-query and exits.
#
# Debian's docker-registry package ships an init script that would start a
# registry listening on :5000 for good; tests start their own registries with
# hack/registry.sh, so this script keeps that service from running.
set -euo pipefail

packages=(
	pkg-config
	libseccomp-dev              # libcontainer's seccomp support
	libelf-dev                  # libbpf (device rules on cgroup v2, built by libbpf-sys)
	zlib1g-dev
	busybox                     # dynamically linked busybox for test images (not busybox-static)
	docker-registry             # local OCI registry for tests
	apache2-utils               # htpasswd -B: bcrypt users for the registry's basic auth (registry.sh --htpasswd)
	containernetworking-plugins # CNI bridge, loopback, host-local, portmap
	iproute2
	iputils-ping                # pod-to-pod reachability in tests
	iptables
	curl
	ca-certificates
	openssl                     # a self-signed certificate for the streaming TLS test
	file
	help2man                    # hack/package.sh: the man pages, from --help
	lintian                     # hack/package.sh: checks the package
	gcc                         # images/build.sh: the static setuid nonewprivs test program
	libc6-dev                   # (static glibc for it)
	libpcre2-8-0                # libraries of Debian's nginx, copied into the nginx test images
	libssl3                     # (images/build.sh unpacks nginx's .deb; it is never installed)
	libcrypt1
	zlib1g
	netcat-openbsd              # images/cluster.sh: the agnhost image's nc, curl, bash, ip, dig and
	bind9-dnsutils              # nslookup (upstream's has them from alpine), with their libraries
	python3                     # hack/test.sh, hack/cluster-bench.sh; the shim's checkpoint test names a process as libcontainer's init
	strace                      # tests/containers.rs holds the daemon's store writes to cut a start at a set point
	criu                        # CheckpointContainer (`criu check` fails on a kernel newer than it: tests check that answer)
)

if [[ $(id -u) -ne 0 ]]; then
	echo "setup.sh: must run as root" >&2
	exit 1
fi

is_installed() {
	[[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true) == "install ok installed" ]]
}

missing=()
for pkg in "${packages[@]}"; do
	is_installed "$pkg" || missing+=("$pkg")
done

if ((${#missing[@]} > 0)); then
	echo "setup.sh: installing ${missing[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive

	# Forbid maintainer scripts from starting services (exit 101 = "action
	# forbidden", see /usr/share/doc/init-system-helpers/README.policy-rc.d).
	# Only add the policy when none exists, and remove only what we added.
	policy=/usr/sbin/policy-rc.d
	added_policy=0
	if [[ ! -e $policy ]]; then
		printf '#!/bin/sh\nexit 101\n' >"$policy"
		chmod 0755 "$policy"
		added_policy=1
	fi
	cleanup_policy() { if ((added_policy)); then rm -f "$policy"; fi; }
	trap cleanup_policy EXIT

	apt-get update -q
	apt-get install -y -q --no-install-recommends "${missing[@]}"

	cleanup_policy
	trap - EXIT
fi

# Belt and braces for machines where the package was installed earlier without
# the policy: make sure no system registry holds :5000, and that it will not
# come back at boot.
if [[ -x /etc/init.d/docker-registry ]]; then
	if [[ -e /run/docker-registry.pid ]] || pgrep -x docker-registry >/dev/null 2>&1; then
		/etc/init.d/docker-registry stop >/dev/null 2>&1 || true
	fi
	if command -v update-rc.d >/dev/null 2>&1; then
		update-rc.d docker-registry disable >/dev/null 2>&1 || true
	fi
fi

echo "setup.sh: all packages installed" >&2
