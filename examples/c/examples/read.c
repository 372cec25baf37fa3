/* read.c: print block 0 of a unit of any device mcqio opens, the same code
 * for the fakes, a controller through VFIO and an NVMe/TCP target.
 *   cc read.c $(pkg-config --cflags --libs mcqio) -o read
 *   ./read fake | fake-ufs | vfio:0000:01:00.0 | tcp:127.0.0.1:4420/NQN [UNIT-INDEX]
 * SPDX-License-Identifier: MIT OR Apache-2.0 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <mcqio.h>

static int fail(const char *what) { fprintf(stderr, "%s: %s\n", what, mcqio_last_error()); return 1; }

int main(int argc, char **argv) {
	struct mcqio_device *dev; struct mcqio_qpair *qp; struct mcqio_buf *buf;
	struct mcqio_unit units[32]; struct mcqio_cpl cpl;
	if (mcqio_device_open(argc > 1 ? argv[1] : "fake", &dev) != MCQIO_STATUS_OK) return fail("open");
	int n = mcqio_device_units(dev, units, 32), i = argc > 2 ? atoi(argv[2]) : 0;
	if (i < 0 || i >= n || i >= 32) { fprintf(stderr, "no unit %d (%d units)\n", i, n); return 1; }
	struct mcqio_unit u = units[i];
	if (mcqio_qpair_create(dev, NULL, &qp) || mcqio_buf_alloc(dev, u.block_size, &buf)) return fail("set-up");
	if (mcqio_submit_read(qp, u.id, 0, 1, buf, 42) != MCQIO_STATUS_OK) return fail("read");
	int got;
	while ((got = mcqio_wait_into(qp, &cpl, 1, -1)) == 0) {}   /* rings, then waits for the completion */
	if (got < 0) return fail("wait");
	if (cpl.status != MCQIO_STATUS_OK || cpl.user_tag != 42) { fprintf(stderr, "read: %s\n", mcqio_strerror(cpl.status)); return 1; }
	const unsigned char *p = mcqio_buf_data(buf);           /* idle again: the bytes are ours */
	printf("unit %" PRIu32 ": %" PRIu64 " blocks of %" PRIu32 " B; block 0:", u.id, u.blocks, u.block_size);
	for (int k = 0; k < 16; k++) printf(" %02x", p[k]);
	printf("\n");
	mcqio_buf_free(buf); mcqio_qpair_destroy(qp, NULL, NULL); mcqio_device_close(dev);
	return 0;
}
