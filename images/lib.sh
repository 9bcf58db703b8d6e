# Helpers images/build.sh and images/cluster.sh share (sourced; they define log and die, and
# kit, work and registry for build_and_push).

# Copies host file $1 to the same path under rootfs $2, following symlinks.
copy_at_same_path() {
	local src=$1 rootfs=$2
	mkdir -p "$rootfs$(dirname "$src")"
	cp -L "$src" "$rootfs$src"
}

# Copies the shared libraries binary $1 needs (as ldd lists them on this host,
# with the loader) to the same paths under rootfs $2.
copy_libraries() {
	local bin=$1 rootfs=$2 ldd_out lib
	ldd_out=$(ldd "$bin") || die "ldd $bin failed"
	if grep -q 'not found' <<<"$ldd_out"; then
		die "$bin needs libraries this host lacks (run hack/setup.sh):"$'\n'"$(grep 'not found' <<<"$ldd_out")"
	fi
	while read -r lib; do
		copy_at_same_path "$lib" "$rootfs"
	done < <(awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' <<<"$ldd_out")
}

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
