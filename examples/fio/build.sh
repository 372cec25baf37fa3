#!/usr/bin/env bash
# build.sh — build mcqio's fio external ioengine, libmcqio_fio.so.
#
#   bash examples/fio/build.sh            # prints the .so's path as its last line
#   fio --ioengine=external:$(bash examples/fio/build.sh | tail -n1) --thread ...
#
# fio installs no headers, so the C shim is compiled against fio's own source
# tree: Debian's source package of the installed fio, configured once so its
# generated config-host.h exists (fio itself is not built; Debian's fio
# package provides the binary). Idempotent: what exists is reused. Everything
# goes under <cargo target dir>/fio/ (target/ unless CARGO_TARGET_DIR or
# cargo's config says otherwise; git-ignored). The source package comes
# through a private apt configuration under that directory: nothing is
# written to /etc or to apt's own lists. Root (apt-get install) is needed
# only when fio or dpkg-dev is missing; set FIO_SRC=<dir> to use a
# configured fio tree of your own instead. apt's and configure's output
# goes to fio/build.log, shown only when a step fails.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
log() { printf 'build.sh: %s\n' "$*" >&2; }
die() { printf 'build.sh: error: %s\n' "$*" >&2; exit 1; }

# Where cargo puts its output: CARGO_TARGET_DIR, build.target-dir, or target/.
target=$(cd "$root" && cargo metadata --no-deps --format-version 1 2>/dev/null |
	sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
[ -n "$target" ] || target=${CARGO_TARGET_DIR:-$root/target}
out="$target/fio"
mkdir -p "$out"
: >"$out/build.log"
# quiet WHAT CMD...: run CMD with its output in build.log; on failure show it.
quiet() {
	local what=$1
	shift
	if ! "$@" >>"$out/build.log" 2>&1; then
		tail -n 40 "$out/build.log" >&2
		die "$what failed (the whole log: $out/build.log)"
	fi
}

# The ioengine ABI the shim was written against (fio 3.33).
want_ioops=31

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# 1. fio itself (the binary that will load the engine).
if ! command -v fio >/dev/null; then
	log "installing fio (apt-get install fio)"
	quiet "apt-get install fio" as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fio
fi
fio_ver=$(fio --version)            # e.g. fio-3.33
fio_ver=${fio_ver#fio-}

# 2. fio's source tree, same version.
src=${FIO_SRC:-$out/src}
if [ ! -f "$src/ioengines.h" ]; then
	[ -z "${FIO_SRC:-}" ] || die "FIO_SRC=$FIO_SRC has no ioengines.h"
	if ! command -v dpkg-source >/dev/null; then
		log "installing dpkg-dev (apt-get install dpkg-dev) for dpkg-source"
		quiet "apt-get install dpkg-dev" as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dpkg-dev
	fi
	# A private apt configuration: one deb-src entry on the mirror apt
	# already uses (no host name is written into the repository), its own
	# lists and cache under $out/apt. The system's sources and lists are
	# read, never changed.
	uri=$(sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v security | head -n1 || true)
	[ -n "$uri" ] || uri=$(awk '$1=="deb" && $0 !~ /security/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
	[ -n "$uri" ] || die "no Debian mirror found in the apt sources; set FIO_SRC to a configured fio $fio_ver tree"
	base=$(. /etc/os-release; echo "$VERSION_CODENAME")
	apt_dir="$out/apt"
	rm -rf "$apt_dir" && mkdir -p "$apt_dir/sources.d" "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
	printf 'Types: deb-src\nURIs: %s\nSuites: %s %s-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
		"$uri" "$base" "$base" >"$apt_dir/sources.d/fio-src.sources"
	apt_private=(-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$apt_dir/sources.d"
		-o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache="$apt_dir/cache"
		-o Debug::NoLocking=1 -o APT::Sandbox::User="$(id -un)")
	log "fetching fio's source package (deb-src on $base, private apt lists under $apt_dir)"
	quiet "apt-get update (private lists)" apt-get "${apt_private[@]}" update
	rm -rf "$out/dl" && mkdir -p "$out/dl"
	quiet "apt-get source fio (is the installed fio's version still in the archive?)" \
		sh -c 'cd "$1" && shift && exec apt-get "$@"' sh "$out/dl" "${apt_private[@]}" \
		source --download-only "fio=$(dpkg-query -W -f='${Version}' fio)"
	rm -rf "$src"
	quiet "dpkg-source -x" dpkg-source -x "$out"/dl/fio_*.dsc "$src"
fi
[ -f "$src/FIO-VERSION-GEN" ] || die "$src is not a fio source tree"
src_ver=$(sed -n 's/^DEF_VER=fio-//p' "$src/FIO-VERSION-GEN")
[ "$src_ver" = "$fio_ver" ] ||
	die "the installed fio is $fio_ver but the source tree ($src) is fio $src_ver: an engine only loads into the fio whose headers it was built with (struct ioengine_ops and FIO_IOOPS_VERSION change between releases)"
ioops=$(sed -n 's/^#define[[:space:]]*FIO_IOOPS_VERSION[[:space:]]*\([0-9]*\).*/\1/p' "$src/ioengines.h")
[ "$ioops" = "$want_ioops" ] ||
	die "fio $src_ver has FIO_IOOPS_VERSION $ioops but mcqio_fio.c was written for $want_ioops (fio 3.33): port the shim to this fio's struct ioengine_ops first"

# 3. config-host.h (configure once, as Debian's build does).
if [ ! -f "$src/config-host.h" ]; then
	log "configuring fio $src_ver (headers only; fio is not built)"
	quiet "fio's configure" sh -c 'cd "$1" && ./configure --disable-native --prefix=/usr' sh "$src"
fi

# 4. The Rust static library.
log "building the mcqio-fio static library (release)"
(cd "$root" && cargo build --release -p mcqio-fio >&2)
lib="$target/${CARGO_BUILD_TARGET:+$CARGO_BUILD_TARGET/}release/libmcqio_fio.a"
[ -f "$lib" ] || die "$lib was not built"

# 5. Shim + static library -> libmcqio_fio.so.
so="$out/libmcqio_fio.so"
cc=${CC:-cc}
log "linking $so"
# The Rust library needs libc's thread, dl, math and unwind symbols; fio's own
# symbols (log_err, ...) resolve against the fio binary at dlopen time.
# -z nodelete: never unmap the library while a device thread may still run.
"$cc" -O2 -g -Wall -shared -fPIC -rdynamic -Wl,-z,nodelete \
	-include "$src/config-host.h" -I"$src" -I"$here" -D_GNU_SOURCE \
	-o "$so.tmp" "$here/mcqio_fio.c" \
	"$lib" \
	-lpthread -ldl -lm -lgcc_s
mv "$so.tmp" "$so"
echo "$so"
