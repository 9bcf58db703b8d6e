#!/usr/bin/env bash
# A Kubernetes v1.36 cluster on this machine whose nodes run scute (root; Kubernetes' binaries
# from ../shared/tools, which no package registry has).
#
#   hack/cluster.sh up [--nodes N] [--containerd-on I,J...]
#                                    start it (N nodes, default 2) and wait until every node and
#                                    CoreDNS are Ready; prints the kubeconfig's path. Nodes I, J
#                                    run containerd 2.3 (../shared/tools, with Debian's runc)
#                                    instead of scute: a failure seen with containerd too is the
#                                    harness's or the machine's, one seen only with scute is ours
#   hack/cluster.sh down             stop it and remove everything it made
#   hack/cluster.sh status           what runs, the nodes and the kube-system pods
#   hack/cluster.sh kubeconfig       print the admin kubeconfig's path
#
# Then: export KUBECONFIG=$(hack/cluster.sh kubeconfig); kubectl get nodes -o wide
#
# The layout (SCUTE_CLUSTER_DIR, default /var/lib/scute-cluster, holds every file; logs in
# its logs/):
# - Control plane in this machine's network namespace: etcd on 127.0.0.1:23790 (its peer port
#   23800), kube-apiserver on 172.30.0.1:6443, kube-controller-manager and kube-scheduler
#   (127.0.0.1:10257, :10259), a registry with the images on 172.30.0.1:5001 (images/build.sh
#   and images/cluster.sh fill it; every node mirrors registry.k8s.io and docker.io to it).
#   Certificates and the service-account key are made with openssl: one cluster CA, a front
#   proxy CA for aggregated APIs.
# - Node i (scute-node<i>) is a network namespace of its own, scute-node<i>, on the host bridge
#   sctc0 (172.30.0.0/24: the host is .1, node i is .1<i>), running its own scute daemon (root
#   $dir/node<i>/scute, state and socket /run/scute-cluster/node<i>), kubelet (its own root dir,
#   pod logs dir, cgroup root /scute-cluster-node<i> in every hierarchy) and kube-proxy
#   (iptables mode, in the node's namespace). Pods get 10.244.<i>.0/24 from the CNI bridge and
#   host-local plugins (Debian's), bridge cni0 in the node; every node and the host route the
#   other nodes' pod ranges to them. Services: 10.96.0.0/16, cluster DNS 10.96.0.10 (CoreDNS,
#   deployed on the cluster as kubeadm does).
# - Each kubelet takes up to SCUTE_CLUSTER_MAX_PODS pods (default 110, the kubelet's own).
# - scute's binaries: target/$SCUTE_PROFILE (release by default, built if missing; hack/test.sh
#   uses the debug build it tested).
#
# `down` removes every pod through each node's scute (so its mounts, netns, cgroups and veths
# go the way they go in production), stops every process, unmounts what the kubelets left
# (their secret and projected volumes are tmpfs mounts), removes the node network namespaces
# (and so kube-proxy's iptables rules), the kubelets' cgroup roots, the bridge and routes, the
# registry and the files, and restores the host sysctls a kubelet sets.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${SCUTE_CLUSTER_DIR:-/var/lib/scute-cluster}
profile=${SCUTE_PROFILE:-release}
run_dir=/run/scute-cluster
bridge=sctc0
link_prefix=172.30.0
host_ip=$link_prefix.1
apiserver=https://$host_ip:6443
registry_addr=$host_ip:5001
etcd_port=23790
service_cidr=10.96.0.0/16
cluster_cidr=10.244.0.0/16
dns_ip=10.96.0.10
k8s_tools=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet kubectl etcd crictl coredns agnhost sample-apiserver)
# The sysctls a kubelet sets at start (setupKernelTunables): saved at `up`, restored by `down`.
kubelet_sysctls=(vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys kernel/keys/root_maxbytes)

log() { echo "cluster.sh: $*" >&2; }
die() {
	log "$*"
	exit 1
}
usage() {
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//' >&2
	exit 2
}

node_ip() { echo "$link_prefix.$((10 + $1))"; }
node_name() { echo "scute-node$1"; }
node_netns() { echo "scute-node$1"; }
pod_cidr() { echo "10.244.$1.0/24"; }
in_node() {
	local i=$1
	shift
	# nsenter, not `ip netns exec`: that one also remounts /sys in a mount namespace of its
	# own, which would hide the cgroup hierarchies from the node's kubelet and scute.
	nsenter --net="/run/netns/$(node_netns "$i")" -- "$@"
}
node_count() { cat "$dir/nodes" 2>/dev/null || echo 0; }
node_runtime() { cat "$dir/node$1/runtime" 2>/dev/null || echo scute; }
cri_socket() { echo "$run_dir/node$1/$(node_runtime "$1").sock"; }

# --- the tools ----------------------------------------------------------------------------

tools=""
# Sets tools to the dir with k8s_tools; with --optional (down) a missing tool is said, not fatal.
find_tools() {
	local problem=""
	if [[ -n ${SCUTE_TEST_TOOLS:-} && -x $SCUTE_TEST_TOOLS/kube-apiserver ]]; then
		tools=$SCUTE_TEST_TOOLS
	else
		local install=$repo_root/../shared/tools/install.sh
		if [[ -x $install ]]; then
			tools=$("$install" /var/cache/scute-test-tools "${k8s_tools[@]}") || problem="$install failed"
		else
			problem="Kubernetes' binaries come from ../shared/tools (no package registry has them); it is not beside this checkout"
		fi
	fi
	local t
	for t in "${k8s_tools[@]}"; do
		[[ -n $problem || -x $tools/$t ]] || problem="$tools/$t missing: ../shared/tools/install.sh $tools $t"
	done
	[[ -z $problem ]] && return 0
	[[ ${1:-} == --optional ]] || die "$problem"
	log "$problem"
	return 1
}

kubectl() { command "$tools/kubectl" --kubeconfig "$dir/admin.kubeconfig" "$@"; }

# --- processes ------------------------------------------------------------------------------

# start NAME COMMAND...: in the background, its own session, output to logs/NAME.log.
start() {
	local name=$1
	shift
	setsid "$@" </dev/null >>"$dir/logs/$name.log" 2>&1 &
	echo $! >"$dir/pids/$name"
}
alive() {
	local pid
	pid=$(cat "$dir/pids/$1" 2>/dev/null) || return 1
	kill -0 "$pid" 2>/dev/null
}
stop() {
	local name=$1 pid
	pid=$(cat "$dir/pids/$name" 2>/dev/null) || return 0
	if kill -TERM "$pid" 2>/dev/null; then
		for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -f "$dir/pids/$name"
}
# wait_for WHAT SECONDS COMMAND...: until COMMAND succeeds.
wait_for() {
	local what=$1 seconds=$2
	shift 2
	local deadline=$((SECONDS + seconds))
	until "$@" >/dev/null 2>&1; do
		((SECONDS < deadline)) || die "$what not ready in ${seconds} s"
		sleep 0.5
	done
}

# --- certificates (openssl) -----------------------------------------------------------------

pki=""
# ca NAME CN: a self-signed CA.
make_ca() {
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
		-keyout "$pki/$1.key" -out "$pki/$1.crt" -subj "/CN=$2" \
		-addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
}
# cert NAME CA CN O EXT_KEY_USAGE [SUBJECT_ALT_NAMES]
make_cert() {
	local name=$1 ca=$2 cn=$3 o=$4 eku=$5 san=${6:-}
	local subj="/CN=$cn"
	[[ -n $o ]] && subj="/O=$o$subj"
	openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
		-keyout "$pki/$name.key" -out "$pki/$name.csr" -subj "$subj" 2>/dev/null
	{
		echo "basicConstraints=critical,CA:FALSE"
		echo "keyUsage=critical,digitalSignature,keyEncipherment"
		echo "extendedKeyUsage=$eku"
		[[ -n $san ]] && echo "subjectAltName=$san"
	} >"$pki/$name.ext"
	openssl x509 -req -in "$pki/$name.csr" -CA "$pki/$ca.crt" -CAkey "$pki/$ca.key" -CAcreateserial \
		-days 365 -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null
	rm -f "$pki/$name.csr" "$pki/$name.ext"
}
# kubeconfig FILE CERT_NAME: a kubeconfig for the API server with client certificate CERT_NAME.
make_kubeconfig() {
	local file=$1 cert=$2
	local k=("$tools/kubectl" --kubeconfig "$file")
	"${k[@]}" config set-cluster scute --server="$apiserver" --certificate-authority="$pki/ca.crt" --embed-certs >/dev/null
	"${k[@]}" config set-credentials "$cert" --client-certificate="$pki/$cert.crt" --client-key="$pki/$cert.key" --embed-certs >/dev/null
	"${k[@]}" config set-context default --cluster=scute --user="$cert" >/dev/null
	"${k[@]}" config use-context default >/dev/null
}

make_pki() {
	pki=$dir/pki
	mkdir -p "$pki"
	make_ca ca kubernetes
	make_ca front-proxy-ca front-proxy-ca
	make_cert apiserver ca kube-apiserver "" serverAuth \
		"IP:$host_ip,IP:10.96.0.1,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost"
	# The API server's client certificate towards the kubelets: a user of its own, bound to the
	# kubelet API alone (system:kubelet-api-admin, below), not system:masters.
	make_cert apiserver-kubelet-client ca kube-apiserver-kubelet-client "" clientAuth
	make_cert front-proxy-client front-proxy-ca front-proxy-client "" clientAuth
	make_cert admin ca kubernetes-admin system:masters clientAuth
	make_cert controller-manager ca system:kube-controller-manager "" clientAuth
	make_cert scheduler ca system:kube-scheduler "" clientAuth
	make_cert kube-proxy ca system:kube-proxy "" clientAuth
	openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
	openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
	make_kubeconfig "$dir/admin.kubeconfig" admin
	make_kubeconfig "$dir/controller-manager.kubeconfig" controller-manager
	make_kubeconfig "$dir/scheduler.kubeconfig" scheduler
	make_kubeconfig "$dir/kube-proxy.kubeconfig" kube-proxy
}

# --- the host side: bridge, registry, control plane ---------------------------------------------

host_network() {
	ip link add "$bridge" type bridge
	ip addr add "$host_ip/24" dev "$bridge"
	ip link set "$bridge" up
}

registry_and_images() {
	"$repo_root/hack/registry.sh" start --addr "$registry_addr" --dir "$dir/registry" >/dev/null
	log "registry $registry_addr: building and pushing the images (images/build.sh, images/cluster.sh)"
	"$repo_root/images/build.sh" "$registry_addr" >>"$dir/logs/images.log" 2>&1 ||
		die "images/build.sh failed (see $dir/logs/images.log)"
	"$repo_root/images/cluster.sh" "$registry_addr" "$tools" >>"$dir/logs/images.log" 2>&1 ||
		die "images/cluster.sh failed (see $dir/logs/images.log)"
}

control_plane() {
	start etcd "$tools/etcd" --name scute-cluster --data-dir "$dir/etcd" \
		--listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
		--listen-peer-urls "http://127.0.0.1:$((etcd_port + 10))" --initial-advertise-peer-urls "http://127.0.0.1:$((etcd_port + 10))" \
		--initial-cluster "scute-cluster=http://127.0.0.1:$((etcd_port + 10))" --listen-metrics-urls "http://127.0.0.1:$((etcd_port + 20))"
	wait_for etcd 30 curl -fsS "http://127.0.0.1:$etcd_port/health"
	start kube-apiserver "$tools/kube-apiserver" \
		--advertise-address="$host_ip" --bind-address="$host_ip" --secure-port=6443 \
		--etcd-servers="http://127.0.0.1:$etcd_port" \
		--service-cluster-ip-range="$service_cidr" --service-node-port-range=30000-32767 \
		--client-ca-file="$pki/ca.crt" --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
		--kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" --kubelet-client-key="$pki/apiserver-kubelet-client.key" \
		--kubelet-certificate-authority="$pki/ca.crt" --kubelet-preferred-address-types=InternalIP,Hostname \
		--service-account-issuer=https://kubernetes.default.svc.cluster.local \
		--service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
		--authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction --allow-privileged=true \
		--requestheader-client-ca-file="$pki/front-proxy-ca.crt" --requestheader-allowed-names=front-proxy-client \
		--requestheader-extra-headers-prefix=X-Remote-Extra- --requestheader-group-headers=X-Remote-Group \
		--requestheader-username-headers=X-Remote-User \
		--proxy-client-cert-file="$pki/front-proxy-client.crt" --proxy-client-key-file="$pki/front-proxy-client.key" \
		--enable-aggregator-routing=true --profiling=false --cert-dir="$dir/apiserver-certs"
	wait_for kube-apiserver 90 kubectl get --raw /readyz
	# What the API server may do on the kubelets' API (logs, exec, attach, port-forward, stats),
	# as the kubelets' webhook authorizer asks it.
	kubectl create clusterrolebinding kube-apiserver-kubelet-api-admin --clusterrole=system:kubelet-api-admin \
		--user=kube-apiserver-kubelet-client >/dev/null
	start kube-controller-manager "$tools/kube-controller-manager" \
		--kubeconfig="$dir/controller-manager.kubeconfig" \
		--authentication-kubeconfig="$dir/controller-manager.kubeconfig" \
		--authorization-kubeconfig="$dir/controller-manager.kubeconfig" \
		--bind-address=127.0.0.1 --leader-elect=false --use-service-account-credentials=true \
		--root-ca-file="$pki/ca.crt" --service-account-private-key-file="$pki/sa.key" \
		--cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
		--cluster-name=scute --service-cluster-ip-range="$service_cidr" --cluster-cidr="$cluster_cidr" \
		--profiling=false
	start kube-scheduler "$tools/kube-scheduler" \
		--kubeconfig="$dir/scheduler.kubeconfig" \
		--authentication-kubeconfig="$dir/scheduler.kubeconfig" \
		--authorization-kubeconfig="$dir/scheduler.kubeconfig" \
		--bind-address=127.0.0.1 --leader-elect=false --profiling=false
}

# --- a node --------------------------------------------------------------------------------

cgroup_hierarchies() {
	awk '$0 ~ / - cgroup2? / { split($0, a, " - "); split(a[1], f, " "); print f[5] }' /proc/self/mountinfo | sort -u
}

node_network() {
	local i=$1 ns j
	ns=$(node_netns "$i")
	ip netns add "$ns"
	ip link add "sctc-n$i" type veth peer name eth0 netns "$ns"
	ip link set "sctc-n$i" master "$bridge" up
	in_node "$i" ip link set lo up
	in_node "$i" ip addr add "$(node_ip "$i")/24" dev eth0
	in_node "$i" ip link set eth0 up
	in_node "$i" ip route add default via "$host_ip"
	# Forwarding for the pods; bridged pod-to-pod traffic through iptables, so a Service's
	# reply from a pod on the same bridge is un-NATed (per network namespace since Linux 5.3).
	in_node "$i" sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
	ip route add "$(pod_cidr "$i")" via "$(node_ip "$i")"
	for ((j = 1; j <= $(node_count); j++)); do
		((j == i)) && continue
		in_node "$i" ip route add "$(pod_cidr "$j")" via "$(node_ip "$j")"
	done
}

node_files() {
	local i=$1 nd name ip h
	nd=$dir/node$i
	name=$(node_name "$i")
	ip=$(node_ip "$i")
	mkdir -p "$nd"/{scute,cni,cni-ipam,certs.d,kubelet,kubelet-pki,pod-logs,volume-plugins} "$run_dir/node$i"
	"$repo_root/hack/mirrors.sh" "$registry_addr" "$nd/certs.d" 2>/dev/null
	# containerd 2.3's config (version 4) for a node that runs it: its own root, state, socket,
	# shims and runc root; no CAP_SYS_RESOURCE here (restrict_oom_score_adj); NRI off (its
	# socket is host-wide).
	cat >"$nd/containerd.toml" <<-EOF
		version = 4
		root = '$nd/containerd'
		state = '$run_dir/node$i/containerd'
		disabled_plugins = ['io.containerd.nri.v1.nri']
		[plugins]
		  [plugins.'io.containerd.cri.v1.images'.registry]
		    config_path = '$nd/certs.d'
		  [plugins.'io.containerd.cri.v1.runtime']
		    restrict_oom_score_adj = true
		    disable_hugetlb_controller = true
		    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
		      runtime_type = 'io.containerd.runc.v2'
		      runtime_path = '$tools/containerd2-shim-runc-v2'
		      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
		        Root = '$run_dir/node$i/runc'
		    [plugins.'io.containerd.cri.v1.runtime'.cni]
		      bin_dirs = ['/usr/lib/cni', '/opt/cni/bin']
		      conf_dir = '$nd/cni'
		  [plugins.'io.containerd.server.v1.grpc']
		    address = '$run_dir/node$i/containerd.sock'
		  [plugins.'io.containerd.server.v1.ttrpc']
		    address = '$run_dir/node$i/containerd.sock.ttrpc'
		  [plugins.'io.containerd.shim.v1.manager']
		    socket_dir = '$run_dir/node$i/shims'
	EOF
	cat >"$nd/scute.toml" <<-EOF
		root = "$nd/scute"
		state = "$run_dir/node$i"
		[grpc]
		address = "$run_dir/node$i/scute.sock"
		[cni]
		conf_dir = "$nd/cni"
		bin_dirs = ["/usr/lib/cni", "/opt/cni/bin"]
		[registry]
		config_path = "$nd/certs.d"
	EOF
	cat >"$nd/cni/10-cluster.conflist" <<-EOF
		{"cniVersion": "1.0.0", "name": "cluster", "plugins": [
		  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
		   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$(pod_cidr "$i")"}]],
		            "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$nd/cni-ipam"}},
		  {"type": "portmap", "capabilities": {"portMappings": true}}
		]}
	EOF
	echo "nameserver $host_ip" >"$nd/resolv.conf"
	make_cert "node$i-kubelet-client" ca "system:node:$name" system:nodes clientAuth
	make_cert "node$i-kubelet-serving" ca "system:node:$name" system:nodes serverAuth "IP:$ip,DNS:$name"
	make_kubeconfig "$nd/kubelet.kubeconfig" "node$i-kubelet-client"
	cat >"$nd/kubelet.yaml" <<-EOF
		apiVersion: kubelet.config.k8s.io/v1beta1
		kind: KubeletConfiguration
		containerRuntimeEndpoint: unix://$(cri_socket "$i")
		address: $ip
		port: 10250
		healthzBindAddress: 127.0.0.1
		healthzPort: 10248
		readOnlyPort: 0
		tlsCertFile: $pki/node$i-kubelet-serving.crt
		tlsPrivateKeyFile: $pki/node$i-kubelet-serving.key
		authentication:
		  anonymous: {enabled: false}
		  webhook: {enabled: true}
		  x509: {clientCAFile: $pki/ca.crt}
		authorization: {mode: Webhook}
		clusterDNS: [$dns_ip]
		clusterDomain: cluster.local
		resolvConf: $nd/resolv.conf
		cgroupDriver: cgroupfs
		cgroupRoot: /scute-cluster-node$i
		cgroupsPerQOS: true
		failSwapOn: false
		oomScoreAdj: 0
		makeIPTablesUtilChains: false
		protectKernelDefaults: false
		evictionHard: {memory.available: "0%", nodefs.available: "0%", nodefs.inodesFree: "0%", imagefs.available: "0%"}
		imageGCHighThresholdPercent: 100
		imageGCLowThresholdPercent: 99
		podLogsDir: $nd/pod-logs
		volumePluginDir: $nd/volume-plugins
		serializeImagePulls: false
		maxPods: ${SCUTE_CLUSTER_MAX_PODS:-110}
		rotateCertificates: false
		serverTLSBootstrap: false
	EOF
	# kubelet 1.35+ refuses cgroup v1 hosts unless told otherwise; a v2 host keeps its default.
	[[ $(stat -fc %T /sys/fs/cgroup) == cgroup2fs ]] || echo "failCgroupV1: false" >>"$nd/kubelet.yaml"
	cat >"$nd/kube-proxy.yaml" <<-EOF
		apiVersion: kubeproxy.config.k8s.io/v1alpha1
		kind: KubeProxyConfiguration
		clientConnection: {kubeconfig: $dir/kube-proxy.kubeconfig}
		hostnameOverride: $name
		mode: iptables
		clusterCIDR: $cluster_cidr
		bindAddress: $ip
		healthzBindAddress: 127.0.0.1:10256
		metricsBindAddress: 127.0.0.1:10249
		# Leave the host-wide conntrack table size alone (not writable from a node's namespace).
		conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
	EOF
	for h in $(cgroup_hierarchies); do
		mkdir -p "$h/scute-cluster-node$i"
		for f in cpuset.cpus cpuset.mems; do
			[[ -f $h/$f ]] && cat "$h/$f" >"$h/scute-cluster-node$i/$f" 2>/dev/null || true
		done
	done
}

start_node() {
	local i=$1 nd runtime
	nd=$dir/node$i
	runtime=$(node_runtime "$i")
	if [[ $runtime == containerd ]]; then
		start "node$i-runtime" nsenter --net="/run/netns/$(node_netns "$i")" -- \
			"$tools/containerd2" --config "$nd/containerd.toml"
	else
		start "node$i-runtime" nsenter --net="/run/netns/$(node_netns "$i")" -- \
			"$repo_root/target/$profile/scute" serve --config "$nd/scute.toml"
	fi
	wait_for "node $i's $runtime" 30 test -S "$(cri_socket "$i")"
	# The kubelet bind-mounts its root dir shared at start when it is not, racing its own
	# pod-resources socket (an EXDEV rename that stops it): the mount is made here first.
	mkdir -p "$nd/kubelet"
	if ! mountpoint -q "$nd/kubelet"; then
		mount --bind "$nd/kubelet" "$nd/kubelet"
		mount --make-shared "$nd/kubelet"
	fi
	start "node$i-kubelet" nsenter --net="/run/netns/$(node_netns "$i")" -- \
		"$tools/kubelet" --config "$nd/kubelet.yaml" --kubeconfig "$nd/kubelet.kubeconfig" \
		--root-dir "$nd/kubelet" --cert-dir "$nd/kubelet-pki" \
		--hostname-override "$(node_name "$i")" --node-ip "$(node_ip "$i")" -v=2
	start "node$i-kube-proxy" nsenter --net="/run/netns/$(node_netns "$i")" -- \
		"$tools/kube-proxy" --config "$nd/kube-proxy.yaml" -v=2
}

coredns() {
	sed "s/@DNS_IP@/$dns_ip/" "$repo_root/hack/cluster/coredns.yaml" | kubectl apply -f - >/dev/null
}

up() {
	local nodes=2 containerd_on=""
	while (($#)); do
		case $1 in
		--nodes) nodes=${2:?} && shift 2 ;;
		--containerd-on) containerd_on=${2:?} && shift 2 ;;
		*) usage ;;
		esac
	done
	((nodes >= 1 && nodes <= 9)) || die "--nodes takes 1 to 9"
	if [[ -n $containerd_on ]]; then
		k8s_tools+=(containerd2 containerd2-shim-runc-v2)
		command -v runc >/dev/null || die "containerd needs runc: apt-get install runc"
	fi
	[[ ! -e $dir/nodes ]] || die "a cluster is already up in $dir (hack/cluster.sh down first)"
	local started=$SECONDS
	find_tools
	for t in openssl curl nsenter ip iptables; do command -v "$t" >/dev/null || die "$t missing: run hack/setup.sh"; done
	[[ -x $repo_root/target/$profile/scute && -x $repo_root/target/$profile/scute-shim ]] || {
		log "building scute ($profile)"
		local flag=()
		[[ $profile == release ]] && flag=(--release)
		(cd "$repo_root" && cargo build "${flag[@]}" --locked -p scute -p scute-shim)
	}
	mkdir -p "$dir"/{logs,pids}
	echo "$nodes" >"$dir/nodes"
	local s
	for s in "${kubelet_sysctls[@]}"; do echo "$s $(cat "/proc/sys/$s")"; done >"$dir/sysctls"
	[[ -e /var/lib/kubelet ]] || : >"$dir/made-var-lib-kubelet"
	log "certificates"
	make_pki
	host_network
	registry_and_images
	log "control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler)"
	control_plane
	local i
	for ((i = 1; i <= nodes; i++)); do
		mkdir -p "$dir/node$i"
		[[ ,$containerd_on, == *,$i,* ]] && echo containerd >"$dir/node$i/runtime"
		node_network "$i"
		node_files "$i"
		start_node "$i"
	done
	log "waiting for $nodes node(s) to register"
	for ((i = 1; i <= nodes; i++)); do
		wait_for "node $(node_name "$i") registering" 120 kubectl get node "$(node_name "$i")"
		# The node's pod range as its CNI config has it (no nodeipam: ranges are fixed here).
		kubectl patch node "$(node_name "$i")" -p "{\"spec\":{\"podCIDR\":\"$(pod_cidr "$i")\",\"podCIDRs\":[\"$(pod_cidr "$i")\"]}}" >/dev/null
	done
	kubectl wait --for=condition=Ready node --all --timeout=120s >/dev/null || die "nodes not Ready: $(kubectl get nodes 2>&1)"
	log "CoreDNS"
	coredns
	kubectl -n kube-system rollout status deployment/coredns --timeout=180s >/dev/null ||
		die "CoreDNS did not become ready: $(kubectl -n kube-system get pods -o wide 2>&1)"
	log "up in $((SECONDS - started)) s; export KUBECONFIG=$dir/admin.kubeconfig"
	kubectl get nodes -o wide >&2
	echo "$dir/admin.kubeconfig"
}

# Unmounts everything mounted under $1, deepest first.
unmount_under() {
	local m
	awk -v p="$1/" 'index($5, p) == 1 { print $5 }' /proc/self/mountinfo | sort -r | while read -r m; do
		umount -l "$m" 2>/dev/null || true
	done
}

# Removes cgroup dir $1 and everything below it, deepest first.
remove_cgroup_tree() {
	[[ -d $1 ]] || return 0
	find "$1" -depth -type d -exec rmdir {} + 2>/dev/null || true
	[[ ! -d $1 ]] || log "warning: cgroup $1 could not be removed (processes left: $(cat "$1"/cgroup.procs 2>/dev/null | tr '\n' ' '))"
}

down() {
	[[ -d $dir ]] || {
		log "no cluster in $dir"
		return 0
	}
	find_tools --optional || log "stopping what runs without the tools (pods left to each runtime's own stop)"
	local nodes i started=$SECONDS
	nodes=$(node_count)
	for ((i = 1; i <= nodes; i++)); do
		stop "node$i-kubelet"
		stop "node$i-kube-proxy"
		if alive "node$i-runtime"; then
			# Every pod goes through the node's runtime, as on a node being drained for good:
			# containers stopped, CNI DEL, mounts and cgroups released.
			"$tools/crictl" --runtime-endpoint "unix://$(cri_socket "$i")" --timeout 60s rmp --all --force \
				>>"$dir/logs/down.log" 2>&1 || log "warning: node $i: crictl rmp -af failed (see $dir/logs/down.log)"
		fi
		stop "node$i-runtime"
		# containerd's shims outlive it (scute's end with their pods).
		pkill -f -- "-address $run_dir/node$i/" 2>/dev/null || true
	done
	stop kube-scheduler
	stop kube-controller-manager
	stop kube-apiserver
	stop etcd
	"$repo_root/hack/registry.sh" stop --dir "$dir/registry" >/dev/null 2>&1 || true
	# What the kubelets mounted (secret, projected and ConfigMap volumes on tmpfs) and anything
	# a failed removal left.
	unmount_under "$dir"
	unmount_under "$run_dir"
	for ((i = 1; i <= nodes; i++)); do
		ip netns del "$(node_netns "$i")" 2>/dev/null || true
		ip link del "sctc-n$i" 2>/dev/null || true
		local h
		for h in $(cgroup_hierarchies); do remove_cgroup_tree "$h/scute-cluster-node$i"; done
	done
	ip link del "$bridge" 2>/dev/null || true
	# The pod ranges' routes went with the bridge; /var/log/containers links into our pod logs.
	find /var/log/containers -maxdepth 1 -type l -lname "$dir/*" -delete 2>/dev/null || true
	if [[ -f $dir/sysctls ]]; then
		local s v
		while read -r s v; do echo "$v" >"/proc/sys/$s" 2>/dev/null || true; done <"$dir/sysctls"
	fi
	if [[ -f $dir/made-var-lib-kubelet ]]; then
		rm -rf /var/lib/kubelet
	fi
	rm -rf --one-file-system "$dir" "$run_dir"
	log "down in $((SECONDS - started)) s: nothing left"
}

status() {
	[[ -f $dir/nodes ]] || {
		echo "no cluster in $dir"
		return 1
	}
	find_tools
	local f
	for f in "$dir"/pids/*; do
		printf '%-28s %s\n' "$(basename "$f")" "$(alive "$(basename "$f")" && echo "running (pid $(cat "$f"))" || echo "NOT RUNNING")"
	done
	kubectl get nodes -o wide
	kubectl -n kube-system get pods -o wide
}

[[ $(id -u) -eq 0 ]] || die "must run as root (network namespaces, mounts, cgroups)"
case ${1:-} in
up) shift && up "$@" ;;
down) down ;;
status) status ;;
kubeconfig) echo "$dir/admin.kubeconfig" ;;
*) usage ;;
esac
