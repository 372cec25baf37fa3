#!/usr/bin/env bash
# test.sh — build the fio engine and run fio on the fake controller:
# randwrite then randread with verify=crc32c, and randrw (rwmixread=70) with
# verify, each at iodepth 1 and 32 with 1 and 2 jobs; plus bsrange, trim,
# flush and batched submit/complete. The same verify, randrw and mixed runs
# on the fake UFS host controller (fake-ufs: MCQ, and the legacy
# single-doorbell list with mcq=0), and on an NVMe/TCP target (the
# fixtures' mcqio-fake-tcp on loopback). Every run must exit 0 and report no job
# error in its JSON. Prints an IOPS table, then the same randread workload
# through fio+engine and through mcqio-perf on the same fake device, NVMe and
# UFS.
# The IOPS are printed, not asserted: a shared machine makes them noisy.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
command -v jq >/dev/null || { echo "test.sh: jq is needed to read fio's JSON" >&2; exit 1; }

so=$(bash "$here/build.sh" | tail -n1)
[ -f "$so" ] || { echo "test.sh: build.sh did not print the engine's path" >&2; exit 1; }
# cargo's target directory (CARGO_TARGET_DIR, build.target-dir or target/), as build.sh finds it.
target=$(cd "$root" && cargo metadata --no-deps --format-version 1 2>/dev/null |
	sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
[ -n "$target" ] || target=${CARGO_TARGET_DIR:-$root/target}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" # fio resolves relative names here; the engine creates no files

ncpu=$(nproc)
rows=()
failed=0

# build.sh honours CARGO_TARGET_DIR (it used to build there,
# then look for the library under target/). A fresh directory, so the
# release build of mcqio-fio runs once more (FIO_TEST_TARGET_DIR=0 skips it);
# the configured fio tree is reused.
if [ "${FIO_TEST_TARGET_DIR:-1}" != 0 ]; then
	alt="$work/other-target"
	so_alt=$(CARGO_TARGET_DIR="$alt" FIO_SRC="$target/fio/src" bash "$here/build.sh" 2>"$work/build-alt.log" | tail -n1) || true
	if [ "$so_alt" != "$alt/fio/libmcqio_fio.so" ] || [ ! -f "$so_alt" ]; then
		echo "FAIL build.sh with CARGO_TARGET_DIR=$alt printed '$so_alt'" >&2
		sed 's/^/    /' "$work/build-alt.log" >&2
		failed=1
	fi
	rm -rf "$alt"
fi

# refuse NAME WANT FIO-ARGS...: a job the engine cannot run; fio's log must
# carry the engine's reason WANT (fio by itself says only err=22). The
# device is $refuse_file (default fake).
refuse() {
	local name=$1 want=$2
	shift 2
	fio --ioengine=external:"$so" --thread --filename="${refuse_file:-fake}" --rw=randread --size=1m \
		--name="$name" "$@" >"$work/$name.log" 2>&1 || true
	if ! grep -qF -- "$want" "$work/$name.log"; then
		echo "FAIL $name: the engine's reason is missing (want: $want)" >&2
		sed 's/^/    /' "$work/$name.log" >&2
		failed=1
	fi
}
refuse bs-unaligned "bs 1024 is not a multiple of the device's 4096-byte logical block" --bs=1k
refuse bsrange-unaligned "bs 6144 is not a multiple of the device's 4096-byte logical block" --bsrange=4k-6k
# A duration needs its unit, as in mcqio-perf's device strings.
refuse latency-unit 'option `fake_latency=10` needs a unit' --fake_latency=10
refuse timeout-unit 'option `io_timeout=30` needs a unit' --io_timeout=30
# fio's hipri asks for polling; it cannot come with wait=irq.
refuse hipri-irq 'it contradicts wait=irq|hybrid' --hipri --wait=irq

# fio's JSON output file, minus any warning fio printed into it first
# (e.g. "multiple writers may overwrite blocks", which ignores offset_increment).
json_of() { sed -n '/^{/,$p' "$1"; }

# run NAME JOBFILE: fio with JSON output; checks exit code and job errors.
run() {
	local name=$1 jobfile=$2 raw="$work/$1.out" json="$work/$1.json" rc=0
	fio --output-format=json --output="$raw" "$jobfile" >"$work/$name.log" 2>&1 || rc=$?
	json_of "$raw" >"$json" || true
	local errs
	errs=$(jq '[.jobs[] | select(.error != 0)] | length' "$json" 2>/dev/null || echo "no JSON")
	local ios
	ios=$(jq '[.jobs[] | .read.total_ios + .write.total_ios + .trim.total_ios] | add' "$json" 2>/dev/null || echo 0)
	if [ "$rc" != 0 ] || [ "$errs" != 0 ] || [ "${ios:-0}" = 0 ]; then
		echo "FAIL $name: fio exit $rc, jobs with errors: $errs, I/Os: $ios" >&2
		sed 's/^/    /' "$work/$name.log" >&2 || true
		jq -c '.jobs[] | {jobname, error}' "$json" >&2 2>/dev/null || true
		failed=1
		return
	fi
	# One row per job name (clones of numjobs summed).
	while IFS=$'\t' read -r job r w t; do
		rows+=("$(printf '%-24s %-12s %10.0f %10.0f %10.0f' "$name" "$job" "$r" "$w" "$t")")
	done < <(jq -r '.jobs | group_by(.jobname)[] |
		[.[0].jobname, (map(.read.iops) | add), (map(.write.iops) | add), (map(.trim.iops) | add)] | @tsv' "$json")
}

# global [FILENAME]: the [global] section; the device is fake unless given.
global() {
	cat <<EOF
[global]
ioengine=external:$so
thread=1
filename=${1:-fake}
fake_size=64m
bs=4k
size=8m
offset_increment=8m
group_reporting=0
EOF
}

# Job bodies shared by the NVMe and UFS runs.
# verify_jobs QD NJ: random writes, then read back and verified.
verify_jobs() {
	cat <<EOF
iodepth=$1
numjobs=$2
verify=crc32c

[randwrite]
rw=randwrite
do_verify=0

[randread]
stonewall
rw=randread
EOF
}

# mixed_jobs: bsrange, sequential write+read with batched submit/complete
# and flushes (fsync: NVMe Flush, SCSI SYNCHRONIZE CACHE), and trim (NVMe
# deallocate, SCSI UNMAP).
mixed_jobs() {
	cat <<EOF
iodepth=16

[bsrange]
rw=randwrite
bsrange=4k-64k
verify=crc32c

[batched]
stonewall
rw=write
iodepth_batch_submit=8
iodepth_batch_complete_min=4
iodepth_batch_complete_max=16
fsync=64
verify=crc32c

[trim]
stonewall
rw=trim
bs=64k
EOF
}

for qd in 1 32; do
	for nj in 1 2; do
		f="$work/verify-qd$qd-j$nj.fio"
		{
			global
			verify_jobs "$qd" "$nj"
		} >"$f"
		run "verify-qd$qd-j$nj" "$f"

		f="$work/randrw-qd$qd-j$nj.fio"
		{
			global
			cat <<EOF
iodepth=$qd
numjobs=$nj

[randrw]
rw=randrw
rwmixread=70
verify=crc32c
EOF
		} >"$f"
		run "randrw-qd$qd-j$nj" "$f"
	done
done

f="$work/mixed.fio"
{
	global
	mixed_jobs
} >"$f"
run mixed "$f"

# The same verify jobs with getevents sleeping on the queue's
# interrupt (wait=irq, hybrid), and with fio's hipri (polling), NVMe and UFS.
for w in wait=irq wait=hybrid:20us hipri; do
	for dev in fake fake-ufs; do
		f="$work/wait-$dev-${w%%=*}.fio"
		{
			global "$dev"
			[ "$dev" = fake-ufs ] && echo "qpairs=2"
			echo "$w"
			verify_jobs 8 1
		} >"$f"
		run "$dev-${w//[=:]/-}" "$f"
	done
done

# The same on the fake UFS host controller (4 KiB blocks, LU 0 by default):
# each job gets its own MCQ SQ/CQ pair. Its fake_size is per LU. The
# controller bounds queues x depth to the 256 task tags; these jobs ask for
# 2 queues (32 slots each) rather than fio's default 64 (32 queues of 8),
# so they are never answered busy (the busy path has its own jobs below).
UFS_QPAIRS=2
for qd in 1 32; do
	for nj in 1 2; do
		f="$work/ufs-verify-qd$qd-j$nj.fio"
		{
			global fake-ufs
			echo "qpairs=$UFS_QPAIRS"
			verify_jobs "$qd" "$nj"
		} >"$f"
		run "ufs-verify-qd$qd-j$nj" "$f"
	done
done
# The busy path: fio's default qpairs (64, so 32 queues of 8 slots) under
# iodepth 32 makes the engine answer busy and fio requeue; a write job then
# a verifying read job, and a mixed job verifying with verify_backlog, keep
# every block's data through it.
f="$work/ufs-busy-verify.fio"
{
	global fake-ufs
	verify_jobs 32 2
} >"$f"
run ufs-busy-verify-qd32-8slots "$f"
f="$work/ufs-busy-randrw-backlog.fio"
{
	global fake-ufs
	cat <<EOF
iodepth=32
numjobs=2

[randrw]
rw=randrw
rwmixread=70
verify=crc32c
verify_backlog=64
EOF
} >"$f"
run ufs-busy-randrw-backlog-qd32-8slots "$f"
# A mixed job whose verify replays seeds in log order cannot be answered
# busy (fio re-logs a requeued write at the end): refused, with the reason.
refuse_file=fake-ufs refuse ufs-busy-randrw-ordered-verify \
	"a mixed rw job with verify cannot be answered busy" --rw=randrw --verify=crc32c --iodepth=32

f="$work/ufs-randrw.fio"
{
	global fake-ufs,lun=1
	echo "qpairs=$UFS_QPAIRS"
	cat <<EOF
fake_namespaces=2
iodepth=32
numjobs=2

[randrw]
rw=randrw
rwmixread=70
verify=crc32c
EOF
} >"$f"
run ufs-randrw-lun1-qd32-j2 "$f"
f="$work/ufs-mixed.fio"
{
	global fake-ufs
	echo "qpairs=$UFS_QPAIRS"
	mixed_jobs
} >"$f"
run ufs-mixed "$f"
# The legacy single-doorbell list (mcq=0): one queue pair, so one job.
f="$work/ufs-legacy.fio"
{
	global fake-ufs
	cat <<EOF
mcq=0
iodepth=16
verify=crc32c

[randwrite]
rw=randwrite
do_verify=0

[randread]
stonewall
rw=randread
EOF
} >"$f"
run ufs-legacy-qd16 "$f"

# An NVMe/TCP target, the fixtures' fake as a process
# (mcqio-fake-tcp ram: 64 MiB in 4 KiB blocks on a loopback port; filename
# tcp\:127.0.0.1\:PORT/NQN, colons escaped for fio), each job on its own
# connection: verify at QD 1 and 32 with 2 jobs, with and without digests,
# randrw, and bsrange and the batched job with flushes (the fake has no
# Dataset Management, so no trim); never-written blocks must fail
# verification.
(cd "$root" && cargo build --release -q -p mcqio-fixtures --bin mcqio-fake-tcp)
"$target/release/mcqio-fake-tcp" ram 600 >"$work/fake-tcp.out" 2>"$work/fake-tcp.log" &
tcp_pid=$!
for _ in $(seq 100); do
	[ -s "$work/fake-tcp.out" ] && break
	sleep 0.1
done
tcp_dev=$(head -n1 "$work/fake-tcp.out" 2>/dev/null || true)
if [ "${tcp_dev#tcp:}" = "$tcp_dev" ]; then
	echo "FAIL mcqio-fake-tcp printed no device string: '$tcp_dev'" >&2
	sed 's/^/    /' "$work/fake-tcp.log" >&2
	failed=1
else
	tcp_file=${tcp_dev//:/\\:}
	for digests in "" ",hdgst,ddgst"; do
		for qd in 1 32; do
			f="$work/tcp-verify-qd$qd$digests.fio"
			{
				global "$tcp_file$digests"
				verify_jobs "$qd" 2
			} >"$f"
			run "tcp-verify-qd$qd-j2${digests:+-digests}" "$f"
		done
	done
	f="$work/tcp-randrw.fio"
	{
		global "$tcp_file,ddgst"
		cat <<EOF
iodepth=32
numjobs=2

[randrw]
rw=randrw
rwmixread=70
verify=crc32c
EOF
	} >"$f"
	run tcp-randrw-qd32-j2 "$f"
	# getevents sleeping on the connection's socket.
	for w in wait=irq wait=hybrid:20us; do
		f="$work/tcp-${w//[=:]/-}.fio"
		{
			global "$tcp_file"
			echo "$w"
			verify_jobs 8 1
		} >"$f"
		run "tcp-${w//[=:]/-}" "$f"
	done
	# bsrange within the fake's 8 KiB per command (its MAXH2CDATA bounds
	# the engine's transfers), then batched with flushes.
	f="$work/tcp-mixed.fio"
	{
		global "$tcp_file"
		mixed_jobs | sed -e 's/^bsrange=.*/bsrange=4k-8k/' -e '/^\[trim\]/,$d'
	} >"$f"
	run tcp-mixed-no-trim "$f"
	if fio --name=w --ioengine=external:"$so" --thread --filename="$tcp_file" --rw=randwrite --bs=4k --size=1m \
		--verify=crc32c --do_verify=0 --name=r --stonewall --ioengine=external:"$so" --thread \
		--filename="$tcp_file" --rw=randread --bs=4k --size=1m --offset=48m --verify=crc32c >"$work/neg-tcp.log" 2>&1 ||
		! grep -q 'verify: bad magic header' "$work/neg-tcp.log"; then
		echo "FAIL: verify of never-written NVMe/TCP blocks did not fail" >&2
		sed 's/^/    /' "$work/neg-tcp.log" >&2
		failed=1
	fi
fi
kill "$tcp_pid" 2>/dev/null || true
wait "$tcp_pid" 2>/dev/null || true

# The verify runs above can fail: reading back a range that was never
# written must fail verification (the fake shares its data across the jobs).
if fio --name=w --ioengine=external:"$so" --thread --filename=fake --rw=randwrite --bs=4k --size=1m \
	--verify=crc32c --do_verify=0 --name=r --stonewall --ioengine=external:"$so" --thread \
	--filename=fake --rw=randread --bs=4k --size=1m --offset=2m --verify=crc32c >"$work/neg.log" 2>&1 ||
	! grep -q 'verify: bad magic header' "$work/neg.log"; then
	echo "FAIL: verify of never-written blocks did not fail" >&2
	sed 's/^/    /' "$work/neg.log" >&2
	failed=1
fi

# The same on the fake UFS: never-written blocks must fail verification.
if fio --name=w --ioengine=external:"$so" --thread --filename=fake-ufs --rw=randwrite --bs=4k --size=1m \
	--verify=crc32c --do_verify=0 --name=r --stonewall --ioengine=external:"$so" --thread \
	--filename=fake-ufs --rw=randread --bs=4k --size=1m --offset=2m --verify=crc32c >"$work/neg-ufs.log" 2>&1 ||
	! grep -q 'verify: bad magic header' "$work/neg-ufs.log"; then
	echo "FAIL: verify of never-written UFS blocks did not fail" >&2
	sed 's/^/    /' "$work/neg-ufs.log" >&2
	failed=1
fi

# A LUN the fake UFS does not have must be refused with a message.
if fio --name=badlun --ioengine=external:"$so" --thread --filename=fake-ufs,lun=7 --size=1m >"$work/badlun.log" 2>&1 ||
	! grep -q 'no logical unit 7' "$work/badlun.log"; then
	echo "FAIL: a missing UFS LUN was not refused with a message" >&2
	sed 's/^/    /' "$work/badlun.log" >&2
	failed=1
fi

# A bad filename and fork mode must be refused with a message.
if fio --name=bad --ioengine=external:"$so" --thread --filename=nosuchdevice --size=1m >"$work/bad.log" 2>&1 ||
	! grep -q 'unknown device' "$work/bad.log"; then
	echo "FAIL: a bad --filename was not refused with a message" >&2
	sed 's/^/    /' "$work/bad.log" >&2
	failed=1
fi
if fio --name=fork --ioengine=external:"$so" --filename=fake --size=1m >"$work/fork.log" 2>&1 ||
	! grep -q 'thread=1' "$work/fork.log"; then
	echo "FAIL: a job without thread=1 was not refused with a message" >&2
	sed 's/^/    /' "$work/fork.log" >&2
	failed=1
fi

printf '\n%-24s %-12s %10s %10s %10s\n' "fio run" "job" "read IOPS" "write IOPS" "trim IOPS"
printf '%s\n' "${rows[@]}"

# FIO_TEST_COMPARE=0: stop here (the comparison below builds mcqio-perf in
# release mode and runs timed benchmarks; skip it on a busy machine).
if [ "${FIO_TEST_COMPARE:-1}" = 0 ]; then
	if [ "$failed" != 0 ]; then
		echo "test.sh: FAILED" >&2
		exit 1
	fi
	echo "test.sh: all fio runs passed (comparison with mcqio-perf skipped)"
	exit 0
fi

# The same workload through fio+engine and mcqio-perf: 4k randread, QD32,
# one job, 2 s, on the RAM fake (4 KiB blocks) and on the fake UFS host
# controller (MCQ); the job on core 0 and the fake's device thread on core 1
# (what mcqio-perf does by itself). Each is run twice, alternating, and the
# better run is shown (the machine may be shared).
pin_fio=() pin_perf=() core=
if [ "$ncpu" -ge 2 ]; then
	pin_fio=(--cpus_allowed=0 --fake_core=1)
	pin_perf=(--cpus 0)
	core=,core=1
fi
(cd "$root" && cargo build --release --bin mcqio-perf -q)
cmp_fio() { # cmp_fio FILENAME [fio options...]: prints the job's read IOPS
	local file=$1 rc=0
	shift
	fio --output-format=json --output="$work/cmp.out" --name=cmp --ioengine=external:"$so" --thread \
		--filename="$file" --fake_size=64m --rw=randread --bs=4k --iodepth=32 --numjobs=1 --qpairs=2 \
		--time_based --runtime=2 "${pin_fio[@]}" "$@" >"$work/cmp.log" 2>&1 || rc=$?
	if [ "$rc" != 0 ] || [ "$(json_of "$work/cmp.out" | jq '.jobs[0].error')" != 0 ]; then
		echo "FAIL: fio comparison run on $file (exit $rc)" >&2
		cat "$work/cmp.log" >&2
		failed=1
		echo 0
		return
	fi
	json_of "$work/cmp.out" | jq '.jobs[0].read.iops'
}
cmp_perf() { # cmp_perf DEVICE: prints mcqio-perf's total IOPS
	"$target/release/mcqio-perf" -d "$1" -w randread -o 4k -q 32 -j 1 -t 2 \
		"${pin_perf[@]}" --json --quiet | jq '.total.iops'
}
# fio's own cost per I/O, with no device: its null engine, same job, same core.
cmp_null() {
	fio --output-format=json --output="$work/null.out" --name=null --ioengine=null --thread \
		--rw=randread --bs=4k --size=64m --iodepth=32 --numjobs=1 --time_based --runtime=2 \
		${pin_fio[0]:+--cpus_allowed=0} >"$work/null.log" 2>&1 || { echo 0; return; }
	json_of "$work/null.out" | jq '.jobs[0].read.iops'
}
best() { printf '%s\n' "$@" | sort -g | tail -n1; }
ratio() { jq -n "$1 / $2 * 1000 | round / 1000"; }
# "lean": no per-I/O clock reads in fio, and one doorbell per batch of up to
# 32 as mcqio-perf rings it (fio's default rings once per I/O).
lean=(--gtod_reduce=1 --iodepth_batch_submit=32 --iodepth_batch_complete_max=32)
n1=$(cmp_null) n2=$(cmp_null)
null_iops=$(best "$n1" "$n2")
# compare TITLE FIO_FILENAME PERF_DEVICE: the table for one device.
compare() {
	local f1 g1 p1 f2 g2 p2
	f1=$(cmp_fio "$2") g1=$(cmp_fio "$2" "${lean[@]}") p1=$(cmp_perf "$3")
	f2=$(cmp_fio "$2") g2=$(cmp_fio "$2" "${lean[@]}") p2=$(cmp_perf "$3")
	for v in "$f1" "$g1" "$f2" "$g2"; do [ "$v" != 0 ] || failed=1; done
	local fio_iops lean_iops perf_iops expect
	fio_iops=$(best "$f1" "$f2") lean_iops=$(best "$g1" "$g2") perf_iops=$(best "$p1" "$p2")
	# If the job thread is the bottleneck, fio+engine spends per I/O what
	# mcqio-perf spends plus what fio spends with its null engine: a lower
	# bound (when the fake's device thread is the bottleneck, fio's work
	# overlaps it).
	expect=$(jq -n "1 / (1 / $perf_iops + 1 / $null_iops)")
	printf '\n4k randread QD32, 1 job, %s, 2 s, better of 2 runs:\n' "$1"
	printf '  %-38s %10.0f IOPS\n' "mcqio-perf -d $3" "$perf_iops" \
		"fio + mcqio engine (filename=$2)" "$fio_iops" \
		"fio + mcqio engine, lean options" "$lean_iops" \
		"fio ioengine=null (fio's own cost)" "$null_iops" \
		"expected: 1/(1/mcqio-perf + 1/null)" "$expect"
	printf '  fio/mcqio-perf = %s (lean: %s); fio/expected = %s\n' \
		"$(ratio "$fio_iops" "$perf_iops")" "$(ratio "$lean_iops" "$perf_iops")" "$(ratio "$fio_iops" "$expect")"
}
compare "fake NVMe (RAM, 4 KiB blocks)" fake "fake,size=64M,lbs=4k$core"
compare "fake UFS (MCQ, RAM LU of 64 MiB)" fake-ufs "fake-ufs,size=64M$core"

if [ "$failed" != 0 ]; then
	echo "test.sh: FAILED" >&2
	exit 1
fi
echo "test.sh: all fio runs passed"
