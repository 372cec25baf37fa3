/*
 * The narrow C ABI between the fio shim (mcqio_fio.c) and the Rust static
 * library (engine/, crate mcqio-fio). Nothing here depends on fio's headers:
 * the shim translates fio's structures into these calls.
 *
 * SPDX-License-Identifier: MIT OR Apache-2.0
 */
#ifndef MCQIO_FIO_H
#define MCQIO_FIO_H

#include <stddef.h>
#include <stdint.h>

/* Operations for mcqio_fio_queue(). */
#define MCQIO_FIO_READ 0
#define MCQIO_FIO_WRITE 1
#define MCQIO_FIO_TRIM 2
#define MCQIO_FIO_FLUSH 3

/* mcqio_fio_queue() results (besides a negative errno). */
#define MCQIO_FIO_QUEUED 0
#define MCQIO_FIO_BUSY 1

/* mcqio_fio_init flags. */
/* fio checks this job's reads against seeds it replays in the order it
 * logged the writes (rw=randrw/readwrite with verify, no verify_backlog,
 * no verify_pattern): a write it requeues after FIO_Q_BUSY is logged
 * again at the end, so such a job must never be answered busy. */
#define MCQIO_FIO_INIT_ORDERED_VERIFY 1u

/* The engine options that reach the library (strings may be NULL). */
struct mcqio_fio_config {
	const char *dma;          /* "premapped" (default) */
	const char *hugepages;    /* "prefer" (default) or "never" */
	uint64_t dma_budget;      /* bytes; 0: the library's default */
	uint32_t qpairs;          /* I/O queue pairs to ask for */
	uint32_t shadow_doorbells;/* 0 or 1 */
	const char *io_timeout;   /* with its unit ("30s"); "0": no per-command timeout */
	uint64_t fake_size;       /* bytes per fake namespace */
	uint32_t fake_lbs;      /* fake block size */
	uint32_t fake_namespaces; /* fake namespace count */
	const char *fake_exec;    /* "thread" (default) or "sync" */
	const char *fake_latency; /* fake per-command latency, with its unit ("10us"); "0": none */
	int64_t fake_core;        /* core for the fake's device thread; -1: none */
	uint32_t mcq;             /* UFS: 1 MCQ when the controller has it, 0 legacy list */
	uint64_t min_bs;          /* the job's smallest block size (td_min_bs); 0: not checked */
	const char *wait;         /* "poll" (default), "irq", "hybrid" or "hybrid:SPIN" */
	uint32_t hipri;           /* fio's hipri: 1 polled completions (refused with wait=irq|hybrid) */
};

/* What setup learnt about each file. */
struct mcqio_fio_file {
	uint64_t size;   /* bytes */
	uint64_t cookie; /* for mcqio_fio_queue(); keep in fio_file.engine_pos */
};

/* On failure each call writes a NUL-terminated message into err[errlen]. */
void *mcqio_fio_setup(const struct mcqio_fio_config *cfg, const char *const *names,
		      uint32_t nfiles, uint64_t max_io, struct mcqio_fio_file *out,
		      char *err, size_t errlen);
int mcqio_fio_init(void *job, uint32_t depth, uint32_t flags, char *err, size_t errlen);
void *mcqio_fio_iomem_alloc(void *job, size_t len, char *err, size_t errlen);
void mcqio_fio_iomem_free(void *job);
int mcqio_fio_queue(void *job, uint64_t cookie, int op, uint64_t offset,
		    const void *buf, uint64_t len, uint64_t tag);
void mcqio_fio_commit(void *job);
int mcqio_fio_getevents(void *job, uint32_t min, uint32_t max, int64_t timeout_ns,
			char *err, size_t errlen);
uint64_t mcqio_fio_event(void *job, uint32_t i, int *errno_out);
void mcqio_fio_cleanup(void *job);

#endif
