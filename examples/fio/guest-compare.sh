#!/bin/sh
# guest-compare.sh — one fio job file, two I/O paths, side by side:
# fio + mcqio's engine on the controller through VFIO, and fio's io_uring
# engine on the kernel's block device of the same controller; 4k randread
# at QD1 and QD32. Written for the guest VM (busybox ash), runs anywhere.
#
#   BDF=0000:00:04.0 guest-compare.sh    # guest: switches the controller's driver
#   MCQIO_FILE=fake KDEV=/tmp/f guest-compare.sh   # host self-test (no binding)
#   MCQIO_FILE=vfio-0000.00.02.0 KDEV=/dev/sda guest-compare.sh
#                                        # two controllers, none switched: the UFS
#                                        # guest's (one on vfio-pci, one on ufshcd-pci)
#
# Environment:
#   FIO                   the fio binary (default: ./fio next to this script, else
#                         fio from PATH; it must be the version the engine was built for)
#   ENGINE=<path>         libmcqio_fio.so (default: next to this script)
#   BDF                   PCI address of the NVMe controller (default: the first
#                         NVMe controller, unless MCQIO_FILE is set); the script
#                         binds it to nvme for io_uring and to vfio-pci for mcqio
#                         (sysfs writes) and leaves it on nvme at the end
#   KDEV=/dev/nvme0n1     the kernel's block device for io_uring
#   MCQIO_FILE            the engine's --filename (default vfio-<BDF with dots>)
#   SECS=3 SIZE=64m       run time per point and the region read
#   KERNEL_FAILS=warn     a failed io_uring point is reported, not a failure
#                         (default: fail); for a kernel driver known to lose
#                         completions on the emulated controller
# Prints a table; exit status non-zero when any run fails.
set -u
here=$(cd "$(dirname "$0")" && pwd)
if [ -z "${FIO:-}" ]; then
	# The fio staged next to this script (guest-payload.sh), else the PATH's.
	if [ -x "$here/fio" ]; then FIO=$here/fio; else FIO=fio; fi
fi
ENGINE=${ENGINE:-$here/libmcqio_fio.so}
BDF=${BDF:-}
KDEV=${KDEV:-/dev/nvme0n1}
SECS=${SECS:-3}
SIZE=${SIZE:-64m}
KERNEL_FAILS=${KERNEL_FAILS:-fail}
if [ -z "${MCQIO_FILE:-}" ]; then
	if [ -z "$BDF" ]; then
		for d in /sys/bus/pci/devices/*; do
			if [ "$(cat "$d/class" 2>/dev/null)" = 0x010802 ]; then BDF=${d##*/}; break; fi
		done
	fi
	[ -n "$BDF" ] || { echo "guest-compare: no NVMe controller found; set BDF (or MCQIO_FILE)" >&2; exit 2; }
	MCQIO_FILE=vfio-$(echo "$BDF" | tr ':' '.')
fi
out=${TMPDIR:-/tmp}/fio-compare.$$
mkdir -p "$out"
trap 'rm -rf "$out"' EXIT

# The one job file: both runs differ only in ${IOENGINE}, ${FILE} and ${QD}.
cat >"$out/job.fio" <<'EOF'
[global]
ioengine=${IOENGINE}
filename=${FILE}
thread=1
direct=1
rw=randread
bs=4k
iodepth=${QD}
size=${SIZE}
time_based=1
runtime=${SECS}
norandommap=1
randrepeat=0

[randread]
EOF

driver_of() {
	if [ -e "/sys/bus/pci/devices/$BDF/driver" ]; then
		basename "$(readlink "/sys/bus/pci/devices/$BDF/driver")"
	else
		echo none
	fi
}
# bind DRIVER WAITFOR: move the controller to DRIVER, wait for WAITFOR.
bind() {
	[ -n "$BDF" ] || return 0
	[ "$(driver_of)" = "$1" ] && return 0
	[ -e "/sys/bus/pci/devices/$BDF/driver" ] && echo "$BDF" >"/sys/bus/pci/devices/$BDF/driver/unbind"
	if [ "$1" = vfio-pci ]; then
		echo vfio-pci >"/sys/bus/pci/devices/$BDF/driver_override"
	else
		echo >"/sys/bus/pci/devices/$BDF/driver_override"
	fi
	echo "$BDF" >/sys/bus/pci/drivers_probe
	i=0
	while [ ! -e "$2" ] && [ $i -lt 200 ]; do
		sleep 0.1
		i=$((i + 1))
	done
	[ "$(driver_of)" = "$1" ] || { echo "guest-compare: $BDF is on $(driver_of), not $1" >&2; return 1; }
}

fail=0
# point NAME IOENGINE FILE QD: run the job; prints "IOPS lat_avg_us", or
# "0 0" after printing why it failed (it runs in a subshell: callers check).
point() {
	rc=0
	IOENGINE=$2 FILE=$3 QD=$4 SIZE=$SIZE SECS=$SECS \
		"$FIO" --output-format=terse --terse-version=3 --output="$out/$1-$4.t" "$out/job.fio" \
		>"$out/$1-$4.log" 2>&1 || rc=$?
	# terse v3: field 5 error, 8 read IOPS, 40 read total latency mean (us)
	line=$(grep '^3;' "$out/$1-$4.t" 2>/dev/null | head -n1)
	err=$(echo "$line" | cut -d';' -f5)
	if [ "$rc" != 0 ] || [ -z "$line" ] || [ "$err" != 0 ]; then
		echo "guest-compare: $1 QD$4 failed (fio exit $rc, error ${err:-none}):" >&2
		sed 's/^/    /' "$out/$1-$4.log" >&2
		fail=1
		echo "0 0"
		return
	fi
	echo "$line" | awk -F';' '{ printf "%.0f %.1f\n", $8, $40 }'
}
# ok RESULT: whether a point produced a number.
ok() { [ "${1%% *}" != 0 ]; }

bind nvme "$KDEV" || exit 1
k1=$(point io_uring io_uring "$KDEV" 1)
k32=$(point io_uring io_uring "$KDEV" 32)
if [ -n "$BDF" ]; then
	group=$(basename "$(readlink "/sys/bus/pci/devices/$BDF/iommu_group")")
	bind vfio-pci "/dev/vfio/$group" || exit 1
fi
m1=$(point mcqio "external:$ENGINE" "$MCQIO_FILE" 1)
m32=$(point mcqio "external:$ENGINE" "$MCQIO_FILE" 32)
bind nvme "$KDEV" || fail=1
for r in "$m1" "$m32"; do ok "$r" || fail=1; done
for r in "$k1" "$k32"; do
	ok "$r" && continue
	if [ "$KERNEL_FAILS" = warn ]; then
		echo "guest-compare: the kernel's io_uring point failed (KERNEL_FAILS=warn: reported, not a failure)" >&2
	else
		fail=1
	fi
done

echo
echo "fio 4k randread, ${SECS} s per point, same job file ($SIZE region)"
printf '%-6s %-34s %12s %12s\n' QD "path" IOPS "lat avg us"
for qd in 1 32; do
	eval "k=\$k$qd m=\$m$qd"
	printf '%-6s %-34s %12s %12s\n' "$qd" "io_uring on $KDEV" $k
	printf '%-6s %-34s %12s %12s\n' "$qd" "mcqio engine on $MCQIO_FILE" $m
	echo "$k $m" | awk -v qd="$qd" '$1 > 0 { printf "QD%s: mcqio/io_uring IOPS = %.2f\n", qd, $3 / $1 }'
done
exit $fail
