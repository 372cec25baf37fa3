// readback.cpp: write a pattern to block 1 of a device's first unit, read
// it back through a completion callback (a capture-less lambda), compare.
// Writes the device: for fakes and scratch disks.
//   c++ -std=c++17 readback.cpp $(pkg-config --cflags --libs mcqio) -o readback
//   ./readback fake | fake-ufs | tcp:127.0.0.1:4420/NQN
// SPDX-License-Identifier: MIT OR Apache-2.0
#include <cstdio>
#include <cstring>
#include <memory>
#include <mcqio.h>

struct Close { void operator()(mcqio_device *d) const { mcqio_device_close(d); } };

// Submit with `submit`, then poll until its completion arrives; its status.
template <typename F> static int run(mcqio_qpair *qp, F submit) {
	if (submit() != MCQIO_STATUS_OK) return MCQIO_STATUS_INVALID;
	int status = 1;  // no completion yet
	auto done = [](const mcqio_cpl *c, void *ctx) { *static_cast<int *>(ctx) = c->status; };
	while (status == 1)
		if (mcqio_poll(qp, 1, done, &status) < 0) return MCQIO_STATUS_INVALID;
	return status;
}

int main(int argc, char **argv) {
	mcqio_device *raw = nullptr;
	if (mcqio_device_open(argc > 1 ? argv[1] : "fake", &raw) != MCQIO_STATUS_OK) {
		std::fprintf(stderr, "open: %s\n", mcqio_last_error());
		return 1;
	}
	std::unique_ptr<mcqio_device, Close> dev(raw);
	mcqio_unit u{};
	mcqio_qpair *qp = nullptr;
	mcqio_buf *w = nullptr, *r = nullptr;
	if (mcqio_device_units(dev.get(), &u, 1) < 1 || mcqio_qpair_create(dev.get(), nullptr, &qp) ||
	    mcqio_buf_alloc(dev.get(), u.block_size, &w) || mcqio_buf_alloc(dev.get(), u.block_size, &r)) {
		std::fprintf(stderr, "set-up: %s\n", mcqio_last_error());
		return 1;
	}
	auto *out = static_cast<unsigned char *>(mcqio_buf_data(w));
	for (uint32_t i = 0; i < u.block_size; i++) out[i] = static_cast<unsigned char>(i * 7 + 3);
	int ws = run(qp, [&] { return mcqio_submit_write(qp, u.id, 1, 1, w, 1); });
	int rs = run(qp, [&] { return mcqio_submit_read(qp, u.id, 1, 1, r, 2); });
	bool same = ws == MCQIO_STATUS_OK && rs == MCQIO_STATUS_OK &&
		    std::memcmp(mcqio_buf_data(w), mcqio_buf_data(r), u.block_size) == 0;
	std::printf("unit %u: write %s, read %s, %s\n", u.id, mcqio_strerror(ws), mcqio_strerror(rs),
		    same ? "read back what was written" : "MISMATCH");
	mcqio_qpair_destroy(qp, nullptr, nullptr);
	mcqio_buf_free(w);
	mcqio_buf_free(r);
	return same ? 0 : 1;
}
