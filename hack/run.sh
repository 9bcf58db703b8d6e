#!/usr/bin/env bash
# Builds scute in release mode and runs `scute serve` in the foreground with the embedded
# defaults (socket unix:///run/scute/scute.sock). Extra arguments go to `scute serve`, e.g.
#   hack/run.sh --log-level debug
#   hack/run.sh --config /etc/scute/config.toml
# Installs the system packages it needs first (hack/setup.sh, quick when already there).
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"

if [[ $(id -u) -ne 0 ]]; then
	echo "run.sh: scute runs as root (namespaces, mounts, cgroups)" >&2
	exit 1
fi

hack/setup.sh
cargo build --release --locked -p scute -p scute-shim
echo "run.sh: starting scute; point crictl at it with:" >&2
echo "  crictl --runtime-endpoint unix:///run/scute/scute.sock --image-endpoint unix:///run/scute/scute.sock info" >&2
exec "$repo_root/target/release/scute" serve "$@"
