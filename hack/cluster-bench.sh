#!/usr/bin/env bash
# Pod start through a real control plane, scute beside containerd 2.3 on the same cluster (root;
# Kubernetes' binaries and containerd 2.3 from ../shared/tools, Debian's runc).
#
#   hack/cluster-bench.sh [--pods N] [--rounds R]
#
# Brings up hack/cluster.sh's cluster with two nodes, node 1 on scute and node 2 on containerd
# 2.3 (same control plane, images, CNI plugins and kubelet config; maxPods raised so N pods fit
# beside the system's), then per node and round: a Deployment of N pause pods pinned to that
# node, scaled from 0 to N; the time until all N are Ready, and the kubelet's
# pod_start_sli_duration_seconds (creation to all containers started, image pulls excluded: the
# image is the sandbox image, already on the node) over those N pods, p50 and p99 from its
# histogram's buckets as Prometheus' histogram_quantile computes them; then scaled to 0, timed
# until every pod is gone; and where the kubelet's time went (its summed waits on the runtime's
# CRI calls and on its API rate limiter, from its metrics). Prints both runtimes' figures and
# scute's ratio; takes the cluster down at the end (also when it fails). Default N is 110 (the kubelet's default maxPods), R 2.
# Figures are printed, never asserted.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
pods=110
rounds=2
while (($#)); do
	case $1 in
	--pods) pods=${2:?} && shift 2 ;;
	--rounds) rounds=${2:?} && shift 2 ;;
	*) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//' >&2 && exit 2 ;;
	esac
done
[[ $(id -u) -eq 0 ]] || { echo "cluster-bench.sh: must run as root" >&2; exit 1; }
log() { echo "cluster-bench.sh: $*" >&2; }
die() {
	log "$*"
	exit 1
}

cluster=$repo_root/hack/cluster.sh
export SCUTE_CLUSTER_MAX_PODS=$((pods + 20))
trap '"$cluster" down >/dev/null 2>&1 || "$cluster" down' EXIT
started=$SECONDS
kubeconfig=$("$cluster" up --nodes 2 --containerd-on 2)
tools=${SCUTE_TEST_TOOLS:-/var/cache/scute-test-tools}
kubectl() { "$tools/kubectl" --kubeconfig "$kubeconfig" "$@"; }
log "cluster up in $((SECONDS - started)) s"

# kubelet_pod_start_sli_duration_seconds buckets of a node, "le count" per line.
buckets() {
	kubectl get --raw "/api/v1/nodes/$1/proxy/metrics" |
		sed -n 's/^kubelet_pod_start_sli_duration_seconds_bucket{le="\([^"]*\)"} \([0-9.e+]*\)$/\1 \2/p'
}

# Where a node's kubelet spent the time, "name seconds" per line: the sums of its waits on the
# runtime (every CRI call, all operation types) and on its own client-side API rate limiter
# (kubeAPIQPS), and its pod workers' syncs.
waits() {
	kubectl get --raw "/api/v1/nodes/$1/proxy/metrics" | awk '
		/^kubelet_runtime_operations_duration_seconds_sum/ { runtime += $NF }
		/^rest_client_rate_limiter_duration_seconds_sum/ { limiter += $NF }
		/^kubelet_pod_worker_duration_seconds_sum/ { worker += $NF }
		END { printf "runtime %f\nlimiter %f\nworker %f\n", runtime, limiter, worker }'
}

# quantiles BEFORE AFTER: p50 and p99 (seconds) of the observations between two scrapes.
quantiles() {
	python3 - "$1" "$2" <<-'EOF'
		import sys
		def read(path):
		    rows = []
		    for line in open(path):
		        le, n = line.split()
		        rows.append((float("inf") if le == "+Inf" else float(le), float(n)))
		    return dict(rows)
		before, after = read(sys.argv[1]), read(sys.argv[2])
		les = sorted(after)
		counts = [after[le] - before.get(le, 0) for le in les]
		total = counts[-1]
		def q(p):
		    # histogram_quantile: linear within the bucket the rank falls in.
		    rank = p * total
		    lower, below = 0.0, 0.0
		    for le, n in zip(les, counts):
		        if n >= rank:
		            if le == float("inf"):
		                return lower
		            return lower + (le - lower) * ((rank - below) / (n - below) if n > below else 0)
		        lower, below = le, n
		    return lower
		print(f"{int(total)} {q(0.5):.2f} {q(0.99):.2f}")
	EOF
}

work=$(mktemp -d)
declare -A results
for i in 1 2; do
	node=scute-node$i
	runtime=$([[ $i == 1 ]] && echo scute || echo "containerd 2.3")
	for ((r = 1; r <= rounds; r++)); do
		name=podstart-$i
		kubectl apply -f - >/dev/null <<-EOF
			apiVersion: apps/v1
			kind: Deployment
			metadata: {name: $name}
			spec:
			  replicas: 0
			  selector: {matchLabels: {app: $name}}
			  template:
			    metadata: {labels: {app: $name}}
			    spec:
			      nodeSelector: {kubernetes.io/hostname: $node}
			      terminationGracePeriodSeconds: 1
			      containers:
			      - name: pause
			        image: registry.k8s.io/pause:3.10
			        imagePullPolicy: IfNotPresent
		EOF
		buckets "$node" >"$work/before"
		waits "$node" >"$work/waits-before"
		t0=$(date +%s.%N)
		kubectl scale deployment "$name" --replicas "$pods" >/dev/null
		# One watch, not a kubectl every 0.2 s: polling cost 8 % of the two cores during a
		# scale-up, slowing the node being measured.
		kubectl wait deployment "$name" --for=jsonpath='{.status.readyReplicas}'="$pods" --timeout=600s >/dev/null ||
			die "$runtime: not all $pods pods Ready in 600 s: $(kubectl get pods -l "app=$name" -o wide | grep -v Running | head -20)"
		t1=$(date +%s.%N)
		# The kubelet observes a pod's start when it sees it running in its watch: wait for all N.
		seen=0 p50=0 p99=0
		for _ in $(seq 50); do
			buckets "$node" >"$work/after"
			read -r seen p50 p99 < <(quantiles "$work/before" "$work/after") || true
			((seen >= pods)) && break
			sleep 0.2
		done
		t2=$(date +%s.%N)
		waits "$node" >"$work/waits-after"
		read -r on_runtime on_limiter in_workers < <(awk 'NR == FNR { b[$1] = $2; next } { printf "%s ", $2 - b[$1] } END { print "" }' "$work/waits-before" "$work/waits-after")
		kubectl scale deployment "$name" --replicas 0 >/dev/null
		# (Polled: `kubectl wait --for=delete` over 110 pods took twice as long as they did.)
		deadline=$((SECONDS + 600))
		until [[ -z $(kubectl get pods -l "app=$name" -o name) ]]; do
			((SECONDS < deadline)) || die "$runtime: pods left 600 s after scaling to 0: $(kubectl get pods -l "app=$name" | head -20)"
			sleep 0.2
		done
		t3=$(date +%s.%N)
		kubectl delete deployment "$name" --wait >/dev/null
		ready=$(awk "BEGIN {print $t1 - $t0}")
		gone=$(awk "BEGIN {print $t3 - $t2}")
		printf '%-15s round %d: %d pods Ready in %.1f s; pod_start_sli over %d pods: p50 %.2f s, p99 %.2f s; scaled to 0, all gone in %.1f s\n' \
			"$runtime" "$r" "$pods" "$ready" "$seen" "$p50" "$p99" "$gone"
		printf '%-15s          the kubelet waited %.1f s on the runtime (all CRI calls, %.0f ms per pod), %.1f s on its API rate limiter; its pod workers synced for %.1f s\n' \
			"" "$on_runtime" "$(awk "BEGIN {print $on_runtime * 1000 / $pods}")" "$on_limiter" "$in_workers"
		results[$i,$r]="$ready $p50 $p99 $gone"
	done
done
rm -rf "$work"

echo
printf '%-15s | %-22s | %-10s | %-10s | %-14s\n' runtime "all $pods Ready (s)" "SLI p50" "SLI p99" "all gone (s)"
for i in 1 2; do
	runtime=$([[ $i == 1 ]] && echo scute || echo "containerd 2.3")
	for ((r = 1; r <= rounds; r++)); do
		read -r ready p50 p99 gone <<<"${results[$i,$r]}"
		printf '%-15s | %-22.1f | %-10.2f | %-10.2f | %-14.1f\n' "$runtime" "$ready" "$p50" "$p99" "$gone"
	done
done
# Ratios of the rounds' best (the least disturbed by the machine) of each figure.
best() { for ((r = 1; r <= rounds; r++)); do read -r -a f <<<"${results[$1,$r]}" && echo "${f[$2]}"; done | sort -g | head -1; }
for k in 0 2; do
	what=$([[ $k == 0 ]] && echo "all Ready" || echo "SLI p99")
	s=$(best 1 $k) c=$(best 2 $k)
	printf '%s, best of %d rounds: scute %.2f s, containerd 2.3 %.2f s: scute %.2fx\n' "$what" "$rounds" "$s" "$c" "$(awk "BEGIN {print $s / $c}")"
done
echo "(SLI: the kubelet's pod_start_sli_duration_seconds, bucket-interpolated; its buckets below 10 s are 0.5, 1, 2, 3, 4, 5, 6, 8 s)"
