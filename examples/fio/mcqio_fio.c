/*
 * mcqio_fio.c: the fio-facing half of mcqio's external ioengine.
 *
 * fio loads the built libmcqio_fio.so with --ioengine=external:<path> and
 * finds the non-static `ioengine` below. Everything but fio's structures
 * lives in the Rust static library (engine/, crate mcqio-fio), reached
 * through the C ABI of mcqio_fio.h.
 *
 * Licence: this file is mcqio's (MIT OR Apache-2.0) and contains no fio
 * code. It is compiled against fio's configured source tree (fio is
 * GPL-2.0), whose headers' inline functions end up in the built .so; that
 * .so is built locally by examples/fio/build.sh for use with the fio on the
 * same machine and is not distributed.
 *
 * Written for fio 3.33 (FIO_IOOPS_VERSION 31): struct ioengine_ops changes
 * between fio releases, so an engine only loads into the fio it was built
 * for. build.sh checks the installed fio against the source tree.
 *
 * SPDX-License-Identifier: MIT OR Apache-2.0
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fio.h"
#include "optgroup.h"

#include "mcqio_fio.h"

#define MCQIO_FIO_FOR_IOOPS 31
#if FIO_IOOPS_VERSION != MCQIO_FIO_FOR_IOOPS
#error "mcqio_fio.c was written for FIO_IOOPS_VERSION 31 (fio 3.33); this fio tree has another"
#endif

/*
 * The engine options (td->eo). fio stores the owning thread_data pointer
 * in the first word, so no option may sit at offset 0.
 */
struct mcqio_fio_options {
	void *td_slot;
	char *dma;
	char *hugepages;
	unsigned long long dma_budget;
	unsigned int qpairs;
	unsigned int shadow_doorbells;
	char *io_timeout;
	unsigned long long fake_size;
	unsigned int fake_lbs;
	unsigned int fake_namespaces;
	char *fake_exec;
	char *fake_latency;
	int fake_core;
	unsigned int mcq;
	char *wait;
	unsigned int hipri;
};

#define MCQIO_OPT(n, t, field, h, d)                                        \
	{                                                                   \
		.name = (n), .lname = (n), .type = (t),                     \
		.off1 = offsetof(struct mcqio_fio_options, field),          \
		.help = (h), .def = (d), .category = FIO_OPT_C_ENGINE,      \
		.group = FIO_OPT_G_INVALID,                                 \
	}

static struct fio_option options[] = {
	MCQIO_OPT("dma", FIO_OPT_STR_STORE, dma,
		  "DMA mode: premapped (fio's buffers are one DMA region, mapped once; zero copy)",
		  "premapped"),
	MCQIO_OPT("hugepages", FIO_OPT_STR_STORE, hugepages,
		  "DMA memory pages for vfio- devices: prefer (2 MiB when possible) or never",
		  "prefer"),
	MCQIO_OPT("dma_budget", FIO_OPT_STR_VAL, dma_budget,
		  "DMA bytes checked against RLIMIT_MEMLOCK when opening a vfio- device (0: library default)",
		  "0"),
	MCQIO_OPT("qpairs", FIO_OPT_INT, qpairs,
		  "I/O queue pairs to ask the controller for (one per job; the fake offers this many)",
		  "64"),
	MCQIO_OPT("shadow_doorbells", FIO_OPT_BOOL, shadow_doorbells,
		  "NVMe: use shadow doorbells where the controller has them (emulated controllers)",
		  "1"),
	MCQIO_OPT("mcq", FIO_OPT_BOOL, mcq,
		  "UFS: use MCQ (one SQ/CQ pair per job) when the host controller has it; 0: the legacy single-doorbell list (one job); fake-ufs advertises MCQ only when 1",
		  "1"),
	/* fio's polling convention: hipri asks for polled completions (as
	 * io_uring's does); the engine polls by default. wait= may instead
	 * sleep on the queue's interrupt. */
	MCQIO_OPT("wait", FIO_OPT_STR_STORE, wait,
		  "How getevents waits: poll (spin, the default), irq (sleep on the queue's interrupt: NVMe MSI-X, UFS MCQ INTx) or hybrid[:SPIN] (spin SPIN after a completion, then sleep)",
		  "poll"),
	MCQIO_OPT("hipri", FIO_OPT_STR_SET, hipri,
		  "Polled completions (fio's hipri; the default here; contradicts wait=irq|hybrid)",
		  NULL),
	/* Durations are strings the library parses, as mcqio-perf's device
	 * strings are: each needs its unit (fio would read a bare number as
	 * microseconds, mcqio-perf as seconds). */
	MCQIO_OPT("io_timeout", FIO_OPT_STR_STORE, io_timeout,
		  "Per-command timeout with its unit (30s, 500ms); a timed-out command is aborted (0: none)",
		  "30s"),
	MCQIO_OPT("fake_size", FIO_OPT_STR_VAL, fake_size,
		  "Bytes per namespace of the fake controller, or per LU of fake-ufs (RAM)", "64m"),
	MCQIO_OPT("fake_lbs", FIO_OPT_INT, fake_lbs,
		  "Logical block size of the fake controller, in bytes (a power of two, 512..65536; fake-ufs: 4096 only)", "4096"),
	MCQIO_OPT("fake_namespaces", FIO_OPT_INT, fake_namespaces,
		  "Namespaces of the fake controller (select one with ,ns=N in --filename), or LUs of fake-ufs (1..32, select with ,lun=N from 0)", "1"),
	MCQIO_OPT("fake_exec", FIO_OPT_STR_STORE, fake_exec,
		  "Fake device side: thread (a device thread polls, like hardware) or sync (in the doorbell store)",
		  "thread"),
	MCQIO_OPT("fake_latency", FIO_OPT_STR_STORE, fake_latency,
		  "Minimum per-command latency of the fake controller, with its unit (10us, 1ms; 0: none)",
		  "0"),
	{
		.name = "fake_core", .lname = "fake_core", .type = FIO_OPT_INT,
		.off1 = offsetof(struct mcqio_fio_options, fake_core),
		.help = "Core the fake's device thread is pinned to (-2, the default: the highest CPU the process may use, as mcqio-perf does; -1: not pinned)",
		.def = "-2", .minval = -2,
		.category = FIO_OPT_C_ENGINE, .group = FIO_OPT_G_INVALID,
	},
	{ .name = NULL },
};

static void mcqio_config(const struct mcqio_fio_options *o, struct mcqio_fio_config *c)
{
	memset(c, 0, sizeof(*c));
	c->dma = o->dma;
	c->hugepages = o->hugepages;
	c->dma_budget = o->dma_budget;
	c->qpairs = o->qpairs;
	c->shadow_doorbells = o->shadow_doorbells;
	c->io_timeout = o->io_timeout;
	c->fake_size = o->fake_size;
	c->fake_lbs = o->fake_lbs;
	c->fake_namespaces = o->fake_namespaces;
	c->fake_exec = o->fake_exec;
	c->fake_latency = o->fake_latency;
	c->fake_core = o->fake_core;
	c->mcq = o->mcq;
	c->wait = o->wait;
	c->hipri = o->hipri;
}

/* Runs once per job, from fio's main thread before the job threads start. */
static int mcqio_setup(struct thread_data *td)
{
	struct mcqio_fio_config cfg;
	struct mcqio_fio_file *out;
	const char **names;
	struct fio_file *f;
	unsigned int i, n = td->files_index;
	char err[512] = "";
	void *job;

	if (!td->o.use_thread) {
		log_err("mcqio: the engine needs thread=1 (--thread): each job is a thread "
			"with its own queue pair on a controller shared by the process\n");
		return 1;
	}
	if (td->io_ops_data) {
		mcqio_fio_cleanup(td->io_ops_data);
		td->io_ops_data = NULL;
	}
	mcqio_config(td->eo, &cfg);
	cfg.min_bs = td_min_bs(td);
	names = calloc(n ? n : 1, sizeof(*names));
	out = calloc(n ? n : 1, sizeof(*out));
	if (!names || !out) {
		free(names);
		free(out);
		return 1;
	}
	for_each_file(td, f, i)
		names[i] = f->file_name;
	job = mcqio_fio_setup(&cfg, names, n, td_max_bs(td), out, err, sizeof(err));
	if (job) {
		for_each_file(td, f, i) {
			f->filetype = FIO_TYPE_BLOCK;
			f->real_file_size = out[i].size;
			f->engine_pos = out[i].cookie;
			fio_file_set_size_known(f);
		}
		td->io_ops_data = job;
	}
	free(names);
	free(out);
	if (!job) {
		log_err("mcqio: %s\n", err);
		return 1;
	}
	return 0;
}

/* Runs on the job's thread: the queue pair belongs to it. */
static int mcqio_init(struct thread_data *td)
{
	char err[512] = "";

	if (!td->io_ops_data) {
		log_err("mcqio: the job was not set up\n");
		return 1;
	}
	uint32_t flags = 0;

	/* fio's verify of a mixed job replays the write seeds in log order;
	 * a busy answer reorders the log (see MCQIO_FIO_INIT_ORDERED_VERIFY). */
	/* verify 0 is VERIFY_NONE (verify.h, which needs more of fio than its API headers) */
	if (td_rw(td) && td->o.verify != 0 && !td->o.verify_backlog &&
	    !td->o.verify_pattern_bytes)
		flags |= MCQIO_FIO_INIT_ORDERED_VERIFY;
	if (mcqio_fio_init(td->io_ops_data, td->o.iodepth, flags, err, sizeof(err))) {
		log_err("mcqio: %s\n", err);
		return 1;
	}
	return 0;
}

static int mcqio_iomem_alloc(struct thread_data *td, size_t total_mem)
{
	char err[512] = "";

	td->orig_buffer = mcqio_fio_iomem_alloc(td->io_ops_data, total_mem, err, sizeof(err));
	if (!td->orig_buffer) {
		log_err("mcqio: %s\n", err);
		return 1;
	}
	return 0;
}

static void mcqio_iomem_free(struct thread_data *td)
{
	mcqio_fio_iomem_free(td->io_ops_data);
}

static enum fio_q_status mcqio_queue(struct thread_data *td, struct io_u *io_u)
{
	int op, r;

	fio_ro_check(td, io_u);
	switch (io_u->ddir) {
	case DDIR_READ:
		op = MCQIO_FIO_READ;
		break;
	case DDIR_WRITE:
		op = MCQIO_FIO_WRITE;
		break;
	case DDIR_TRIM:
		op = MCQIO_FIO_TRIM;
		break;
	case DDIR_SYNC:
	case DDIR_DATASYNC:
		op = MCQIO_FIO_FLUSH;
		break;
	default:
		io_u->error = EINVAL;
		return FIO_Q_COMPLETED;
	}
	r = mcqio_fio_queue(td->io_ops_data, io_u->file->engine_pos, op, io_u->offset,
			    io_u->xfer_buf, io_u->xfer_buflen, (uint64_t)(uintptr_t)io_u);
	if (r == MCQIO_FIO_QUEUED)
		return FIO_Q_QUEUED;
	if (r == MCQIO_FIO_BUSY)
		return FIO_Q_BUSY;
	io_u->error = -r;
	return FIO_Q_COMPLETED;
}

/* One doorbell for the batch fio queued (iodepth_batch_submit). */
static int mcqio_commit(struct thread_data *td)
{
	mcqio_fio_commit(td->io_ops_data);
	return 0;
}

static int mcqio_getevents(struct thread_data *td, unsigned int min, unsigned int max,
			   const struct timespec *t)
{
	int64_t timeout_ns = t ? (int64_t)t->tv_sec * 1000000000 + t->tv_nsec : -1;
	char err[512] = "";
	int n;

	n = mcqio_fio_getevents(td->io_ops_data, min, max, timeout_ns, err, sizeof(err));
	if (n < 0) {
		log_err("mcqio: %s\n", err);
		return -EIO;
	}
	return n;
}

static struct io_u *mcqio_event(struct thread_data *td, int event)
{
	int errno_out = 0;
	struct io_u *io_u;

	io_u = (struct io_u *)(uintptr_t)mcqio_fio_event(td->io_ops_data, event, &errno_out);
	if (io_u)
		io_u->error = errno_out;
	return io_u;
}

static void mcqio_cleanup(struct thread_data *td)
{
	mcqio_fio_cleanup(td->io_ops_data);
	td->io_ops_data = NULL;
}

/* Nothing per file: the queue pair is per job, the namespace in engine_pos. */
static int mcqio_open_file(struct thread_data *td, struct fio_file *f)
{
	return 0;
}

static int mcqio_close_file(struct thread_data *td, struct fio_file *f)
{
	return 0;
}

struct ioengine_ops ioengine = {
	.name = "mcqio",
	.version = FIO_IOOPS_VERSION,
	/* No offload: a queue pair is used by its job's thread only. */
	.flags = FIO_RAWIO | FIO_DISKLESSIO | FIO_NODISKUTIL | FIO_NOEXTEND | FIO_NO_OFFLOAD,
	.setup = mcqio_setup,
	.init = mcqio_init,
	.queue = mcqio_queue,
	.commit = mcqio_commit,
	.getevents = mcqio_getevents,
	.event = mcqio_event,
	.cleanup = mcqio_cleanup,
	.open_file = mcqio_open_file,
	.close_file = mcqio_close_file,
	.iomem_alloc = mcqio_iomem_alloc,
	.iomem_free = mcqio_iomem_free,
	.option_struct_size = sizeof(struct mcqio_fio_options),
	.options = options,
};
