#!/usr/bin/env bash
# guest-payload.sh DEST — stage fio, the mcqio engine and guest-compare.sh
# for the guest VM's initramfs, under DEST with absolute paths kept:
#
#   DEST/opt/mcqio/fio/{fio,libmcqio_fio.so,guest-compare.sh}
#   DEST/lib*/...   the shared libraries both need (the guest has no libc)
#
# fio is built from the same configured source tree the engine was built
# against (build.sh's <target>/fio/src), so versions and layouts match by
# construction, and it is lean: only what that tree's configure found (libc,
# libm, zlib), not the 60+ libraries of Debian's fio package. Its io_uring
# engine is always built in on Linux. Copy DEST into the initramfs root
# (cp -a DEST/. ROOT/) and run, in the guest:
#
#   BDF=<controller> /opt/mcqio/fio/guest-compare.sh
#
# The last line of output is DEST.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
dest=${1:?usage: guest-payload.sh DEST}
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)

so=$(bash "$here/build.sh" | tail -n1)
fio_dir=$(dirname "$so") # <cargo target dir>/fio, wherever build.sh found it
src=${FIO_SRC:-$fio_dir/src}
if [ ! -x "$src/fio" ] || [ "$src/config-host.h" -nt "$src/fio" ]; then
	echo "guest-payload.sh: building fio from $src (a few minutes)" >&2
	make -C "$src" -j"$(nproc)" fio >"$fio_dir/fio-make.log" 2>&1 ||
		{ echo "guest-payload.sh: fio's make failed; see $fio_dir/fio-make.log" >&2; exit 1; }
fi
want=$(fio --version 2>/dev/null || true)
got=$("$src/fio" --version)
[ -z "$want" ] || [ "$want" = "$got" ] ||
	{ echo "guest-payload.sh: built $got but the engine was checked against $want" >&2; exit 1; }

bin="$dest/opt/mcqio/fio"
mkdir -p "$bin"
install -m 755 "$src/fio" "$bin/fio"
install -m 755 "$so" "$bin/libmcqio_fio.so"
install -m 755 "$here/guest-compare.sh" "$bin/guest-compare.sh"
strip --strip-debug "$bin/fio" "$bin/libmcqio_fio.so" 2>/dev/null || true

# The shared-library closure of both, at the paths the dynamic loader expects.
for lib in $({ ldd "$src/fio"; ldd "$so"; } | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u); do
	mkdir -p "$dest$(dirname "$lib")"
	cp -L "$lib" "$dest$lib"
done
echo "guest-payload.sh: $(du -sh "$dest" | cut -f1) staged" >&2
echo "$dest"
