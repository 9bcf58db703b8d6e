#!/usr/bin/env bash
# Runs Debian's docker-registry (distribution 2.8) on loopback for tests.
#
#   hack/registry.sh start [--addr 127.0.0.1:PORT] [--dir DIR] [--htpasswd USER:PASSWORD]
#                          [--tls-cert CERT --tls-key KEY]
#       Starts a registry with filesystem storage under DIR (default: a new
#       temp dir), waits until GET /v2/ answers 200, then prints
#       REGISTRY_ADDR=... and REGISTRY_DIR=... on stdout. A DIR used before
#       keeps its images.
#       --htpasswd turns on HTTP basic auth for that one user (bcrypt htpasswd
#       file DIR/htpasswd): every request without those credentials gets 401.
#       Still plain HTTP: distribution only warns that basic auth without TLS
#       is insecure, which on loopback it is not.
#       --tls-cert and --tls-key (PEM files) serve HTTPS instead of HTTP.
#   hack/registry.sh stop --dir DIR
#       Stops the registry started with that DIR and waits for it to exit.
#
# DIR holds config.yml, registry.pid, registry.log, storage/ and, with
# --htpasswd, htpasswd.
set -euo pipefail

readonly default_addr=127.0.0.1:5000
readonly start_timeout_s=10
readonly stop_timeout_s=10

usage() {
	echo "usage: $0 start [--addr HOST:PORT] [--dir DIR] [--htpasswd USER:PASSWORD] [--tls-cert CERT --tls-key KEY]" >&2
	echo "       $0 stop --dir DIR" >&2
	exit 2
}

die() {
	echo "registry.sh: $*" >&2
	exit 1
}

# Prints the pid from DIR/registry.pid if that process is still alive.
running_pid() {
	local pid_file=$1/registry.pid pid
	[[ -f $pid_file ]] || return 1
	pid=$(<"$pid_file")
	[[ $pid =~ ^[0-9]+$ ]] || return 1
	kill -0 "$pid" 2>/dev/null || return 1
	echo "$pid"
}

# Writes DIR/htpasswd with one bcrypt entry (distribution accepts bcrypt only).
write_htpasswd() {
	local dir=$1 user=$2 password=$3
	if command -v htpasswd >/dev/null; then
		htpasswd -Bbn "$user" "$password" >"$dir/htpasswd"
	elif python3 -c 'import bcrypt' 2>/dev/null; then
		# Through the environment: keeps the password out of python's argv.
		HTPASSWD_USER=$user HTPASSWD_PASSWORD=$password python3 -c '
import bcrypt, os
hashed = bcrypt.hashpw(os.environ["HTPASSWD_PASSWORD"].encode(), bcrypt.gensalt()).decode()
print(os.environ["HTPASSWD_USER"] + ":" + hashed)' >"$dir/htpasswd"
	else
		die "--htpasswd needs htpasswd (apache2-utils) or python3's bcrypt; run hack/setup.sh"
	fi
}

write_config() {
	local dir=$1 addr=$2 with_auth=$3 tls_cert=$4 tls_key=$5
	# A set http.secret silences the "No HTTP secret provided" warning.
	cat >"$dir/config.yml" <<EOF
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $dir/storage
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: $addr
  secret: $(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  headers:
    X-Content-Type-Options: [nosniff]
EOF
	if [[ -n $tls_cert ]]; then
		cat >>"$dir/config.yml" <<EOF
  tls:
    certificate: $tls_cert
    key: $tls_key
EOF
	fi
	if ((with_auth)); then
		cat >>"$dir/config.yml" <<EOF
auth:
  htpasswd:
    realm: scute-test-registry
    path: $dir/htpasswd
EOF
	fi
}

cmd_start() {
	local addr=$default_addr dir="" credentials="" tls_cert="" tls_key=""
	while (($#)); do
		case $1 in
		--addr) addr=${2:?--addr needs a value}; shift 2 ;;
		--dir) dir=${2:?--dir needs a value}; shift 2 ;;
		--htpasswd) credentials=${2:?--htpasswd needs USER:PASSWORD}; shift 2 ;;
		--tls-cert) tls_cert=$(realpath "${2:?--tls-cert needs a file}"); shift 2 ;;
		--tls-key) tls_key=$(realpath "${2:?--tls-key needs a file}"); shift 2 ;;
		*) usage ;;
		esac
	done
	if [[ -n $tls_cert && -z $tls_key ]] || [[ -z $tls_cert && -n $tls_key ]]; then
		die "--tls-cert and --tls-key go together"
	fi
	# The readiness probe does not check the certificate: it only waits for the registry.
	local scheme=http curl_tls=()
	if [[ -n $tls_cert ]]; then
		scheme=https
		curl_tls=(--insecure)
	fi
	local user="" password="" with_auth=0 curl_auth=()
	if [[ -n $credentials ]]; then
		# Split at the first colon: htpasswd user names cannot hold one.
		user=${credentials%%:*}
		password=${credentials#*:}
		[[ $credentials == *:* && -n $user && -n $password ]] || die "--htpasswd wants USER:PASSWORD"
		with_auth=1
		curl_auth=(--user "$user:$password")
	fi
	command -v docker-registry >/dev/null || die "docker-registry not found; run hack/setup.sh"
	command -v curl >/dev/null || die "curl not found; run hack/setup.sh"

	if [[ -z $dir ]]; then
		dir=$(mktemp -d -t scute-registry.XXXXXX)
	else
		mkdir -p "$dir"
	fi
	dir=$(cd "$dir" && pwd)

	if pid=$(running_pid "$dir"); then
		die "a registry (pid $pid) already runs with $dir; stop it first"
	fi
	# Otherwise the readiness probe below could be answered by whatever already
	# listens there while our registry fails to bind.
	if curl -s -o /dev/null --max-time 1 "http://$addr/"; then
		die "something already listens on $addr"
	fi
	mkdir -p "$dir/storage"
	if ((with_auth)); then
		write_htpasswd "$dir" "$user" "$password"
	fi
	write_config "$dir" "$addr" "$with_auth" "$tls_cert" "$tls_key"

	# setsid: the registry must outlive this script and not get the caller's
	# terminal signals.
	setsid docker-registry serve "$dir/config.yml" </dev/null >"$dir/registry.log" 2>&1 &
	local pid=$!
	echo "$pid" >"$dir/registry.pid"

	local deadline=$((SECONDS + start_timeout_s)) code
	while :; do
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "registry.sh: docker-registry exited during start; log tail:" >&2
			tail -n 20 "$dir/registry.log" >&2 || true
			rm -f "$dir/registry.pid"
			exit 1
		fi
		code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "${curl_auth[@]}" "${curl_tls[@]}" "$scheme://$addr/v2/" || true)
		[[ $code == 200 ]] && break
		if ((SECONDS >= deadline)); then
			echo "registry.sh: $scheme://$addr/v2/ did not answer 200 within ${start_timeout_s}s (last: ${code:-none}); log tail:" >&2
			tail -n 20 "$dir/registry.log" >&2 || true
			kill "$pid" 2>/dev/null || true
			rm -f "$dir/registry.pid"
			exit 1
		fi
		sleep 0.1
	done

	echo "REGISTRY_ADDR=$addr"
	echo "REGISTRY_DIR=$dir"
}

cmd_stop() {
	local dir=""
	while (($#)); do
		case $1 in
		--dir) dir=${2:?--dir needs a value}; shift 2 ;;
		*) usage ;;
		esac
	done
	[[ -n $dir ]] || usage
	[[ -d $dir ]] || die "no such directory: $dir"

	local pid
	if ! pid=$(running_pid "$dir"); then
		# Already stopped: stop is idempotent.
		rm -f "$dir/registry.pid"
		return 0
	fi
	# Make sure the pid really is our registry before signalling it (pids get reused).
	if [[ $(cat "/proc/$pid/comm" 2>/dev/null) != docker-registry* ]]; then
		rm -f "$dir/registry.pid"
		return 0
	fi

	kill -TERM "$pid"
	local deadline=$((SECONDS + stop_timeout_s))
	while kill -0 "$pid" 2>/dev/null; do
		if ((SECONDS >= deadline)); then
			echo "registry.sh: pid $pid ignored SIGTERM for ${stop_timeout_s}s; sending SIGKILL" >&2
			kill -KILL "$pid" 2>/dev/null || true
		fi
		sleep 0.1
	done
	rm -f "$dir/registry.pid"
}

case ${1:-} in
start) shift; cmd_start "$@" ;;
stop) shift; cmd_stop "$@" ;;
*) usage ;;
esac
