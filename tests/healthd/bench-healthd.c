/* bench-healthd.c — CPU time of one kiln-healthd poll cycle for 8 GPUs.
 *
 * Runs the daemon's own cycle against the fake NVML (every check enabled,
 * all 18 NVLink links per GPU): count + poll every GPU through the timed
 * worker, evaluate the node, render /metrics.  CPU time is the whole
 * process's (worker thread included), per cycle.  The baseline in the same
 * run is the bare NVML calls without the worker hand-off, so the table also
 * shows what the timeout machinery costs.  Target: < 1 ms per cycle.
 *
 *   bench-healthd FAKE_LIB [CYCLES] */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../services/healthd/healthd.h"

#define GPUS	  8
#define TARGET_US 1000.0

static double cpu_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}
static double wall_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

typedef nvmlReturn_t (*fn_handle)(unsigned, nvmlDevice_t *);
typedef nvmlReturn_t (*fn_dev_uint)(nvmlDevice_t, unsigned *);
typedef nvmlReturn_t (*fn_temp)(nvmlDevice_t, int, unsigned *);

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: bench-healthd FAKE_LIB [CYCLES]\n");
		return 2;
	}
	int cycles = argc > 2 ? atoi(argv[2]) : 2000;
	char scen[] = "/tmp/bench-healthd-XXXXXX";
	int fd = mkstemp(scen);
	FILE *f = fdopen(fd, "w");
	fprintf(f, "gpus = (");
	for (int i = 0; i < GPUS; i++)
		fprintf(f, "%s{ temperature = %d; processes = [ %d ]; }", i ? ", " : "", 40 + i,
			100000 + i);
	fprintf(f, ");\n");
	fclose(f);
	setenv("KILN_FAKE_NVML_SCENARIO", scen, 1);

	hd_settings s;
	hd_settings_defaults(&s);
	s.expected_gpus = GPUS;
	char err[256];
	hd_nvml *m = NULL;
	if (hd_nvml_open(argv[1], 5000000, &m, err, sizeof(err)) < 0) {
		fprintf(stderr, "bench-healthd: cannot open %s: %s\n", argv[1], err);
		unlink(scen);
		return 1;
	}
	static hd_node node;
	double c_poll = 0, c_eval = 0, c_render = 0, w_total = 0, c_total = 0;
	for (int it = -50; it < cycles; it++) { /* 50 warm-up cycles */
		double c0 = cpu_us(), w0 = wall_us();
		int n = 0;
		hd_nvml_count(m, &n);
		for (int i = 0; i < n; i++) {
			node.gpus[i].prev = node.gpus[i].cur;
			node.gpus[i].have_prev = true;
			hd_nvml_poll(m, i, &node.gpus[i].cur);
		}
		node.n_gpus = n;
		double c1 = cpu_us();
		hd_node_evaluate(&s, &node, (uint64_t) w0);
		double c2 = cpu_us();
		kiln_strbuf b;
		kiln_strbuf_init(&b);
		hd_metrics_render(&node, "node01", &b);
		kiln_strbuf_free(&b);
		double c3 = cpu_us(), w3 = wall_us();
		if (it < 0)
			continue;
		c_poll += c1 - c0, c_eval += c2 - c1, c_render += c3 - c2;
		c_total += c3 - c0, w_total += w3 - w0;
	}
	if (node.state != HD_HEALTHY || node.n_gpus != GPUS) {
		fprintf(stderr, "bench-healthd: expected %d healthy GPUs, got %d (%s)\n", GPUS,
			node.n_gpus, hd_state_to_string(node.state));
		return 1;
	}

	/* baseline: the same kind of NVML calls, made directly (no worker) */
	void *dl = dlopen(argv[1], RTLD_NOW);
	fn_handle handle = (fn_handle) dlsym(dl, "nvmlDeviceGetHandleByIndex_v2");
	fn_temp temp = (fn_temp) dlsym(dl, "nvmlDeviceGetTemperature");
	fn_dev_uint power = (fn_dev_uint) dlsym(dl, "nvmlDeviceGetPowerUsage");
	int calls_per_gpu = 0;
	double b0 = cpu_us();
	for (int it = 0; it < cycles; it++)
		for (int i = 0; i < GPUS; i++) {
			nvmlDevice_t d;
			unsigned v;
			handle((unsigned) i, &d);
			temp(d, 0, &v);
			power(d, &v);
		}
	double base_3 = (cpu_us() - b0) / cycles;
	calls_per_gpu = 3;
	unlink(scen);

	printf("kiln-healthd poll cycle: %d GPUs, fake NVML, %d cycles (after 50 warm-up)\n", GPUS,
	       cycles);
	printf("%-44s %14s\n", "part", "CPU us/cycle");
	printf("%-44s %14.1f\n", "baseline: 3 direct NVML calls per GPU", base_3);
	printf("%-44s %14.1f\n", "NVML poll, all checks, through the worker", c_poll / cycles);
	printf("%-44s %14.1f\n", "evaluate (thresholds, state machine)", c_eval / cycles);
	printf("%-44s %14.1f\n", "render /metrics", c_render / cycles);
	printf("%-44s %14.1f\n", "full cycle", c_total / cycles);
	printf("%-44s %14.1f\n", "full cycle, wall time", w_total / cycles);
	printf("%-44s %14.1f\n", "target", TARGET_US);
	(void) calls_per_gpu;
	bool pass = c_total / cycles < TARGET_US;
	printf("result: %s (%.1f us CPU per cycle, target < %.0f us)\n", pass ? "PASS" : "FAIL",
	       c_total / cycles, TARGET_US);
	hd_nvml_close(m);
	return pass ? 0 : 1;
}
