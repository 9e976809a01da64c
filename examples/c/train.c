/*
 * train.c: the PyTorch-style training loop in C against tinyacc.h.
 *
 *   go build -buildmode=c-shared -o build/libtinyacc.so ./capi
 *   gcc -O2 -Icapi examples/c/train.c -Lbuild -ltinyacc -Wl,-rpath,$PWD/build -o build/train_c
 *   build/train_c [config.yaml]
 *
 * The configuration is resolved like `tinyacc train --config FILE`
 * (defaults < file < TINYACC_* variables), so both train the same model on
 * the same batches and print the same losses.
 */
#include <stdio.h>
#include <stdlib.h>

#include "tinyacc.h"

/* check aborts with the library's message when a call fails. */
static void check(int status, const char *what) {
	if (status != TINYACC_OK) {
		fprintf(stderr, "train: %s failed (status %d): %s\n", what, status, tinyacc_last_error());
		exit(1);
	}
}

int main(int argc, char **argv) {
	if (tinyacc_abi_version() != TINYACC_ABI_VERSION) {
		fprintf(stderr, "train: libtinyacc has ABI %d, this program was built for %d\n",
		        tinyacc_abi_version(), TINYACC_ABI_VERSION);
		return 1;
	}
	tinyacc_handle cfg, model, opt, loader, sess;
	check(tinyacc_config_from_env(argc > 1 ? argv[1] : "", &cfg), "config");
	check(tinyacc_model_new(cfg, &model), "model");
	check(tinyacc_optimizer_new(cfg, model, &opt), "optimizer");
	check(tinyacc_loader_new(cfg, &loader), "data loader");
	check(tinyacc_prepare(cfg, model, opt, loader, &sess), "prepare");

	/* train.steps, the run's total. */
	int64_t steps;
	check(tinyacc_config_get_int(cfg, "train.steps", &steps), "config train.steps");

	int64_t B, T, A;
	check(tinyacc_loader_info(loader, &B, &T, &A, NULL), "loader info");
	int32_t *x = malloc(sizeof(int32_t) * B * T);
	int32_t *y = malloc(sizeof(int32_t) * B * T);
	if (x == NULL || y == NULL) {
		fprintf(stderr, "train: out of memory\n");
		return 1;
	}
	double metrics[TINYACC_NUM_METRICS];
	for (int64_t step = 0; step < steps; step++) {
		for (int64_t micro = 0; micro < A; micro++) {
			tinyacc_handle loss;
			check(tinyacc_loader_batch(loader, step, micro, x, y, B * T), "batch");
			check(tinyacc_forward(sess, x, y, B, T, &loss, NULL), "forward");
			check(tinyacc_backward(loss), "backward");
			check(tinyacc_free(loss), "free loss");
		}
		check(tinyacc_step(sess, NULL), "optimizer step");
		check(tinyacc_zero_grad(sess), "zero_grad");
		check(tinyacc_metrics(sess, metrics, TINYACC_NUM_METRICS), "metrics");
		/* Steps are named from 1, as tinyacc train names them. */
		printf("step %lld/%lld loss %.17g lr %.6g\n", (long long)metrics[TINYACC_METRIC_STEP], (long long)steps,
		       metrics[TINYACC_METRIC_LOSS], metrics[TINYACC_METRIC_LR]);
	}
	double val;
	if (tinyacc_evaluate(sess, &val) == TINYACC_OK) {
		printf("val loss %.17g\n", val);
	}
	free(x);
	free(y);
	tinyacc_handle all[] = {sess, loader, opt, model, cfg};
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
		check(tinyacc_free(all[i]), "free");
	}
	return 0;
}
