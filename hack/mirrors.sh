#!/usr/bin/env bash
# Writes hosts.toml files (containerd's layout) that send the public registries critest and
# the e2e images use to a local registry, as an offline node needs:
#
#   hack/mirrors.sh REGISTRY_ADDR [CERTS_DIR]      (default CERTS_DIR: /etc/scute/certs.d)
#
# The path after the host is kept: registry.k8s.io/e2e-test-images/busybox:1.29-2 is pulled
# as REGISTRY_ADDR/e2e-test-images/busybox:1.29-2.
set -euo pipefail

registry=${1:?usage: $0 REGISTRY_ADDR [CERTS_DIR]}
certs=${2:-/etc/scute/certs.d}

# k8s.gcr.io: critest still pulls k8s.gcr.io/pause:3.9.
for host in registry.k8s.io k8s.gcr.io docker.io gcr.io public.ecr.aws quay.io; do
	mkdir -p "$certs/$host"
	cat >"$certs/$host/hosts.toml" <<EOT
# Written by scute's hack/mirrors.sh: $host is served by the local registry $registry.
server = "https://$host"

[host."http://$registry"]
  capabilities = ["pull", "resolve"]
EOT
done
echo "mirrors.sh: registry.k8s.io k8s.gcr.io docker.io gcr.io public.ecr.aws quay.io -> http://$registry (in $certs)" >&2
