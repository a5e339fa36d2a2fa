/* healthd.h — the parts of kiln-healthd, the GPU health daemon.
 *
 * kiln-healthd polls every GPU through NVML (nvml.c), listens for XID events
 * in its own thread, turns what it sees into a per-GPU and per-node state
 * (healthy / degraded / unhealthy, with reasons: check.c), publishes
 * dcgm-exporter compatible metrics and a table or JSON view (output.c), and
 * drains or resumes the node in Slurm (slurm.c).  main.c is the program:
 * arguments, config, the event loop, sd_notify.
 *
 * Everything here but main.c is library-style: it returns -errno and logs at
 * debug only, except where a function says it logs. */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "kiln/config.h"
#include "kiln/hostlist.h"
#include "kiln/nvml-api.h"
#include "kiln/parse.h"
#include "kiln/slurm.h"
#include "kiln/strbuf.h"

/* dcgm-exporter and gres.conf stop at 16 GPUs per node; 64 leaves room for
 * MIG-less oddities without unbounded arrays. */
#define HD_GPUS_MAX 64
/* Reasons are short sentences ("XID 79: GPU has fallen off the bus"). */
#define HD_REASON_MAX 160
/* More reasons than this on one GPU add nothing for an operator. */
#define HD_REASONS_MAX 16
/* Distinct XIDs counted per GPU; further ones are counted as xid="other". */
#define HD_XIDS_MAX 32
/* Processes looked at per GPU to find the Slurm job. */
#define HD_PIDS_MAX 32
/* Slurm's reason field is free text; keep ours readable in sinfo -R. */
#define HD_SLURM_REASON_MAX KILN_SLURM_REASON_MAX

typedef enum hd_state {
	HD_HEALTHY = 0,
	HD_DEGRADED = 1,
	HD_UNHEALTHY = 2,
} hd_state;
const char *hd_state_to_string(hd_state s);

/* ---- settings (from the cluster file's health section, or defaults) ---- */

typedef struct hd_settings {
	char node[KILN_HOSTNAME_MAX + 1];
	int expected_gpus; /* -1: unknown (no cluster file) */
	uint64_t interval_usec;
	uint64_t recover_after_usec;
	uint64_t nvml_timeout_usec;
	uint64_t watchdog_usec;
	int metrics_port; /* 0: no HTTP server */
	char metrics_address[64];
	char nvml_library[256];
	bool enabled; /* health.enabled: false = the daemon has nothing to do */
	bool drain;
	kiln_cfg_thresholds th;
	const kiln_cfg_xid *xids; /* overrides, owned by the kiln_cfg */
	size_t n_xids;
	bool active_on_start;
	uint64_t active_interval_usec;
	int gemm_seconds;
	double memtest_fraction;
	/* the shared mounts check (mounts.c): mounts[] of the cluster file,
	 * owned by the kiln_cfg; none when the node is not in it */
	const kiln_cfg_mount *mounts;
	size_t n_mounts;
	/* the node's mount table; "": HD_MOUNTINFO_PATH, probed through
	 * HD_MOUNT_ROOT; any other table is probed at the mount points as
	 * they are */
	char mountinfo[256];
} hd_settings;

/* The settings without a cluster file: the config schema's defaults for the
 * health section (kiln_cfg_defaults()), no node, expected_gpus -1.
 * Returns 0, or -ENOMEM. */
int hd_settings_defaults(hd_settings *s);
/* Copies the health section and this node's GPU count out of cfg.  node may
 * be NULL when the node is not in the cluster file (expected_gpus stays -1).
 * cfg must outlive s (XID overrides are borrowed). */
void hd_settings_from_cfg(hd_settings *s, const kiln_cfg *cfg, const kiln_cfg_node *node);

/* ---- XID table -------------------------------------------------------- */

typedef struct hd_xid_info {
	int xid;
	kiln_cfg_action action;
	const char *what; /* NVIDIA's catalog description, short */
} hd_xid_info;

/* The action for xid: an override from s if any, else the built-in table,
 * else KILN_ACTION_APP (log and count, do not drain). */
kiln_cfg_action hd_xid_action(const hd_settings *s, int xid);
/* The catalog description, or "unknown XID". */
const char *hd_xid_what(int xid);
const hd_xid_info *hd_xid_table(size_t *ret_n);

/* ---- one sample of one GPU -------------------------------------------- */

typedef struct hd_sample {
	bool present;	    /* a handle was obtained */
	bool lost;	    /* NVML_ERROR_GPU_IS_LOST on any call */
	char hung_call[64]; /* an NVML call that timed out (this or an earlier poll) */
	char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
	char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
	char pci_bus_id[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
	unsigned minor;
	bool has_temp, has_slowdown, has_power, has_power_limit, has_clocks, has_ecc, has_retired,
		has_retired_pending, has_remap, has_pcie_gen, has_pcie_width, has_replay,
		has_nvlink, has_persistence, has_mem, has_pids;
	unsigned temp_c, slowdown_c;
	double power_w, power_limit_w;
	uint64_t clock_reasons;
	uint64_t sbe_vol, dbe_vol, sbe_agg, dbe_agg;
	unsigned retired_sbe, retired_dbe;
	bool retired_pending;
	unsigned remap_corr, remap_unc;
	bool remap_pending, remap_failure;
	unsigned pcie_gen, pcie_gen_max, pcie_width, pcie_width_max, pcie_replay;
	int nvlink_total, nvlink_down;
	uint64_t nvlink_err[NVML_NVLINK_ERROR_COUNT]; /* replay, recovery, crc flit, crc data */
	bool persistence;
	uint64_t mem_total, mem_used, mem_free; /* free = total - used */
	unsigned n_pids;
	unsigned pids[HD_PIDS_MAX];
	uint64_t at_usec; /* monotonic time of the sample */
} hd_sample;

typedef struct hd_reason {
	hd_state severity;
	char text[HD_REASON_MAX];
} hd_reason;

typedef struct hd_reasons {
	hd_reason v[HD_REASONS_MAX];
	int n;
} hd_reasons;

void hd_reasons_add(hd_reasons *r, hd_state sev, const char *fmt, ...) _printf_(3, 4);
hd_state hd_reasons_state(const hd_reasons *r);

/* Evaluates one sample against the thresholds: every check of the table
 * below, in order.  prev (may be NULL) is the previous sample of the same
 * GPU, for rates (PCIe replays per minute, NVLink error deltas). */
void hd_evaluate(const hd_settings *s, const hd_sample *prev, const hd_sample *cur,
		 hd_reasons *out);

/* ---- per-GPU and node state ------------------------------------------- */

typedef struct hd_xid_count {
	int xid;
	uint64_t count;
} hd_xid_count;

typedef struct hd_gpu {
	int index;
	hd_sample cur, prev;
	bool have_prev;
	hd_reasons sticky;  /* from XIDs that need a reset/reboot: kept in the XID state file */
	hd_reasons active;  /* failed active checks: kept until they pass again */
	hd_reasons reasons; /* last evaluation, sticky ones included */
	hd_state state;
	hd_xid_count xids[HD_XIDS_MAX];
	int n_xids;
	uint64_t xid_other;
	int last_xid;
	char job_ids[64]; /* Slurm job ids on this GPU, "" when none known */
} hd_gpu;

typedef struct hd_node {
	int n_gpus; /* GPUs NVML reports */
	hd_gpu gpus[HD_GPUS_MAX];
	hd_reasons reasons;  /* node-level: GPU count, NVML missing */
	char nvml_down[256]; /* why NVML cannot be used ("no NVIDIA driver"); "" when it can */
	char xid_state_error[256];   /* the XID state file cannot be read; "" when it can */
	hd_reasons mounts;	     /* shared mounts missing (hd_mounts_check) */
	hd_state state;		     /* the worst of the node's and every GPU's */
	uint64_t healthy_since_usec; /* 0 while not healthy */
	uint64_t polls;
} hd_node;

/* ---- the checks (check.c) ---------------------------------------------
 *
 * Every health check is one row of one table: the function that judges a
 * sample, the values it shows (a dcgm-exporter metric and/or a key of the
 * --check --json output: output.c walks the table), the NVML entry points it
 * needs (nvml.c names the check when a driver lacks one), and a fault of the
 * fake NVML that trips it (tests/healthd runs every row's fault through the
 * real sampler).  Adding a check: docs/kiln-healthd.md, "Adding a check". */

typedef enum hd_value_type {
	HD_VALUE_UINT,	 /* unsigned */
	HD_VALUE_INT,	 /* int */
	HD_VALUE_U64,	 /* uint64_t */
	HD_VALUE_MIB,	 /* uint64_t bytes, shown in MiB */
	HD_VALUE_DOUBLE, /* double */
	HD_VALUE_BOOL,	 /* bool, shown as 0/1 (metrics) or false/true (JSON) */
} hd_value_type;

/* The value is there whatever the sample holds (hd_value.has). */
#define HD_VALUE_ALWAYS SIZE_MAX
/* Values per check: PCIe and NVLink show five. */
#define HD_CHECK_VALUES_MAX 6

typedef struct hd_value {
	const char *metric; /* Prometheus name (dcgm-exporter's where it has one); NULL: none */
	const char *help;   /* the metric's HELP text */
	const char *json;   /* key in the --check --json GPU object; NULL: none */
	hd_value_type type;
	size_t off; /* where it is in hd_gpu */
	size_t has; /* where its "was read" flag is in hd_gpu, or HD_VALUE_ALWAYS */
} hd_value;

typedef void (*hd_check_fn)(const hd_settings *s, const hd_sample *prev, const hd_sample *cur,
			    hd_reasons *out);

typedef struct hd_check {
	const char *name;     /* "temperature": "the temperature check" in logs and docs */
	hd_check_fn evaluate; /* adds its reasons; NULL: shown only (XIDs come as events) */
	bool gate;	      /* a reason from it ends the evaluation (nothing else is known) */
	const char *nvml;     /* NVML entry points it needs, space separated; NULL: none */
	const char *fault;    /* a fake NVML GPU setting that trips it ("temperature = 95;") */
	const char *reason;   /* the reason that fault gives on an otherwise healthy GPU */
	hd_value values[HD_CHECK_VALUES_MAX]; /* ends at the first without metric and json */
} hd_check;

const hd_check *hd_checks(size_t *ret_n);
/* The end of c->values: for (v = c->values; v < hd_check_values_end(c); v++) */
const hd_value *hd_check_values_end(const hd_check *c);
/* A value of g: false when the sample does not have it. */
bool hd_value_get(const hd_value *v, const hd_gpu *g, double *ret);

/* Records an XID on gpu: counts it and, for drain/reset/reboot actions, adds
 * a sticky unhealthy reason.  Returns the action. */
kiln_cfg_action hd_gpu_add_xid(const hd_settings *s, hd_gpu *g, int xid);
/* Adds the sticky unhealthy reason of a drain/reset/reboot XID to gpu
 * (once per XID number): "XID 79 GPU has fallen off the bus (reboot needed)".
 * Other actions add nothing. */
void hd_gpu_add_sticky_xid(hd_gpu *g, int xid, kiln_cfg_action a);
/* Re-evaluates every GPU and the node (after a poll, or an XID). */
void hd_node_evaluate(const hd_settings *s, hd_node *n, uint64_t now_usec);
/* The first unhealthy reason, as a Slurm drain reason: "kiln: gpu2 XID 79 ...". */
int hd_node_drain_reason(const hd_node *n, char *buf, size_t len);
/* One line for systemd STATUS=: "8 GPUs: 7 healthy, 1 unhealthy (gpu2 ...)". */
void hd_node_summary(const hd_node *n, char *buf, size_t len);

/* ---- shared mounts (mounts.c) ------------------------------------------ */

/* The node's mount table and root: PID 1's, not the daemon's own (its
 * unit's ProtectHome= covers /home with an empty mount, PrivateMounts=
 * gives it a namespace of its own).  /proc/1/mountinfo is readable by
 * all; /proc/1/root needs root. */
#define HD_MOUNTINFO_PATH "/proc/1/mountinfo"
#define HD_MOUNT_ROOT	  "/proc/1/root"
/* Another table (a test running the daemon in a node's namespace:
 * /proc/self/mountinfo). */
#define HD_MOUNTINFO_ENV "KILN_HEALTHD_MOUNTINFO"
/* A mount table of thousands of lines is a few hundred KB. */
#define HD_MOUNTINFO_MAX (4u * 1024u * 1024u)
/* Mounts probed with statfs() (more are only looked up in the table). */
#define HD_MOUNTS_MAX 64
typedef struct hd_mount_probe hd_mount_probe;
/* The statfs() probes between polls, one per mount at most (mounts.c). */
typedef struct hd_mounts_state {
	hd_mount_probe *inflight[HD_MOUNTS_MAX];
	bool wait; /* wait for each probe up to its timeout (--check: one poll) */
	/* /proc/1/root was refused (a unit without ptrace rights on PID 1):
	 * the mount points are probed as this daemon sees them */
	bool no_root;
} hd_mounts_state;
/* Sets out to a reason per mount of s->mounts whose mount point is not in
 * the mount table (s->mountinfo, else HD_MOUNTINFO_PATH): "mount /home
 * (head:/home nfs) missing"; with st, a mounted one whose statfs() probe
 * has run for its timeout is "not responding", one whose probe failed "not
 * accessible (ERROR)".  Unhealthy for a required mount, degraded otherwise;
 * one unhealthy reason when the table cannot be read.  Returns how many
 * are missing or dead, or -errno (the table unreadable). */
int hd_mounts_check(const hd_settings *s, hd_mounts_state *st, uint64_t now_usec, hd_reasons *out);
/* Whether hd_mounts_check() left no reason about mount m in r. */
bool hd_mount_ok(const hd_reasons *r, const kiln_cfg_mount *m);
/* Lets go of the probes in flight (a hung one frees itself when it returns). */
void hd_mounts_state_free(hd_mounts_state *st);

/* ---- XID state file (xidstate.c) --------------------------------------- */

/* Where the daemon keeps the XIDs that drain, across its own restarts
 * (RuntimeDirectory=kiln-healthd: cleared at reboot). */
#define HD_XID_STATE_PATH "/run/kiln-healthd/xid.state"
#define HD_XID_STATE_ENV  "KILN_HEALTHD_XID_STATE"
/* Entries kept: as many as every GPU can show sticky reasons (beyond that
 * an entry would add nothing; the XID is still logged and counted). */
#define HD_XID_STATE_MAX (HD_GPUS_MAX * HD_REASONS_MAX)

typedef struct hd_xid_entry {
	int gpu;				    /* index when it happened (informational) */
	char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE]; /* "" unknown: match by index */
	int xid;
	kiln_cfg_action action;
	int64_t time; /* CLOCK_REALTIME seconds */
} hd_xid_entry;

typedef struct hd_xid_state {
	hd_xid_entry v[HD_XID_STATE_MAX];
	int n;
} hd_xid_state;

/* Parses the file's text.  -EBADMSG: a malformed line, its number in
 * *ret_line. */
int hd_xid_state_parse(const char *text, hd_xid_state *st, int *ret_line);
/* Reads path.  -ENOENT: no file (nothing is drained); -EBADMSG: corrupt
 * (line in *ret_line, 0 when not text); other -errno: unreadable.  st is
 * only written on success. */
int hd_xid_state_load(const char *path, hd_xid_state *st, int *ret_line);
int hd_xid_state_format(const hd_xid_state *st, kiln_strbuf *b);
/* Writes path atomically (kiln_write_file_atomic). */
int hd_xid_state_save(const char *path, const hd_xid_state *st);
/* Adds an entry unless that GPU already has that XID.  Returns whether it
 * was added. */
bool hd_xid_state_add(hd_xid_state *st, int gpu, const char *uuid, int xid, kiln_cfg_action action,
		      int64_t time);
/* Removes the entries of which: "all", a GPU index ("2" or "gpu2") or a
 * UUID.  Returns how many were removed, -EINVAL for a malformed which. */
int hd_xid_state_clear(hd_xid_state *st, const char *which);
/* The GPU of n an entry belongs to (by UUID, else index), or -1. */
int hd_xid_state_find_gpu(const hd_xid_entry *x, const hd_node *n);
/* Replaces every GPU's sticky reasons with those of st's entries. */
void hd_xid_state_apply(const hd_xid_state *st, hd_node *n);

/* ---- output ------------------------------------------------------------ */

/* Prometheus text exposition, dcgm-exporter names and labels + kiln_*. */
int hd_metrics_render(const hd_node *n, const char *hostname, kiln_strbuf *b);
/* --check output. */
int hd_table_render(const hd_node *n, const char *hostname, kiln_strbuf *b);
int hd_json_render(const hd_node *n, const char *hostname, kiln_strbuf *b);

/* ---- NVML -------------------------------------------------------------- */

typedef struct hd_nvml hd_nvml;
/* Loads library (a path or soname) and calls nvmlInit.  Errors: -EPERM the
 * path is one a user other than root can change (kiln/pathtrust.h: the
 * file or a directory above it not root's, or group/world-writable), so it
 * is not loaded; -ENOENT the
 * library is missing (no driver), -ENOTSUP a required symbol is missing,
 * -EIO nvmlInit failed (the error string goes to err), -ETIMEDOUT nvmlInit
 * did not return within timeout_usec (its thread is abandoned). Logs warnings for
 * optional symbols that are missing (each disables one check). */
int hd_nvml_open(const char *library, uint64_t timeout_usec, hd_nvml **ret, char *err,
		 size_t errlen);
void hd_nvml_close(hd_nvml *m);
DEFINE_TRIVIAL_CLEANUP_FUNC(hd_nvml *, hd_nvml_close)
/* GPU count, under the timeout. */
int hd_nvml_count(hd_nvml *m, int *ret);
/* Polls GPU i into out (keeps the identity of out if the call fails).  A
 * call that times out is abandoned in its thread, recorded in
 * out->hung_call, and the GPU is not polled again until it returns. */
int hd_nvml_poll(hd_nvml *m, int i, hd_sample *out);
/* XID events: starts a thread that calls cb(gpu, xid, data) for each one. */
typedef void (*hd_xid_cb)(int gpu, int xid, void *data);
int hd_nvml_start_events(hd_nvml *m, hd_xid_cb cb, void *data);
/* Threads left behind by hung calls (for metrics). */
int hd_nvml_abandoned(hd_nvml *m);

/* ---- jobs (jobs.c) ------------------------------------------------------ */

/* The Slurm job id of process pid into buf: from its cgroup path
 * (".../job_123/step_0"), else SLURM_JOB_ID in its environment.  -ENOENT:
 * none found (not a job's process, or gone). */
int hd_job_of_pid(unsigned pid, char *buf, size_t len);
/* The distinct job ids of the processes on a GPU (s->pids), comma
 * separated, into buf ("" when none); cut to fit len. */
void hd_job_ids(const hd_sample *s, char *buf, size_t len);

/* ---- Slurm ------------------------------------------------------------- */

typedef struct hd_slurm hd_slurm;
/* Starts the thread that keeps the node's Slurm state in line with what
 * hd_slurm_want() asks for, retrying with backoff while slurmctld is down.
 * -ENOENT: no Slurm configuration (err->msg says what was looked for:
 * kiln_slurm_init()); without this check libslurm would exit the process. */
int hd_slurm_start(const char *node, hd_slurm **ret, kiln_error *err);
void hd_slurm_stop(hd_slurm *s);
/* drain: the node should be drained with reason (starting "kiln:").
 * !drain && resume_ok: kiln's own drain may be lifted. */
void hd_slurm_want(hd_slurm *s, bool drain, const char *reason, bool resume_ok);
/* 1 if the controller answered on the last attempt, 0 if not, -1 unknown. */
int hd_slurm_reachable(hd_slurm *s);

/* ---- active checks ----------------------------------------------------- */

typedef struct hd_active_result {
	const char *name;   /* "gemm", "bandwidth", "memtest" */
	const char *status; /* "passed", "failed", "skipped" */
	double value;	    /* TFLOP/s, GB/s, GiB tested */
	double expected;    /* what the model should reach; 0 unknown */
	char detail[HD_REASON_MAX];
} hd_active_result;
#define HD_ACTIVE_CHECKS 3
/* Runs the active checks on GPU gpu (-1: none present) through the
 * kiln-healthd-active program, within gemm_seconds + a fixed slack; the
 * memtest covers memtest_fraction of mem_free bytes (0: 1 GiB).  Without a
 * usable CUDA device every result is "skipped" with the reason in detail.
 * Returns 0, or -errno when the program cannot be started. */
int hd_active_run(const hd_settings *s, int gpu, const char *model, uint64_t mem_free,
		  hd_active_result out[HD_ACTIVE_CHECKS]);
