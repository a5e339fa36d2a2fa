/* test-healthd.c — unit tests of kiln-healthd's parts: the XID table, the
 * threshold checks, the node state machine, the metrics / JSON output, and
 * the NVML loader (symbol fallbacks, per-call timeouts, XID events) against
 * the fake libnvidia-ml built in $KILN_BUILD/lib. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <errno.h>
#include <limits.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../services/healthd/healthd.h"
#include "kiln/parse.h"

static hd_settings S;

static int setup(void **state)
{
	hd_settings_defaults(&S);
	return 0;
}

/* ---- settings: without a cluster file they are the schema's defaults ---- */

/* The default the schema writes for key, unquoted (the text `kiln show
 * --defaults` prints). */
static const char *schema_default(const char *key)
{
	static char buf[256];
	size_t n;
	const kiln_cfg_key *k = kiln_cfg_schema(&n);
	for (size_t i = 0; i < n; i++)
		if (streq(k[i].path, key)) {
			const char *d = k[i].def;
			assert_non_null(d);
			size_t l = strlen(d);
			if (l >= 2 && d[0] == '"' && d[l - 1] == '"')
				snprintf(buf, sizeof(buf), "%.*s", (int) (l - 2), d + 1);
			else
				snprintf(buf, sizeof(buf), "%s", d);
			return buf;
		}
	fail_msg("no schema key %s", key);
	return NULL;
}

static uint64_t def_usec(const char *key)
{
	uint64_t v;
	assert_int_equal(kiln_parse_duration(schema_default(key), KILN_USEC_PER_SEC, &v), 0);
	return v;
}
static int def_int(const char *key)
{
	int v;
	assert_int_equal(kiln_parse_int(schema_default(key), INT_MIN, INT_MAX, &v), 0);
	return v;
}
static bool def_bool(const char *key)
{
	bool v;
	assert_int_equal(kiln_parse_bool(schema_default(key), &v), 0);
	return v;
}
static kiln_cfg_action def_action(const char *key)
{
	const char *d = schema_default(key);
	for (int a = 0; a < _KILN_ACTION_MAX; a++)
		if (streq(kiln_cfg_action_to_string(a), d))
			return a;
	fail_msg("%s: unknown action %s", key, d);
	return 0;
}

/* The settings one gets without a file, and from a file without a health
 * section, are what the schema says (a drift in either fails here). */
static void assert_schema_settings(const hd_settings *s)
{
	double frac;
	assert_true(s->interval_usec == def_usec("health.interval"));
	assert_true(s->recover_after_usec == def_usec("health.recover_after"));
	assert_true(s->nvml_timeout_usec == def_usec("health.nvml_timeout"));
	assert_true(s->watchdog_usec == def_usec("health.watchdog"));
	assert_true(s->active_interval_usec == def_usec("health.active_interval"));
	assert_int_equal(s->metrics_port, def_int("health.metrics_port"));
	assert_string_equal(s->metrics_address, schema_default("health.metrics_address"));
	assert_string_equal(s->nvml_library, schema_default("health.nvml_library"));
	assert_int_equal(s->enabled, def_bool("health.enabled"));
	assert_int_equal(s->drain, def_bool("health.drain"));
	assert_int_equal(s->active_on_start, def_bool("health.active_on_start"));
	assert_int_equal(s->gemm_seconds, def_int("health.gemm_seconds"));
	assert_int_equal(kiln_parse_double(schema_default("health.memtest_fraction"), &frac), 0);
	assert_true(s->memtest_fraction == frac);
	assert_int_equal(s->th.temp_warn_c, def_int("health.thresholds.temp_warn_c"));
	assert_int_equal(s->th.temp_max_c, def_int("health.thresholds.temp_max_c"));
	assert_int_equal(s->th.power_warn_pct, def_int("health.thresholds.power_warn_pct"));
	assert_int_equal(s->th.ecc_sbe_warn, def_int("health.thresholds.ecc_sbe_warn"));
	assert_int_equal(s->th.pcie_replay_warn_per_min,
			 def_int("health.thresholds.pcie_replay_warn_per_min"));
	assert_int_equal(s->th.remap_pending, def_action("health.thresholds.remap_pending"));
	assert_int_equal(s->th.remap_failure, def_action("health.thresholds.remap_failure"));
	assert_int_equal(s->n_xids, 0);
}

static void test_settings_defaults(void **state)
{
	hd_settings s;
	memset(&s, 0xa5, sizeof(s));
	assert_int_equal(hd_settings_defaults(&s), 0);
	assert_schema_settings(&s);
	assert_int_equal(s.expected_gpus, -1);
	assert_string_equal(s.node, "");

	/* A cluster file without a health section: the same, and this node's
	 * GPU count. */
	static const char *const text =
		"cluster = { name = \"t\"; };\n"
		"network = { subnet = \"10.0.0.0/24\"; };\n"
		"head = { hostname = \"head\"; address = \"10.0.0.1\"; };\n"
		"node_groups = ( { name = \"g\"; hosts = \"n1\"; addresses = [ \"10.0.0.2\" ];\n"
		"  macs = [ \"52:54:00:00:00:02\" ]; gpus = { count = 2; }; } );\n";
	kiln_cfg *cfg = NULL;
	assert_int_equal(kiln_cfg_load_string(text, "t.cfg", &cfg, NULL), 0);
	hd_settings f;
	assert_int_equal(hd_settings_defaults(&f), 0);
	hd_settings_from_cfg(&f, cfg, kiln_cfg_find_node(cfg, "n1"));
	assert_schema_settings(&f);
	assert_int_equal(f.expected_gpus, 2);
	kiln_cfg_free(cfg);
}

static hd_sample healthy_sample(void)
{
	hd_sample s = { .present = true };
	snprintf(s.name, sizeof(s.name), "NVIDIA H100 80GB HBM3");
	snprintf(s.uuid, sizeof(s.uuid), "GPU-abc");
	snprintf(s.pci_bus_id, sizeof(s.pci_bus_id), "00000000:18:00.0");
	s.has_temp = s.has_slowdown = s.has_power = s.has_power_limit = s.has_clocks = s.has_ecc =
		true;
	s.has_retired = s.has_retired_pending = s.has_remap = s.has_pcie_gen = s.has_pcie_width =
		true;
	s.has_replay = s.has_nvlink = s.has_persistence = s.has_pids = true;
	s.temp_c = 40, s.slowdown_c = 90, s.power_w = 300, s.power_limit_w = 700;
	s.pcie_gen = s.pcie_gen_max = 5, s.pcie_width = s.pcie_width_max = 16;
	s.nvlink_total = 18, s.persistence = true;
	s.at_usec = 1000000;
	return s;
}

static hd_state eval(const hd_sample *prev, const hd_sample *cur, hd_reasons *r)
{
	memset(r, 0, sizeof(*r));
	hd_evaluate(&S, prev, cur, r);
	return hd_reasons_state(r);
}

static bool has_reason(const hd_reasons *r, const char *needle)
{
	for (int i = 0; i < r->n; i++)
		if (strstr(r->v[i].text, needle))
			return true;
	return false;
}

static void test_xid_table(void **state)
{
	int app[] = { 13, 31, 43, 45 }, drain[] = { 48, 64, 74, 79, 95, 119, 120 },
	    reset[] = { 63, 94 };
	for (size_t i = 0; i < ARRAY_SIZE(app); i++)
		assert_int_equal(hd_xid_action(&S, app[i]), KILN_ACTION_APP);
	for (size_t i = 0; i < ARRAY_SIZE(drain); i++) {
		kiln_cfg_action a = hd_xid_action(&S, drain[i]);
		assert_true(a == KILN_ACTION_DRAIN || a == KILN_ACTION_RESET ||
			    a == KILN_ACTION_REBOOT);
	}
	for (size_t i = 0; i < ARRAY_SIZE(reset); i++)
		assert_int_equal(hd_xid_action(&S, reset[i]), KILN_ACTION_RESET);
	assert_int_equal(hd_xid_action(&S, 79), KILN_ACTION_REBOOT);
	assert_int_equal(hd_xid_action(&S, 4242), KILN_ACTION_APP); /* unknown: log only */
	assert_string_equal(hd_xid_what(79), "GPU has fallen off the bus");
	/* overrides from the cluster file win */
	kiln_cfg_xid ov[] = { { 13, KILN_ACTION_DRAIN, 1 }, { 79, KILN_ACTION_IGNORE, 2 } };
	S.xids = ov;
	S.n_xids = 2;
	assert_int_equal(hd_xid_action(&S, 13), KILN_ACTION_DRAIN);
	assert_int_equal(hd_xid_action(&S, 79), KILN_ACTION_IGNORE);
	assert_int_equal(hd_xid_action(&S, 48), KILN_ACTION_RESET);
	/* the table has no duplicates */
	size_t n;
	const hd_xid_info *t = hd_xid_table(&n);
	for (size_t i = 0; i < n; i++)
		for (size_t k = i + 1; k < n; k++)
			assert_int_not_equal(t[i].xid, t[k].xid);
}

static void test_xid_counting(void **state)
{
	hd_gpu g = { .index = 2 };
	g.cur = healthy_sample();
	assert_int_equal(hd_gpu_add_xid(&S, &g, 13), KILN_ACTION_APP);
	assert_int_equal(g.sticky.n, 0); /* application errors do not make the GPU unhealthy */
	hd_gpu_add_xid(&S, &g, 79);
	hd_gpu_add_xid(&S, &g, 79);
	hd_gpu_add_xid(&S, &g, 13);
	assert_int_equal(g.n_xids, 2);
	assert_int_equal(g.xids[0].xid, 13);
	assert_int_equal(g.xids[0].count, 2);
	assert_int_equal(g.xids[1].count, 2);
	assert_int_equal(g.last_xid, 13);
	assert_int_equal(g.sticky.n, 1); /* one reason per XID number */
	assert_non_null(strstr(g.sticky.v[0].text, "XID 79 GPU has fallen off the bus"));
	/* more distinct XIDs than slots are still counted */
	for (int x = 200; x < 200 + HD_XIDS_MAX + 5; x++)
		hd_gpu_add_xid(&S, &g, x);
	assert_int_equal(g.n_xids, HD_XIDS_MAX);
	assert_int_equal(g.xid_other, 7);
}

static void test_thresholds(void **state)
{
	hd_reasons r;
	hd_sample s = healthy_sample();
	assert_int_equal(eval(NULL, &s, &r), HD_HEALTHY);
	assert_int_equal(r.n, 0);

	s.temp_c = 85; /* warning threshold */
	assert_int_equal(eval(NULL, &s, &r), HD_DEGRADED);
	s.temp_c = 90; /* the GPU's slowdown temperature */
	assert_int_equal(eval(NULL, &s, &r), HD_UNHEALTHY);
	assert_true(has_reason(&r, "slowdown limit 90 C"));
	S.th.temp_max_c = 88;
	s.temp_c = 88;
	assert_int_equal(eval(NULL, &s, &r), HD_UNHEALTHY);
	s.temp_c = 40;

	s.power_w = 700 * 1.06;
	assert_int_equal(eval(NULL, &s, &r), HD_DEGRADED);
	s.power_w = 700;
	assert_int_equal(eval(NULL, &s, &r), HD_HEALTHY);

	s.clock_reasons = nvmlClocksThrottleReasonHwSlowdown;
	assert_int_equal(eval(NULL, &s, &r), HD_UNHEALTHY);
	s.clock_reasons = nvmlClocksThrottleReasonHwPowerBrakeSlowdown;
	assert_int_equal(eval(NULL, &s, &r), HD_UNHEALTHY);
	s.clock_reasons = nvmlClocksEventReasonSwThermalSlowdown;
	assert_int_equal(eval(NULL, &s, &r), HD_DEGRADED);
	s.clock_reasons = nvmlClocksEventReasonGpuIdle | nvmlClocksEventReasonSwPowerCap;
	assert_int_equal(eval(NULL, &s, &r), HD_HEALTHY);
	s.clock_reasons = 0;

	s.dbe_vol = 1;
	assert_int_equal(eval(NULL, &s, &r), HD_UNHEALTHY);
	s.dbe_vol = 0, s.dbe_agg = 3;
	assert_int_equal(eval(NULL, &s, &r), HD_DEGRADED);
	s.dbe_agg = 0, s.sbe_vol = 999;
	assert_int_equal(eval(NULL, &s, &r), HD_HEALTHY);
	s.sbe_vol = 1000;
	assert_int_equal(eval(NULL, &s, &r), HD_DEGRADED);
	s.sbe_vol = 0;

	s.retired_sbe = 30, s.retired_dbe = 29;
	assert_int_equal(eval(NULL, &s, &r), HD_HEALTHY);
	s.retired_dbe = 30;
	assert_int_equal(eval(NULL, &s, &r), HD_UNHEALTHY);
	s.retired_sbe = s.retired_dbe = 0;
	s.retired_pending = true;
	assert_int_equal(eval(NULL, &s, &r), HD_UNHEALTHY);
	s.retired_pending = false;

	s.remap_pending = true;
	assert_int_equal(eval(NULL, &s, &r), HD_UNHEALTHY);
	S.th.remap_pending = KILN_ACTION_APP; /* configurable */
	assert_int_equal(eval(NULL, &s, &r), HD_DEGRADED);
	s.remap_pending = false, s.remap_failure = true;
	assert_int_equal(eval(NULL, &s, &r), HD_UNHEALTHY);
	s.remap_failure = false;

	s.pcie_width = 8;
	assert_int_equal(eval(NULL, &s, &r), HD_DEGRADED);
	assert_true(has_reason(&r, "x8 below its maximum x16"));
	s.pcie_width = 16, s.pcie_gen = 1; /* idle GPUs downshift: fine */
	assert_int_equal(eval(NULL, &s, &r), HD_HEALTHY);
	s.n_pids = 1, s.pids[0] = 1234; /* under load: not fine */
	assert_int_equal(eval(NULL, &s, &r), HD_DEGRADED);
	s.pcie_gen = 5;

	hd_sample p = s;
	s.at_usec = p.at_usec + 30 * 1000000ULL;
	s.pcie_replay = p.pcie_replay + 49; /* 98/min */
	assert_int_equal(eval(&p, &s, &r), HD_HEALTHY);
	s.pcie_replay = p.pcie_replay + 50; /* 100/min */
	assert_int_equal(eval(&p, &s, &r), HD_DEGRADED);
	s.pcie_replay = p.pcie_replay;

	s.nvlink_down = 2;
	assert_int_equal(eval(&p, &s, &r), HD_UNHEALTHY);
	assert_true(has_reason(&r, "2 of 18 NVLink links down"));
	s.nvlink_down = 0;
	s.nvlink_err[NVML_NVLINK_ERROR_DL_CRC_FLIT] =
		p.nvlink_err[NVML_NVLINK_ERROR_DL_CRC_FLIT] + 3;
	assert_int_equal(eval(&p, &s, &r), HD_DEGRADED);
	assert_int_equal(eval(NULL, &s, &r), HD_HEALTHY); /* totals alone say nothing */
	s.nvlink_err[NVML_NVLINK_ERROR_DL_CRC_FLIT] = 0;

	s.persistence = false;
	assert_int_equal(eval(NULL, &s, &r), HD_DEGRADED);
	s.persistence = true;

	s.lost = true;
	assert_int_equal(eval(NULL, &s, &r), HD_UNHEALTHY);
	assert_true(has_reason(&r, "GPU_IS_LOST"));
	s.lost = false;
	snprintf(s.hung_call, sizeof(s.hung_call), "nvmlDeviceGetPowerUsage");
	assert_int_equal(eval(NULL, &s, &r), HD_UNHEALTHY);
	assert_true(has_reason(&r, "nvmlDeviceGetPowerUsage hung"));
	s.hung_call[0] = 0;
	/* a value NVML could not read is not checked */
	s.has_temp = false, s.temp_c = 200;
	assert_int_equal(eval(NULL, &s, &r), HD_HEALTHY);
}

static void node_init(hd_node *n, int gpus)
{
	memset(n, 0, sizeof(*n));
	n->n_gpus = gpus;
	for (int i = 0; i < gpus; i++) {
		n->gpus[i].index = i;
		n->gpus[i].cur = healthy_sample();
		snprintf(n->gpus[i].cur.uuid, sizeof(n->gpus[i].cur.uuid), "GPU-%d", i);
		n->gpus[i].cur.minor = (unsigned) i;
	}
}

static void test_node_state(void **state)
{
	static hd_node n;
	char buf[HD_SLURM_REASON_MAX];
	S.expected_gpus = 4;
	node_init(&n, 4);
	hd_node_evaluate(&S, &n, 100);
	assert_int_equal(n.state, HD_HEALTHY);
	assert_int_equal(n.healthy_since_usec, 100);
	assert_int_equal(hd_node_drain_reason(&n, buf, sizeof(buf)), 0);

	n.gpus[1].cur.pcie_width = 4; /* degraded: not drained, but not "healthy" for recovery */
	hd_node_evaluate(&S, &n, 200);
	assert_int_equal(n.state, HD_DEGRADED);
	assert_int_equal(n.healthy_since_usec, 0);
	assert_int_equal(hd_node_drain_reason(&n, buf, sizeof(buf)), 0);
	n.gpus[1].cur.pcie_width = 16;

	hd_gpu_add_xid(&S, &n.gpus[2], 79);
	hd_node_evaluate(&S, &n, 300);
	assert_int_equal(n.state, HD_UNHEALTHY);
	assert_int_equal(n.gpus[2].state, HD_UNHEALTHY);
	assert_int_equal(n.gpus[0].state, HD_HEALTHY);
	assert_int_equal(hd_node_drain_reason(&n, buf, sizeof(buf)), 1);
	assert_string_equal(buf, "kiln: gpu2 XID 79 GPU has fallen off the bus (reboot needed)");
	hd_node_summary(&n, buf, sizeof(buf));
	assert_string_equal(buf, "unhealthy: 4 GPUs, 3 healthy, 0 degraded, 1 unhealthy "
				 "(gpu2 XID 79 GPU has fallen off the bus (reboot needed))");
	/* XID reasons stay until the daemon restarts (after the reset/reboot) */
	hd_node_evaluate(&S, &n, 400);
	assert_int_equal(n.state, HD_UNHEALTHY);

	node_init(&n, 3); /* a GPU fell off: the count no longer matches */
	hd_node_evaluate(&S, &n, 500);
	assert_int_equal(n.state, HD_UNHEALTHY);
	hd_node_drain_reason(&n, buf, sizeof(buf));
	assert_string_equal(buf, "kiln: 3 GPUs found, the cluster file says 4");
	/* NVML there but no GPU (the module did not load): the count is the
	 * drain reason, NVML's error the second reason */
	node_init(&n, 0);
	snprintf(n.nvml_down, sizeof(n.nvml_down), "%s", "Driver Not Loaded");
	hd_node_evaluate(&S, &n, 550);
	assert_int_equal(n.state, HD_UNHEALTHY);
	hd_node_drain_reason(&n, buf, sizeof(buf));
	assert_string_equal(buf, "kiln: 0 GPUs found, the cluster file says 4");
	assert_int_equal(n.reasons.n, 2);
	assert_string_equal(n.reasons.v[1].text, "NVML unavailable (Driver Not Loaded)");
	n.nvml_down[0] = 0;
	node_init(&n, 4);
	hd_node_evaluate(&S, &n, 600);
	assert_int_equal(n.healthy_since_usec, 600);
	hd_node_evaluate(&S, &n, 700);
	assert_int_equal(n.healthy_since_usec, 600); /* counts from the first healthy moment */
}

/* The shared mounts check (mounts.c) against a mount table written here:
 * a required mount missing drains with its reason, an optional one only
 * degrades, escaped mount points (\040) match, and a table that cannot be
 * read keeps the node unhealthy. */
static void test_mounts(void **state)
{
	static hd_node n;
	char buf[HD_SLURM_REASON_MAX], path[] = "/tmp/kiln-mountinfo.XXXXXX";
	kiln_cfg_mount mounts[] = {
		{ .what = "head:/home", .where = "/home", .type = "nfs", .required = true },
		{ .what = "scratch", .where = "/srv/my share", .type = "tmpfs", .required = false },
	};
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	static const char table[] =
		"22 1 0:21 / /proc rw,nosuid - proc proc rw\n"
		"30 1 0:26 / /srv/my\\040share rw - tmpfs scratch rw\n"
		"31 1 0:40 / /home rw,relatime shared:9 - nfs4 head:/home rw,vers=4.2\n";
	assert_int_equal(write(fd, table, strlen(table)), (ssize_t) strlen(table));
	close(fd);
	S.expected_gpus = 4;
	S.mounts = mounts;
	S.n_mounts = 2;
	snprintf(S.mountinfo, sizeof(S.mountinfo), "%s", path);
	node_init(&n, 4);
	assert_int_equal(hd_mounts_check(&S, NULL, 0, &n.mounts), 0);
	hd_node_evaluate(&S, &n, 100);
	assert_int_equal(n.state, HD_HEALTHY);

	/* /home gone (only the optional mount left): drained with the reason */
	static const char gone[] = "22 1 0:21 / /proc rw - proc proc rw\n"
				   "30 1 0:26 / /srv/my\\040share rw - tmpfs scratch rw\n";
	assert_int_equal(kiln_write_file_atomic(path, gone, strlen(gone), 0600), 0);
	assert_int_equal(hd_mounts_check(&S, NULL, 0, &n.mounts), 1);
	hd_node_evaluate(&S, &n, 200);
	assert_int_equal(n.state, HD_UNHEALTHY);
	assert_int_equal(hd_node_drain_reason(&n, buf, sizeof(buf)), 1);
	assert_string_equal(buf, "kiln: mount /home (head:/home nfs) missing");
	assert_false(hd_mount_ok(&n.mounts, &mounts[0]));
	assert_true(hd_mount_ok(&n.mounts, &mounts[1]));

	/* an optional mount missing: degraded, not drained */
	static const char no_scratch[] = "31 1 0:40 / /home rw - nfs4 head:/home rw\n";
	assert_int_equal(kiln_write_file_atomic(path, no_scratch, strlen(no_scratch), 0600), 0);
	assert_int_equal(hd_mounts_check(&S, NULL, 0, &n.mounts), 1);
	hd_node_evaluate(&S, &n, 300);
	assert_int_equal(n.state, HD_DEGRADED);
	assert_int_equal(hd_node_drain_reason(&n, buf, sizeof(buf)), 0);
	assert_string_equal(n.reasons.v[0].text, "mount /srv/my share (scratch tmpfs) missing");

	/* back: healthy again, recovery counts from here */
	assert_int_equal(kiln_write_file_atomic(path, table, strlen(table), 0600), 0);
	assert_int_equal(hd_mounts_check(&S, NULL, 0, &n.mounts), 0);
	hd_node_evaluate(&S, &n, 400);
	assert_int_equal(n.state, HD_HEALTHY);
	assert_int_equal(n.healthy_since_usec, 400);

	unlink(path);
	assert_true(hd_mounts_check(&S, NULL, 0, &n.mounts) < 0);
	hd_node_evaluate(&S, &n, 500);
	assert_int_equal(n.state, HD_UNHEALTHY);

	/* the statfs() probe of a mounted share: "/" answers; a mount point
	 * the table lists but that cannot be reached is not accessible */
	kiln_cfg_mount probed[] = {
		{ .what = "rootfs",
		  .where = "/",
		  .type = "ext4",
		  .required = true,
		  .timeout_usec = KILN_USEC_PER_SEC },
		{ .what = "head:/gone",
		  .where = "/nonexistent-kiln-mount",
		  .type = "nfs",
		  .required = true,
		  .timeout_usec = KILN_USEC_PER_SEC },
	};
	static const char two[] = "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n"
				  "40 1 0:40 / /nonexistent-kiln-mount rw - nfs4 head:/gone rw\n";
	assert_int_equal(kiln_write_file_atomic(path, two, strlen(two), 0600), 0);
	S.mounts = probed;
	hd_mounts_state ms = { .wait = true };
	assert_int_equal(hd_mounts_check(&S, &ms, kiln_now_usec(), &n.mounts), 1);
	assert_int_equal(n.mounts.n, 1);
	assert_string_equal(n.mounts.v[0].text, "mount /nonexistent-kiln-mount (head:/gone nfs) "
						"not accessible (No such file or directory)");
	S.n_mounts = 1; /* "/" alone: answers, nothing reported */
	assert_int_equal(hd_mounts_check(&S, &ms, kiln_now_usec(), &n.mounts), 0);
	hd_mounts_state_free(&ms);
	unlink(path);

	/* no mounts in the file: nothing is read, nothing reported */
	S.n_mounts = 0;
	assert_int_equal(hd_mounts_check(&S, NULL, 0, &n.mounts), 0);
	assert_int_equal(n.mounts.n, 0);
	S.mounts = NULL;
	S.mountinfo[0] = 0;
}

static void test_metrics(void **state)
{
	static hd_node n;
	node_init(&n, 2);
	snprintf(n.gpus[1].cur.name, sizeof(n.gpus[1].cur.name), "odd \"name\"\\x");
	n.gpus[1].cur.temp_c = 71;
	hd_gpu_add_xid(&S, &n.gpus[1], 79);
	hd_gpu_add_xid(&S, &n.gpus[1], 79);
	hd_gpu_add_xid(&S, &n.gpus[1], 31);
	snprintf(n.gpus[0].job_ids, sizeof(n.gpus[0].job_ids), "17,18");
	hd_node_evaluate(&S, &n, 1);
	_cleanup_strbuf_ kiln_strbuf b;
	kiln_strbuf_init(&b);
	assert_int_equal(hd_metrics_render(&n, "node01", &b), 0);
	const char *t = b.s;
	assert_non_null(strstr(
		t, "DCGM_FI_DEV_GPU_TEMP{gpu=\"1\",UUID=\"GPU-1\",pci_bus_id=\"00000000:18:00.0\","
		   "device=\"nvidia1\",modelName=\"odd \\\"name\\\"\\\\x\",Hostname=\"node01\"} "
		   "71\n"));
	assert_non_null(strstr(t, "# TYPE DCGM_FI_DEV_POWER_USAGE gauge\n"));
	assert_non_null(strstr(t, ",xid=\"79\"} 2\n"));
	assert_non_null(strstr(t, ",xid=\"31\"} 1\n"));
	assert_non_null(strstr(t, "DCGM_FI_DEV_XID_ERRORS{gpu=\"1\""));
	assert_non_null(strstr(t, ",state=\"unhealthy\"} 1\n"));
	assert_non_null(strstr(t, "kiln_node_health{Hostname=\"node01\",state=\"unhealthy\"} 1\n"));
	assert_non_null(strstr(t, ",job=\"17\"} 1\n"));
	assert_non_null(strstr(t, ",job=\"18\"} 1\n"));
	/* every sample line is well formed: name{labels} value */
	regex_t re;
	assert_int_equal(regcomp(&re,
				 "^[a-zA-Z_:][a-zA-Z0-9_:]*(\\{([a-zA-Z_][a-zA-Z0-9_]*=\"([^\"\\\\]"
				 "|\\\\.)*\",?)*\\})? "
				 "-?[0-9.e+-]+$",
				 REG_EXTENDED | REG_NOSUB),
			 0);
	char *copy = strdup(t), *save = NULL;
	int samples = 0;
	for (char *l = strtok_r(copy, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
		if (l[0] == '#')
			continue;
		if (regexec(&re, l, 0, NULL, 0) != 0)
			fail_msg("malformed metrics line: %s", l);
		samples++;
	}
	assert_true(samples > 50);
	free(copy);
	regfree(&re);
}

static void test_json_table(void **state)
{
	static hd_node n;
	S.expected_gpus = 2;
	node_init(&n, 2);
	n.gpus[0].cur.dbe_vol = 5;
	hd_node_evaluate(&S, &n, 1);
	_cleanup_strbuf_ kiln_strbuf b;
	kiln_strbuf_init(&b);
	assert_int_equal(hd_json_render(&n, "node02", &b), 0);
	json_error_t err;
	json_t *j = json_loads(b.s, 0, &err);
	assert_non_null(j);
	assert_string_equal(json_string_value(json_object_get(j, "state")), "unhealthy");
	assert_string_equal(json_string_value(json_object_get(j, "node")), "node02");
	assert_string_equal(json_string_value(json_object_get(j, "drain_reason")),
			    "kiln: gpu0 5 double-bit ECC errors since the last reset");
	json_t *g = json_array_get(json_object_get(j, "gpus"), 1);
	assert_string_equal(json_string_value(json_object_get(g, "state")), "healthy");
	assert_int_equal(json_integer_value(json_object_get(g, "temperature_c")), 40);
	json_decref(j);

	kiln_strbuf b2;
	kiln_strbuf_init(&b2);
	assert_int_equal(hd_table_render(&n, "node02", &b2), 0);
	assert_non_null(strstr(b2.s, "unhealthy  5 double-bit ECC errors"));
	assert_non_null(strstr(b2.s, "node node02: unhealthy\n"));
	kiln_strbuf_free(&b2);
}

/* ---- NVML loader against the fake ---- */

static char fake_dir[512], old_dir[512], scenario[600];

static int nvml_setup(void **state)
{
	hd_settings_defaults(&S);
	const char *b = getenv("KILN_BUILD");
	if (!b)
		b = "build";
	char *abs = realpath(b, NULL);
	if (!abs)
		return 0;
	snprintf(fake_dir, sizeof(fake_dir), "%s/lib/fake-nvml/libnvidia-ml.so.1", abs);
	snprintf(old_dir, sizeof(old_dir), "%s/lib/fake-nvml-old/libnvidia-ml.so.1", abs);
	snprintf(scenario, sizeof(scenario), "/tmp/test-healthd-%d.cfg", (int) getpid());
	free(abs);
	FILE *f = fopen(scenario, "we");
	fprintf(f, "gpus = ( { temperature = 51; power_w = 123.5; remap_pending = true; processes "
		   "= [ 1 ]; },\n"
		   "         { uuid = \"GPU-hang\"; } );\n"
		   "events = ( { at = 0.0; gpu = 1; hang = \"nvmlDeviceGetPowerUsage\"; },\n"
		   "           { at = 0.3; gpu = 0; xid = 48; } );\n");
	fclose(f);
	setenv("KILN_FAKE_NVML_SCENARIO", scenario, 1);
	return 0;
}

static int nvml_teardown(void **state)
{
	unlink(scenario);
	return 0;
}

static int xid_seen_gpu = -1, xid_seen = -1;
static void xid_cb(int gpu, int xid, void *data)
{
	xid_seen_gpu = gpu;
	xid_seen = xid;
}

static void test_nvml_init_hang(void **state)
{
	if (access(fake_dir, R_OK) < 0)
		skip();
	char err[256] = "";
	hd_nvml *m = NULL;
	setenv("KILN_FAKE_NVML_HANG_INIT", "1", 1);
	uint64_t t0 = kiln_now_usec();
	assert_int_equal(hd_nvml_open(fake_dir, 200000, &m, err, sizeof(err)), -ETIMEDOUT);
	assert_true(kiln_now_usec() - t0 < 1000000);
	assert_non_null(strstr(err, "nvmlInit did not return within 0.2s"));
	assert_null(m);
	unsetenv("KILN_FAKE_NVML_HANG_INIT");
}

/* Issue 31: hd_nvml_open() itself refuses (without dlopen: the
 * constructor never runs) a library a user other than root can change,
 * so a file swapped after the daemon's start-up check is caught too. */
static void test_nvml_untrusted(void **state)
{
	if (access(fake_dir, R_OK) < 0 || geteuid() != 0)
		skip();
	char dir[] = "/tmp/test-healthd-untrusted.XXXXXX", lib[96], mark[96], cmd[1024];
	assert_non_null(mkdtemp(dir));
	assert_int_equal(chmod(dir, 0755), 0);
	snprintf(lib, sizeof(lib), "%s/libnvidia-ml.so.1", dir);
	snprintf(mark, sizeof(mark), "%s/constructor-ran", dir);
	snprintf(cmd, sizeof(cmd), "cp '%s' '%s' && chown 65534 '%s'", fake_dir, lib, lib);
	assert_int_equal(system(cmd), 0);
	setenv("KILN_FAKE_NVML_CONSTRUCTOR_MARK", mark, 1);
	char err[512] = "";
	hd_nvml *m = NULL;
	assert_int_equal(hd_nvml_open(lib, 300000, &m, err, sizeof(err)), -EPERM);
	assert_null(m);
	assert_non_null(strstr(err, "refusing to load"));
	assert_non_null(strstr(err, "not root"));
	assert_int_equal(access(mark, F_OK), -1); /* never loaded */
	/* root's, but every user may write it */
	assert_int_equal(chown(lib, 0, 0), 0);
	assert_int_equal(chmod(lib, 0666), 0);
	assert_int_equal(hd_nvml_open(lib, 300000, &m, err, sizeof(err)), -EPERM);
	assert_non_null(strstr(err, "writable by every user"));
	assert_int_equal(access(mark, F_OK), -1);
	/* made root's alone: loads, and the constructor runs */
	assert_int_equal(chmod(lib, 0755), 0);
	assert_int_equal(hd_nvml_open(lib, 300000, &m, err, sizeof(err)), 0);
	assert_int_equal(access(mark, F_OK), 0);
	hd_nvml_close(m);
	unsetenv("KILN_FAKE_NVML_CONSTRUCTOR_MARK");
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	assert_int_equal(system(cmd), 0);
}

static void test_nvml_fake(void **state)
{
	if (access(fake_dir, R_OK) < 0)
		skip();
	char err[256] = "";
	hd_nvml *m = NULL;
	assert_int_equal(
		hd_nvml_open("/nonexistent/libnvidia-ml.so.1", 200000, &m, err, sizeof(err)),
		-ENOENT);
	assert_int_equal(hd_nvml_open(fake_dir, 300000, &m, err, sizeof(err)), 0);
	int n = 0;
	assert_int_equal(hd_nvml_count(m, &n), 0);
	assert_int_equal(n, 2);
	assert_int_equal(hd_nvml_start_events(m, xid_cb, NULL), 0);
	hd_sample s = {};
	assert_int_equal(hd_nvml_poll(m, 0, &s), 0);
	assert_true(s.present);
	assert_int_equal(s.temp_c, 51);
	assert_true(s.power_w > 123.4 && s.power_w < 123.6);
	assert_true(s.has_remap && s.remap_pending);
	assert_int_equal(s.nvlink_total, 18);
	assert_int_equal(s.n_pids, 1);
	assert_string_equal(s.pci_bus_id, "00000000:18:00.0");

	/* the hung call is abandoned after the timeout, named, and not retried */
	hd_sample h = {};
	uint64_t t0 = kiln_now_usec();
	assert_int_equal(hd_nvml_poll(m, 1, &h), -ETIMEDOUT);
	uint64_t dt = kiln_now_usec() - t0;
	assert_true(dt >= 290000 && dt < 1500000);
	assert_string_equal(h.hung_call, "nvmlDeviceGetPowerUsage");
	assert_int_equal(hd_nvml_abandoned(m), 1);
	t0 = kiln_now_usec();
	assert_int_equal(hd_nvml_poll(m, 1, &h), -ETIMEDOUT);
	assert_true(kiln_now_usec() - t0 < 100000);
	assert_int_equal(hd_nvml_abandoned(m), 1);
	/* the other GPU still polls fine on a fresh worker */
	assert_int_equal(hd_nvml_poll(m, 0, &s), 0);
	assert_int_equal(s.temp_c, 51);

	for (int i = 0; i < 100 && xid_seen < 0; i++)
		usleep(20000);
	assert_int_equal(xid_seen, 48);
	assert_int_equal(xid_seen_gpu, 0);
	/* close must not wait for the hung thread */
	hd_nvml_close(m);
}

static void test_nvml_old_driver(void **state)
{
	if (access(old_dir, R_OK) < 0)
		skip();
	char err[256] = "";
	hd_nvml *m = NULL;
	assert_int_equal(hd_nvml_open(old_dir, 300000, &m, err, sizeof(err)), 0);
	hd_sample s = {};
	assert_int_equal(hd_nvml_poll(m, 0, &s), 0);
	assert_true(s.present);
	assert_true(s.has_clocks); /* via nvmlDeviceGetCurrentClocksThrottleReasons */
	assert_true(s.has_pids);   /* via nvmlDeviceGetComputeRunningProcesses_v2 */
	assert_false(s.has_remap); /* no nvmlDeviceGetRemappedRows: only that check is off */
	assert_true(s.has_temp);
	hd_reasons r = {};
	hd_evaluate(&S, NULL, &s, &r);
	assert_false(has_reason(&r, "row remapping"));
	hd_nvml_close(m);
}

/* The check table: each row's fake NVML fault, through the real sampler,
 * gives that row's reason and nothing else; each value it shows is in the
 * metrics and the JSON of a sampled GPU. */
static void poll_fake(const char *gpu, int i, hd_gpu *g)
{
	char path[640];
	snprintf(path, sizeof(path), "%s.%d", scenario, i);
	FILE *f = fopen(path, "we");
	assert_non_null(f);
	fprintf(f, "gpus = ( { %s } );\n", gpu);
	fclose(f);
	setenv("KILN_FAKE_NVML_SCENARIO", path, 1);
	char err[256] = "";
	hd_nvml *m = NULL;
	assert_int_equal(hd_nvml_open(fake_dir, 300000, &m, err, sizeof(err)), 0);
	memset(g, 0, sizeof(*g));
	hd_nvml_poll(m, 0, &g->cur);
	hd_nvml_close(m);
	unlink(path);
	setenv("KILN_FAKE_NVML_SCENARIO", scenario, 1);
}

static void test_check_table(void **state)
{
	if (access(fake_dir, R_OK) < 0)
		skip();
	size_t n;
	const hd_check *c = hd_checks(&n);
	static hd_node node;
	hd_reasons r = {};
	memset(&node, 0, sizeof(node));
	node.n_gpus = 1;
	poll_fake("", -1, &node.gpus[0]);
	hd_evaluate(&S, NULL, &node.gpus[0].cur, &r);
	assert_int_equal(r.n, 0); /* the fake's default GPU is healthy */
	hd_node_evaluate(&S, &node, 1);
	_cleanup_strbuf_ kiln_strbuf mb;
	_cleanup_strbuf_ kiln_strbuf jb;
	kiln_strbuf_init(&mb);
	kiln_strbuf_init(&jb);
	assert_int_equal(hd_metrics_render(&node, "node01", &mb), 0);
	assert_int_equal(hd_json_render(&node, "node01", &jb), 0);
	json_error_t jerr;
	json_t *j = json_loads(jb.s, 0, &jerr);
	assert_non_null(j);
	json_t *g0 = json_array_get(json_object_get(j, "gpus"), 0);

	for (size_t i = 0; i < n; i++) {
		assert_non_null(c[i].name);
		for (const hd_value *v = c[i].values; v < hd_check_values_end(&c[i]); v++) {
			char want[256];
			if (v->metric) {
				snprintf(want, sizeof(want), "\n%s{gpu=\"0\"", v->metric);
				if (!strstr(mb.s, want))
					fail_msg("check %s: no %s sample", c[i].name, v->metric);
			}
			if (v->json && !json_object_get(g0, v->json))
				fail_msg("check %s: no \"%s\" in the JSON", c[i].name, v->json);
		}
		if (!c[i].fault)
			continue;
		assert_non_null(c[i].evaluate);
		assert_non_null(c[i].reason);
		static hd_gpu g;
		poll_fake(c[i].fault, (int) i, &g);
		memset(&r, 0, sizeof(r));
		hd_evaluate(&S, NULL, &g.cur, &r);
		if (r.n != 1 || !streq(r.v[0].text, c[i].reason))
			fail_msg(
				"check %s: fault '%s' gave %d reason(s), the first '%s'; want '%s'",
				c[i].name, c[i].fault, r.n, r.n ? r.v[0].text : "", c[i].reason);
	}
	json_decref(j);
}

/* hd_active_run against stand-ins for kiln-healthd-active */
static void test_active_runner(void **state)
{
	hd_active_result r[HD_ACTIVE_CHECKS];
	assert_int_equal(hd_active_run(&S, -1, "x", 0, r), 0);
	for (int i = 0; i < HD_ACTIVE_CHECKS; i++) {
		assert_string_equal(r[i].status, "skipped");
		assert_string_equal(r[i].detail, "no GPU present");
	}
	char path[] = "/tmp/test-healthd-active-XXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	FILE *f = fdopen(fd, "w");
	/* prints its environment's GPU in the detail, then two results */
	fprintf(f, "#!/bin/sh\nprintf 'gemm\\tpassed\\t612.50\\t989\\tgpu %%s order %%s %%s\\n' "
		   "\"$CUDA_VISIBLE_DEVICES\" "
		   "\"$CUDA_DEVICE_ORDER\" \"$*\"\nprintf "
		   "'bandwidth\\tfailed\\t1200.00\\t3350\\ttoo slow\\n'\nkill -9 $$\n");
	fclose(f);
	chmod(path, 0755);
	setenv("KILN_HEALTHD_ACTIVE", path, 1);
	S.gemm_seconds = 3;
	S.memtest_fraction = 0.5;
	assert_int_equal(hd_active_run(&S, 5, "NVIDIA H100 80GB HBM3", 4096, r), 0);
	assert_string_equal(r[0].name, "gemm");
	assert_string_equal(r[0].status, "passed");
	assert_true(r[0].value > 612.4 && r[0].value < 612.6);
	assert_true(r[0].expected == 989);
	assert_string_equal(r[0].detail, "gpu 5 order PCI_BUS_ID --model NVIDIA H100 80GB HBM3 "
					 "--gemm-seconds 3 --memtest-bytes 2048");
	assert_string_equal(r[1].status, "failed");
	assert_string_equal(r[1].detail, "too slow");
	/* no result and a violent end: failed, never passed or skipped */
	assert_string_equal(r[2].status, "failed");
	assert_string_equal(r[2].detail, "the check program died (signal 9)");
	unsetenv("KILN_HEALTHD_ACTIVE");
	unlink(path);
}

/* The XID state file: save/load round trip, dedup, clear by index / UUID /
 * all, corrupt files rejected with the line, and applying entries to GPUs
 * by UUID even when the index moved. */
static void test_xid_state(void **state)
{
	char dir[] = "/tmp/test-healthd-xs.XXXXXX";
	assert_non_null(mkdtemp(dir));
	char path[128];
	snprintf(path, sizeof(path), "%s/xid.state", dir);
	static hd_xid_state st, back;
	int line = -1;
	assert_int_equal(hd_xid_state_load(path, &back, &line), -ENOENT);

	const char *u1 = "GPU-00000000-0000-4000-8000-000000000001";
	const char *u3 = "GPU-00000000-0000-4000-8000-000000000003";
	assert_true(hd_xid_state_add(&st, 1, u1, 79, KILN_ACTION_REBOOT, 1795830000));
	assert_false(hd_xid_state_add(&st, 1, u1, 79, KILN_ACTION_REBOOT, 1795830001));
	assert_true(hd_xid_state_add(&st, 1, u1, 48, KILN_ACTION_RESET, 1795830002));
	assert_true(hd_xid_state_add(&st, 3, u3, 94, KILN_ACTION_DRAIN, 1795830003));
	assert_true(hd_xid_state_add(&st, 2, "", 119, KILN_ACTION_RESET, 1795830004));
	assert_int_equal(st.n, 4);
	assert_int_equal(hd_xid_state_save(path, &st), 0);
	assert_int_equal(hd_xid_state_load(path, &back, &line), 0);
	assert_int_equal(back.n, 4);
	assert_string_equal(back.v[0].uuid, u1);
	assert_int_equal(back.v[0].xid, 79);
	assert_int_equal(back.v[0].action, KILN_ACTION_REBOOT);
	assert_int_equal(back.v[0].time, 1795830000);
	assert_int_equal(back.v[2].gpu, 3);
	assert_int_equal(back.v[2].action, KILN_ACTION_DRAIN);
	assert_string_equal(back.v[3].uuid, "");
	assert_int_equal(back.v[3].gpu, 2);
	assert_int_equal(back.v[3].xid, 119);

	/* applied by UUID: gpu1's UUID now sits at index 0 */
	static hd_node n;
	memset(&n, 0, sizeof(n));
	n.n_gpus = 4;
	for (int i = 0; i < 4; i++)
		n.gpus[i].cur = healthy_sample();
	snprintf(n.gpus[0].cur.uuid, sizeof(n.gpus[0].cur.uuid), "%s", u1);
	snprintf(n.gpus[1].cur.uuid, sizeof(n.gpus[1].cur.uuid), "GPU-other");
	snprintf(n.gpus[2].cur.uuid, sizeof(n.gpus[2].cur.uuid), "GPU-two");
	snprintf(n.gpus[3].cur.uuid, sizeof(n.gpus[3].cur.uuid), "GPU-three");
	hd_xid_state_apply(&back, &n);
	assert_int_equal(n.gpus[0].sticky.n, 2);
	assert_string_equal(n.gpus[0].sticky.v[0].text,
			    "XID 79 GPU has fallen off the bus (reboot needed)");
	assert_int_equal(n.gpus[1].sticky.n, 0);
	assert_int_equal(n.gpus[2].sticky.n, 1); /* no UUID recorded: by index */
	assert_int_equal(n.gpus[3].sticky.n, 0); /* u3 is gone */
	assert_int_equal(hd_xid_state_find_gpu(&back.v[2], &n), -1);
	hd_node_evaluate(&S, &n, 1);
	assert_int_equal(n.state, HD_UNHEALTHY);
	char reason[HD_SLURM_REASON_MAX];
	assert_int_equal(hd_node_drain_reason(&n, reason, sizeof(reason)), 1);
	assert_string_equal(reason, "kiln: gpu0 XID 79 GPU has fallen off the bus (reboot needed)");

	/* clear */
	assert_int_equal(hd_xid_state_clear(&back, "bogus"), -EINVAL);
	assert_int_equal(hd_xid_state_clear(&back, "7"), 0);
	assert_int_equal(hd_xid_state_clear(&back, u3), 1);
	assert_int_equal(hd_xid_state_clear(&back, "gpu1"), 2);
	assert_int_equal(back.n, 1);
	assert_int_equal(back.v[0].xid, 119);
	assert_int_equal(hd_xid_state_clear(&back, "all"), 1);
	assert_int_equal(back.n, 0);
	hd_xid_state_apply(&back, &n);
	hd_node_evaluate(&S, &n, 2);
	assert_int_equal(n.state, HD_HEALTHY);

	/* corrupt files: the line, and st left alone */
	static const struct {
		const char *text;
		int line;
	} bad[] = {
		{ "# header\n1 GPU-x 79 reboot\n", 2 },	  { "1 GPU-x 79 explode 5\n", 1 },
		{ "1 GPU-x 79 reboot 5 extra\n", 1 },	  { "\n\n99 GPU-x 79 reboot 5\n", 3 },
		{ "1 GPU-x seventy-nine reboot 5\n", 1 }, { "1 GPU-x 79 reboot -5\n", 1 },
	};
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
		back.n = 42;
		assert_int_equal(hd_xid_state_parse(bad[i].text, &back, &line), -EBADMSG);
		assert_int_equal(line, bad[i].line);
		assert_int_equal(back.n, 42);
	}
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fwrite("1 GPU-x 79 reboot 5\n\0garbage", 1, 28, f);
	fclose(f);
	assert_int_equal(hd_xid_state_load(path, &back, &line), -EBADMSG);
	assert_int_equal(hd_xid_state_parse("# only a comment\n\n", &back, &line), 0);
	assert_int_equal(back.n, 0);

	/* a full state: refuses more, and round-trips through the file's size cap */
	static hd_xid_state full;
	for (int i = 0; i < HD_XID_STATE_MAX; i++) {
		char u[64];
		snprintf(u, sizeof(u), "GPU-00000000-0000-4000-8000-0000000000%02d",
			 i % HD_GPUS_MAX);
		assert_true(hd_xid_state_add(&full, i % HD_GPUS_MAX, u, 1000 + i / HD_GPUS_MAX,
					     KILN_ACTION_REBOOT, 1795830000 + i));
	}
	assert_false(hd_xid_state_add(&full, 0, "GPU-new", 79, KILN_ACTION_REBOOT, 1));
	assert_int_equal(hd_xid_state_save(path, &full), 0);
	assert_int_equal(hd_xid_state_load(path, &back, &line), 0);
	assert_int_equal(back.n, HD_XID_STATE_MAX);
	assert_int_equal(back.v[HD_XID_STATE_MAX - 1].time, 1795830000 + HD_XID_STATE_MAX - 1);
	assert_int_equal(hd_xid_state_clear(&back, "gpu63"), HD_XID_STATE_MAX / HD_GPUS_MAX);

	unlink(path);
	rmdir(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_settings_defaults),
		cmocka_unit_test_setup(test_xid_table, setup),
		cmocka_unit_test_setup(test_xid_counting, setup),
		cmocka_unit_test_setup(test_thresholds, setup),
		cmocka_unit_test_setup(test_node_state, setup),
		cmocka_unit_test_setup(test_mounts, setup),
		cmocka_unit_test_setup(test_metrics, setup),
		cmocka_unit_test_setup(test_json_table, setup),
		cmocka_unit_test(test_nvml_init_hang),
		cmocka_unit_test(test_nvml_untrusted),
		cmocka_unit_test(test_nvml_fake),
		cmocka_unit_test(test_nvml_old_driver),
		cmocka_unit_test_setup(test_check_table, setup),
		cmocka_unit_test_setup(test_active_runner, setup),
		cmocka_unit_test_setup(test_xid_state, setup),
	};
	return cmocka_run_group_tests(tests, nvml_setup, nvml_teardown);
}
