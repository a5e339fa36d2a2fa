/* kiln/config.h — libkiln-config: the one cluster file every kiln program reads.
 *
 * A cluster is described by ONE libconfig file (default /etc/kiln/cluster.cfg,
 * or $KILN_CONFIG, or -c FILE).  kiln_cfg_load() parses it into the typed,
 * public structs below, fills every unset key from the schema table
 * (kiln_cfg_schema(), also printed by `kiln show --defaults` and documented
 * in docs/config.md), and validates strictly: unknown keys, wrong types,
 * missing required keys, malformed values, duplicates, cross references.
 * Every problem is collected (not just the first) as
 *   FILE:LINE: setting.path: message[; hint]
 * so an admin fixes a whole file in one round.
 *
 * Durations are stored in microseconds (uint64_t, KILN_USEC_INFINITY for
 * "infinite"), IPv4 addresses in host byte order, memory sizes in MiB.
 * All strings are owned by the kiln_cfg; never NULL unless documented.
 * The structs are read-only for callers; fields are only ever added. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kiln/macro.h"
#include "kiln/strbuf.h"

#define KILN_CFG_DEFAULT_PATH "/etc/kiln/cluster.cfg"
#define KILN_CFG_ENV	      "KILN_CONFIG"
/* A cluster file is a few KB; 16 MiB bounds memory for any input. */
#define KILN_CFG_FILE_MAX (16u * 1024u * 1024u)
/* After this many errors the rest are dropped (a fuzzer or a binary file
 * could otherwise produce millions). */
#define KILN_CFG_ERRORS_MAX 200
/* gres.conf maps GPUs to /dev/nvidia0..15: no server has more than 16. */
#define KILN_CFG_GPUS_MAX 16
/* node_groups[].memory_mb: 64 TiB, the most any single-system-image server
 * ships with (HPE Superdome Flex); more is a unit mistake (bytes or KiB
 * written as MiB, "2P" for "2T") that Slurm would take and never schedule. */
#define KILN_CFG_MEMORY_MB_MAX (64ull * 1024 * 1024)
/* libconfig nests groups in lists; kiln's schema is 4 deep, allow slack but
 * bound recursion on hostile input. */
#define KILN_CFG_DEPTH_MAX 16

/* ---- errors ---------------------------------------------------------- */

typedef struct kiln_cfg_error {
	char *file; /* as passed to kiln_cfg_load() (or the name for _from_string) */
	int line;   /* 1-based; 0 when unknown */
	char *path; /* "health.thresholds.temp_warn_c", "node_groups[0].macs[2]"; "" for the file */
	char *message; /* "unknown setting" */
	char *hint;    /* "did you mean 'interval'?" or NULL */
	bool warning;  /* a warning: the file loads anyway ("FILE:LINE: path: warning: ...") */
} kiln_cfg_error;

typedef struct kiln_cfg_errors {
	kiln_cfg_error *v;
	size_t n, cap;
	size_t dropped; /* errors beyond KILN_CFG_ERRORS_MAX */
} kiln_cfg_errors;

void kiln_cfg_errors_init(kiln_cfg_errors *e);
void kiln_cfg_errors_free(kiln_cfg_errors *e); /* contents, not e */
/* Appends "FILE:LINE: path: message; hint\n" to b (no "LINE:" when 0). */
int kiln_cfg_error_format(const kiln_cfg_error *err, kiln_strbuf *b);
/* Prints every error, one per line, to f. */
void kiln_cfg_errors_print(const kiln_cfg_errors *e, FILE *f);
static inline void kiln_cfg_errors_freep(kiln_cfg_errors *e)
{
	kiln_cfg_errors_free(e);
}

/* ---- enums ----------------------------------------------------------- */

typedef enum kiln_cfg_action {
	KILN_ACTION_IGNORE, /* count it, do nothing */
	KILN_ACTION_APP,    /* an application fault: the job's problem, not the node's */
	KILN_ACTION_DRAIN,  /* drain the node in Slurm with a reason */
	KILN_ACTION_RESET,  /* drain, then GPU reset when idle */
	KILN_ACTION_REBOOT, /* drain, then reboot when idle */
	_KILN_ACTION_MAX,
} kiln_cfg_action;
const char *kiln_cfg_action_to_string(kiln_cfg_action a);

typedef enum kiln_cfg_quant {
	KILN_QUANT_NONE,
	KILN_QUANT_INT8,
	KILN_QUANT_INT4,
	_KILN_QUANT_MAX,
} kiln_cfg_quant;
const char *kiln_cfg_quant_to_string(kiln_cfg_quant q);

/* kiln-inferd's words (inference.backend, .dtype, .chat_template): the
 * program parses the string the same way as its --backend, --dtype and
 * --chat-template, so the file and the flags take the same words. */
typedef enum kiln_cfg_backend {
	KILN_BACKEND_CPU,
	KILN_BACKEND_CUDA,
	KILN_BACKEND_AUTO,
	_KILN_BACKEND_MAX
} kiln_cfg_backend;
const char *kiln_cfg_backend_to_string(kiln_cfg_backend b);
typedef enum kiln_cfg_dtype {
	KILN_DTYPE_F32,
	KILN_DTYPE_BF16,
	KILN_DTYPE_F16,
	KILN_DTYPE_I8,
	KILN_DTYPE_Q4,
	KILN_DTYPE_AUTO, /* what the model file holds (kiln-inferd decides) */
	_KILN_DTYPE_MAX,
} kiln_cfg_dtype;
const char *kiln_cfg_dtype_to_string(kiln_cfg_dtype d);
typedef enum kiln_cfg_chat {
	KILN_CHAT_AUTO, /* detected from the tokenizer, else chatml */
	KILN_CHAT_CHATML,
	KILN_CHAT_LLAMA2,
	KILN_CHAT_LLAMA3,
	KILN_CHAT_MISTRAL,
	KILN_CHAT_GEMMA,
	KILN_CHAT_PHI3,
	KILN_CHAT_ZEPHYR,
	_KILN_CHAT_MAX,
} kiln_cfg_chat;
const char *kiln_cfg_chat_to_string(kiln_cfg_chat c);

typedef enum kiln_cfg_part_state {
	KILN_PART_UP,
	KILN_PART_DOWN,
	KILN_PART_DRAIN,
	KILN_PART_INACTIVE,
	_KILN_PART_STATE_MAX,
} kiln_cfg_part_state;
const char *
kiln_cfg_part_state_to_string(kiln_cfg_part_state s); /* "UP" ... as slurm.conf spells it */

/* ---- sections -------------------------------------------------------- */

typedef struct kiln_cfg_cluster {
	char *name;   /* required; [a-z0-9_-], also the default Slurm ClusterName */
	char *domain; /* DNS domain, NULL when unset */
} kiln_cfg_cluster;

typedef struct kiln_cfg_network {
	uint32_t subnet;  /* network address, host order */
	int prefix;	  /* 8..30 */
	uint32_t netmask; /* derived from prefix */
	uint32_t gateway; /* default: head.address */
	uint32_t *dns;	  /* n_dns servers; default: head.address */
	size_t n_dns;
	int mtu;	      /* 1500 */
	char *boot_interface; /* head-side interface dnsmasq serves: "eth0" */
} kiln_cfg_network;

typedef struct kiln_cfg_head {
	char *hostname;	  /* required */
	uint32_t address; /* required, inside network.subnet */
} kiln_cfg_head;

struct kiln_cfg_group;

/* One compute node, flattened out of its group (cfg->nodes, in file order). */
typedef struct kiln_cfg_node {
	char *name;	  /* "node02" */
	uint32_t address; /* host order */
	uint8_t mac[6];
	size_t index_in_group;		    /* 0-based */
	const struct kiln_cfg_group *group; /* GPUs, CPUs, memory, features */
	char **partitions; /* names of every partition the node is in (NULL-terminated) */
	bool inference;	   /* runs kiln-inferd (inference.enabled and in inference.nodes) */
} kiln_cfg_node;

typedef struct kiln_cfg_group {
	char *name;	  /* required, a label ("dgx", "compute") */
	char *hosts;	  /* required hostlist as written: "node[01-03]" */
	char **hostnames; /* expanded, n_hosts (NULL-terminated) */
	size_t n_hosts;
	uint32_t *addresses; /* n_hosts: a range "10.0.0.11-10.0.0.42" or a list */
	uint8_t (*macs)[6];  /* n_hosts, required, one per host */
	char *gpu_model;     /* gpus.model: "NVIDIA H100 80GB HBM3"; NULL without GPUs */
	char *gpu_type; /* gpus.type: short Gres type "h100" (derived from the model unless set) */
	int gpu_count;	/* gpus.count: 0..KILN_CFG_GPUS_MAX */
	int cpus;	/* 1 */
	int sockets;	/* 1 */
	int cores_per_socket; /* 1 */
	int threads_per_core; /* 1 */
	uint64_t memory_mb;   /* RealMemory; 1024 */
	char **partitions;    /* partition names this group joins (NULL-terminated, may be empty) */
	char **features;      /* Slurm node features (NULL-terminated, may be empty) */
	int line;
	char *gpu_socket_map; /* gpus.socket_map as written, NULL when unset */
	/* socket of GPU i (from gpu_socket_map or the even split); -1: no
	 * affinity rendered */
	int gpu_socket[KILN_CFG_GPUS_MAX];
} kiln_cfg_group;

typedef struct kiln_cfg_partition {
	char *name;  /* required */
	char *nodes; /* hostlist as written, NULL when the members come from node_groups.partitions
		      */
	char **members; /* every node in it (explicit + groups naming it), file order,
			   NULL-terminated */
	size_t n_members;
	bool is_default;	   /* "default" */
	uint64_t max_time_usec;	   /* KILN_USEC_INFINITY by default */
	kiln_cfg_part_state state; /* UP */
	char *extra; /* passthrough appended to the PartitionName line, NULL when unset */
	int line;
} kiln_cfg_partition;

typedef struct kiln_cfg_slurm {
	char *cluster_name; /* default: cluster.name */
	int control_port;   /* SlurmctldPort, 6817 */
	int slurmd_port;    /* SlurmdPort, 6818 */
	kiln_cfg_partition *partitions;
	size_t n_partitions;
	uint64_t slurmd_timeout_usec;	  /* 300s */
	uint64_t message_timeout_usec;	  /* 10s */
	uint64_t resume_timeout_usec;	  /* 600s */
	uint64_t kill_wait_usec;	  /* 30s */
	uint64_t unkillable_timeout_usec; /* 120s */
	int return_to_service;		  /* 2 */
	char *user;			  /* SlurmUser, "slurm" */
	char *state_dir;		  /* StateSaveLocation */
	char *spool_dir;		  /* SlurmdSpoolDir */
	char *log_dir;			  /* slurmctld.log / slurmd.log */
	char *run_dir;			  /* pid files */
	char *select_type;		  /* "cons_tres" (select/ prefix added) */
	char *proctrack_type;		  /* "cgroup" */
	char *task_plugin;		  /* "affinity,cgroup" */
	char **extra; /* passthrough lines appended to slurm.conf (NULL-terminated) */
	uint64_t def_mem_per_gpu_mb; /* DefMemPerGPU; derived from the GPU groups (0: no GPUs) */
	int def_cpu_per_gpu;	     /* DefCpuPerGPU; derived likewise (0: no GPUs) */
	char *reboot_program;	     /* RebootProgram, "/usr/sbin/reboot" */
	bool configless;	     /* SlurmctldParameters=enable_configless, true */
} kiln_cfg_slurm;

typedef struct kiln_cfg_xid {
	int xid; /* 1..999 */
	kiln_cfg_action action;
	int line;
} kiln_cfg_xid;

typedef struct kiln_cfg_thresholds {
	int temp_warn_c;	       /* 85 */
	int temp_max_c;		       /* 0 = the GPU's own slowdown temperature */
	int power_warn_pct;	       /* % of the enforced power limit, 105 */
	int ecc_sbe_warn;	       /* volatile single-bit ECC errors, 1000 */
	int pcie_replay_warn_per_min;  /* 100 */
	kiln_cfg_action remap_pending; /* rows waiting for remap: DRAIN (needs a reset) */
	kiln_cfg_action remap_failure; /* row remapping failed: DRAIN */
} kiln_cfg_thresholds;

typedef struct kiln_cfg_health {
	bool enabled;		     /* true: kiln-healthd runs on every node */
	uint64_t interval_usec;	     /* 10s poll */
	uint64_t recover_after_usec; /* 300s healthy before resume */
	int metrics_port;	     /* 9400 */
	char *metrics_address;	     /* "0.0.0.0" */
	char *nvml_library;	     /* "libnvidia-ml.so.1" */
	uint64_t nvml_timeout_usec;  /* 5s */
	uint64_t watchdog_usec;	     /* 30s, 0 = off */
	bool drain;		     /* true: drain/resume nodes in Slurm */
	kiln_cfg_thresholds thresholds;
	kiln_cfg_xid *xids; /* overrides of the built-in XID table */
	size_t n_xids;
	bool active_on_start;	       /* true */
	uint64_t active_interval_usec; /* 0 = off */
	int gemm_seconds;	       /* 10 */
	double memtest_fraction;       /* 0.05 of GPU memory */
	char *check_program;	       /* HealthCheckProgram */
	char *prolog;
	char *epilog;
	uint64_t health_check_interval_usec; /* HealthCheckInterval, 300s */
} kiln_cfg_health;

typedef struct kiln_cfg_launcher {
	int port;		    /* 29500 rendezvous */
	int nnodes_min, nnodes_max; /* "1:1"; "N" means N:N */
	int nproc_per_node;	    /* 0 = one per GPU ("gpu") */
	int max_restarts;	    /* 3 */
	uint64_t heartbeat_usec;    /* 1s */
	uint64_t dead_after_usec;   /* 5s */
	uint64_t last_call_usec;    /* 10s */
	uint64_t join_timeout_usec; /* 300s */
	uint64_t grace_usec;	    /* 120s SIGTERM -> SIGKILL */
	int exclude_after_failures; /* 2 */
	bool prefix_output;	    /* true */
	bool health_check;	    /* true */
} kiln_cfg_launcher;

/* One model kiln-inferd serves (inference.models[], or the flat
 * inference.model shorthand as a one-element list).  Keys an element leaves
 * out take the section's flat key of the same name (derive.c). */
typedef struct kiln_cfg_model {
	char *name;		     /* the API name; unset: the path's base name */
	char *path;		     /* required */
	char *tokenizer;	     /* NULL: inference.tokenizer, else the model's own */
	kiln_cfg_dtype dtype;	     /* inference.dtype */
	kiln_cfg_chat chat_template; /* inference.chat_template */
	int context_length;	     /* inference.context_length; 0 = the model's */
	int kv_blocks;		     /* inference.kv_blocks (unless kv_cache_mb) */
	uint64_t kv_cache_mb;	     /* 0: kv_blocks sizes the cache */
	int line;
} kiln_cfg_model;

typedef struct kiln_cfg_inference {
	bool enabled;		     /* false */
	int port;		     /* 8000 */
	char *address;		     /* "127.0.0.1" */
	char *model;		     /* model path, NULL when unset (required when enabled) */
	char *nodes;		     /* hostlist or a partition name, NULL = every node */
	int max_batch;		     /* 32 */
	int kv_block_size;	     /* 16 tokens */
	uint64_t kv_cache_mb;	     /* 0 = auto */
	kiln_cfg_quant quant;	     /* none */
	char *name;		     /* the model's API name; NULL = the path's base name */
	char *tokenizer;	     /* NULL = the model's own (GGUF) */
	kiln_cfg_backend backend;    /* cpu */
	kiln_cfg_dtype dtype;	     /* f32 */
	kiln_cfg_chat chat_template; /* auto */
	int context_length;	     /* 0 = the model's */
	int kv_blocks;		     /* 1024 */
	int max_running;	     /* 64 */
	int max_waiting;	     /* 1024 */
	uint64_t drain_grace_usec;   /* 30s */
	/* every model served: inference.models, or one from the flat keys
	 * (inference.model ...); empty without either */
	kiln_cfg_model *models;
	size_t n_models;
	uint64_t memory_mb;  /* 0: the node's limit (cpu), none (cuda) */
	char *api_keys_file; /* NULL: no keys, every request is served */
	bool metrics_auth;   /* /metrics needs a key too */
	int cpu_threads;     /* 0 = the CPUs of the affinity mask / cgroup quota */
	/* AllowGroups= of every partition that holds an inference node:
	 * kiln-inferd uses those nodes' GPUs outside Slurm (NULL-terminated;
	 * [ "root" ] by default, [ "ALL" ] leaves them open) */
	char **allow_groups;
} kiln_cfg_inference;

typedef struct kiln_cfg_image {
	char *base;	      /* Debian suite, "bookworm" */
	char *mirror;	      /* "http://deb.debian.org/debian" */
	char **packages;      /* extra packages (NULL-terminated) */
	char *output_dir;     /* "/var/lib/kiln/image": where make image writes and HTTP serves */
	char *tftp_dir;	      /* "/srv/kiln/tftp": undionly.kpxe, ipxe.efi */
	char *http_url;	      /* default "http://HEAD_ADDRESS/kiln" */
	char *kernel_cmdline; /* extra kernel arguments, "" */
	char **ssh_keys;	    /* root's authorized_keys lines (NULL-terminated) */
	char *munge_key;	    /* head's munge key, served to nodes (never in the image) */
	char *signing_key;	    /* signs cluster.cfg, "/etc/kiln/head.key" */
	bool nvidia;		    /* GPU image: NVIDIA driver + CUDA runtime */
	char *nvidia_apt_source;    /* "URL SUITE [COMPONENTS]" of NVIDIA's repository, or NULL */
	char *nvidia_apt_keyring;   /* its keyring on the build machine */
	char *nvidia_debs;	    /* directory of driver .debs, or NULL */
	char **nvidia_packages;	    /* NULL: the source's defaults (render image-env) */
	char *nvidia_fabricmanager; /* Fabric Manager package (HGX), or NULL */
	char *nvidia_cuda_dir;	    /* "/usr/local/cuda": CUDA libraries copied from there */
	/* kiln serve (docs/serve.md) */
	char *serve_listen;	     /* "ADDR:PORT"; NULL: http_url's host and port */
	bool secrets_only_when_down; /* secrets only to nodes Slurm lists down or rebooting */
	char *root_password_file;    /* head-side file holding root's hash; NULL: none */
} kiln_cfg_image;

/* Thresholds of the Prometheus alert rules `kiln render kiln-alerts.yml`
 * writes (docs/monitoring.md). */
typedef struct kiln_cfg_monitoring {
	uint64_t scrape_interval_usec;	/* 15s */
	uint64_t drained_for_usec;	/* 30m: KilnNodeDrained */
	uint64_t throttle_for_usec;	/* 10m: KilnGPUThermalThrottling */
	uint64_t healthd_down_for_usec; /* 5m: KilnHealthdDown */
	int queue_waiting;		/* 512: KilnInferenceQueueSaturated */
	uint64_t ttft_p99_usec;		/* 2s: KilnInferenceTTFTHigh */
} kiln_cfg_monitoring;

/* What the nodes do with their journal and clock (kiln-node-init). */
typedef struct kiln_cfg_logging {
	bool forward; /* systemd-journal-upload to the head, true */
	char *url;    /* systemd-journal-remote's URL; NULL: http://HEAD_ADDRESS:19532 */
} kiln_cfg_logging;

typedef struct kiln_cfg_time {
	bool sync;	/* systemd-timesyncd, true */
	char **servers; /* NTP servers (NULL-terminated); empty: the head node's address */
} kiln_cfg_time;

/* Slurm accounting through slurmdbd (slurmdbd.conf, AccountingStorage* in
 * slurm.conf); off unless storage_host names the database server. */
typedef struct kiln_cfg_accounting {
	char *storage_host;	     /* MariaDB/MySQL server (StorageHost); NULL: accounting off */
	int storage_port;	     /* StoragePort, 3306 */
	char *storage_user;	     /* StorageUser, "slurm" */
	char *storage_password_file; /* the file holding StoragePass; never the password itself */
	char *storage_loc;	     /* StorageLoc (database name), "slurm_acct_db" */
	char *dbd_host;		     /* where slurmdbd runs (DbdHost, AccountingStorageHost);
					derived: head.hostname */
	int dbd_port;		     /* DbdPort, AccountingStoragePort, 6819 */
} kiln_cfg_accounting;

/* One switch of the Slurm tree topology (topology.conf): a leaf switch
 * lists nodes, a higher one lists switches. */
typedef struct kiln_cfg_switch {
	char *name;	/* SwitchName, required */
	char *nodes;	/* hostlist of nodes as written (a leaf), NULL when unset */
	char *switches; /* hostlist of child switch names as written, NULL when unset */
	int line;
} kiln_cfg_switch;

/* ---- users, groups and shared storage (users[], groups[], mounts[]) ----
 * The same accounts on every node and the head (kiln render sysusers: a
 * sysusers.d file with fixed ids, no passwords) and the shared filesystems
 * every node mounts (kiln render mounts: systemd mount units ordered before
 * slurmd; kiln-healthd drains a node that lacks a required one). */

/* Ids below this are Debian's system accounts (the image's own daemons:
 * munge, slurm ...): a cluster user or group there needs system = true. */
#define KILN_CFG_ID_SYSTEM_MAX 999
/* Debian reserves 60000-64999, systemd's DynamicUser= takes 61184-65519,
 * 65534 is nobody and 65535 the 16-bit -1: no cluster account there. */
#define KILN_CFG_ID_RESERVED_FIRST 60000
#define KILN_CFG_ID_RESERVED_LAST  65535

typedef struct kiln_cfg_user {
	char *name;    /* required: a POSIX login name */
	int uid;       /* required */
	int gid;       /* primary group: a gid of groups[], or the uid (derived: the user's own
			  group, named after the user) */
	char **groups; /* supplementary groups, names of groups[] (NULL-terminated) */
	char *home;    /* derived: /home/NAME */
	char *shell;   /* "/bin/bash" */
	char *comment; /* GECOS, NULL when unset */
	bool system;   /* an id below 1000 on purpose */
	int line;
} kiln_cfg_user;

typedef struct kiln_cfg_unix_group {
	char *name; /* required */
	int gid;    /* required */
	bool system;
	int line;
} kiln_cfg_unix_group;

typedef struct kiln_cfg_mount {
	char *what;    /* required: "head:/home", "/dev/sdb1", "tmpfs" */
	char *where;   /* required: absolute, normalized ("/home") */
	char *type;    /* "nfs" */
	char *options; /* Options=, NULL when unset */
	bool required; /* true: a node without it is drained (kiln-healthd) */
	int line;
	uint64_t timeout_usec; /* kiln-healthd's statfs() probe: slower is "not responding" */
} kiln_cfg_mount;

typedef struct kiln_cfg {
	char *path; /* the file it came from */
	kiln_cfg_cluster cluster;
	kiln_cfg_network network;
	kiln_cfg_head head;
	kiln_cfg_group *groups;
	size_t n_groups;
	kiln_cfg_node *nodes; /* every node of every group, file order */
	size_t n_nodes;
	kiln_cfg_slurm slurm;
	kiln_cfg_health health;
	kiln_cfg_launcher launcher;
	kiln_cfg_inference inference;
	kiln_cfg_image image;
	kiln_cfg_monitoring monitoring;
	kiln_cfg_switch *switches; /* topology.switches, file order; none: no topology.conf */
	size_t n_switches;
	kiln_cfg_accounting accounting;
	kiln_cfg_logging logging;
	kiln_cfg_time time;
	kiln_cfg_user *users; /* users[], file order */
	size_t n_users;
	kiln_cfg_unix_group *unix_groups; /* groups[], file order */
	size_t n_unix_groups;
	kiln_cfg_mount *mounts; /* mounts[], file order */
	size_t n_mounts;
} kiln_cfg;

/* ---- loading --------------------------------------------------------- */

/* Loads and validates path.  Returns 0 and *ret on success.  Errors:
 *   -EINVAL  the file has problems, every one of them appended to errs
 *            (errs may be NULL to only get the status);
 *   -ENOENT, -EACCES, -EFBIG ... the file cannot be read (nothing in errs);
 *   -ENOMEM. */
int kiln_cfg_load(const char *path, kiln_cfg **ret, kiln_cfg_errors *errs);
/* Same for an in-memory text; name is used as FILE in messages. */
int kiln_cfg_load_string(const char *text, const char *name, kiln_cfg **ret, kiln_cfg_errors *errs);
/* A kiln_cfg holding the schema's defaults and nothing else: every key with
 * a default in kiln_cfg_schema() set to it, exactly as loading a file that
 * leaves the key out does; required keys, lists (nodes, partitions, XIDs)
 * and the defaults the schema writes in parentheses (derived from other
 * keys) stay unset (NULL or 0).  For a program running without a cluster
 * file, so that its settings still come from the schema (kiln-healthd).
 * Returns 0, or -ENOMEM. */
int kiln_cfg_defaults(kiln_cfg **ret);
/* $KILN_CONFIG or KILN_CFG_DEFAULT_PATH, for programs without -c. */
const char *kiln_cfg_default_path(void);

/* The one cluster-file lookup of every kiln program (config/lib/program.c, the
 * program edge: it prints).  The file is `path` (-c) if given, else
 * $KILN_CONFIG, else KILN_CFG_DEFAULT_PATH.  On errors in the file every one
 * is printed to stderr (FILE:LINE: setting: message; hint), followed, unless
 * KILN_CFG_OPEN_NO_HINT, by "FILE has errors (listed above); fix them and
 * check with 'kiln check -c FILE'."; a file that cannot be read gets one
 * error line saying what to do.
 * KILN_CFG_OPEN_OPTIONAL: no -c and no $KILN_CONFIG and nothing at the
 * default path is not an error: returns 0 with *ret = NULL (the caller says
 * what it does without a file).
 * Returns 0; -EINVAL for a missing, too large or invalid file (printed:
 * exit KILN_EXIT_USAGE); another -errno when it cannot be read (logged: exit
 * KILN_EXIT_FAILURE); kiln_exit_for_config() in kiln/prog.h maps these. */
enum {
	KILN_CFG_OPEN_OPTIONAL = 1 << 0,
	KILN_CFG_OPEN_NO_HINT = 1 << 1, /* kiln check: the error lines are the whole output */
	/* a valid file's warnings are printed to stderr too, and kiln_cfg_open()
	 * returns how many (>= 0) instead of 0 */
	KILN_CFG_OPEN_WARNINGS = 1 << 2,
};
int kiln_cfg_open(const char *path, unsigned flags, kiln_cfg **ret);

void kiln_cfg_free(kiln_cfg *cfg);
DEFINE_TRIVIAL_CLEANUP_FUNC(kiln_cfg *, kiln_cfg_free)

/* ---- lookups --------------------------------------------------------- */

/* The node called name, or NULL. */
const kiln_cfg_node *kiln_cfg_find_node(const kiln_cfg *cfg, const char *name);
/* The node with this MAC, or NULL. */
const kiln_cfg_node *kiln_cfg_find_node_by_mac(const kiln_cfg *cfg, const uint8_t mac[6]);
const kiln_cfg_partition *kiln_cfg_find_partition(const kiln_cfg *cfg, const char *name);
/* The action for an XID: the health.xid override if any, else def. */
kiln_cfg_action kiln_cfg_xid_action(const kiln_cfg *cfg, int xid, kiln_cfg_action def);

/* Calls fn(key, path, userdata) for every program or library the file
 * makes a node run as root (or as a job's user) by path: health.nvml_library
 * (when it is a path, not a bare soname ld.so finds in the system's
 * directories), health.check_program, .prolog and .epilog (with
 * health.enabled), slurm.reboot_program, and the program keys of
 * slurm.extra lines (Prolog, Epilog, TaskProlog, TaskEpilog,
 * HealthCheckProgram, RebootProgram, UnkillableStepProgram; key is then
 * "slurm.extra[N]").  These must be root's (kiln check --node-paths,
 * kiln/pathtrust.h).  Stops at and returns fn's first negative value;
 * else 0. */
int kiln_cfg_for_each_code_path(const kiln_cfg *cfg,
				int (*fn)(const char *key, const char *path, void *userdata),
				void *userdata);
/* Iterate: for (const kiln_cfg_node *n = cfg->nodes; n < cfg->nodes + cfg->n_nodes; n++) */

/* ---- schema ---------------------------------------------------------- */

typedef enum kiln_cfg_type {
	KILN_CFG_STRING,
	KILN_CFG_INT,
	KILN_CFG_BOOL,
	KILN_CFG_DOUBLE,
	KILN_CFG_DURATION, /* "10s", "5m", "infinite", or an integer in the key's unit */
	KILN_CFG_SIZE_MB,  /* "2T", "80G", or an integer in MiB */
	KILN_CFG_IPV4,
	KILN_CFG_CIDR,
	KILN_CFG_HOSTLIST,
	KILN_CFG_PATH, /* absolute path */
	KILN_CFG_ENUM,
	KILN_CFG_STRV, /* an array of strings */
	KILN_CFG_IPV4_LIST,
	KILN_CFG_ADDRESSES, /* "A-B" range or an array of addresses */
	KILN_CFG_MACS,	    /* an array of MACs */
	KILN_CFG_NNODES,    /* "MIN:MAX" or N */
	KILN_CFG_NPROC,	    /* "gpu" or N */
	KILN_CFG_GROUP,	    /* a { } group */
	KILN_CFG_LIST,	    /* a ( {..}, {..} ) list of groups */
	_KILN_CFG_TYPE_MAX,
} kiln_cfg_type;
const char *kiln_cfg_type_to_string(kiln_cfg_type t);

/* One key of the cluster file.  Paths use "[]" for list elements:
 * "node_groups[].gpus.count". */
typedef struct kiln_cfg_key {
	const char *path;
	kiln_cfg_type type;
	bool required;
	const char *def; /* default as the user would write it; NULL = none (derived or unset) */
	const char *example;
	const char *doc;
	/* Internal: where and how it is stored; callers do not use these. */
	int base;
	size_t offset;
	int64_t min, max;
	const char *const *choices; /* for ENUM */
} kiln_cfg_key;

/* The schema table: every key, in documentation order. */
const kiln_cfg_key *kiln_cfg_schema(size_t *ret_n);

/* ---- rendering ------------------------------------------------------- */

/* What a render target is, besides its name (kiln_cfg_render_target.flags). */
enum {
	KILN_CFG_RENDER_PER_NODE = 1 << 0,   /* one file per node: needs a node (node-env) */
	KILN_CFG_RENDER_SLURM = 1 << 1,	     /* served by slurmctld, configless (kiln apply) */
	KILN_CFG_RENDER_BOOT = 1 << 2,	     /* boot chain and names: reloaded by hand */
	KILN_CFG_RENDER_PROMETHEUS = 1 << 3, /* one of `kiln render prometheus -o DIR` */
	/* per node, named by MAC: render all writes DIR/ipxe/MAC (hexhyp) for
	 * every node (not the head node), the path boot.ipxe asks for */
	KILN_CFG_RENDER_BY_MAC = 1 << 4,
	/* several files (mounts: one unit per mount): -o names a directory,
	 * each file of the text starts at a line KILN_CFG_RENDER_FILE_MARK NAME
	 * (not written into the file); `render all` puts them in DIR/TARGET/ */
	KILN_CFG_RENDER_FILES = 1 << 5,
};
#define KILN_CFG_RENDER_FILE_MARK "# kiln-render-file: "

/* The render targets, in one table that kiln_cfg_render(), `kiln render`
 * (its targets, --help, completion, `render all`) and `kiln apply` read.
 * The target's name is its file name (a per-node target's files are
 * DIR/NAME/NODE; a by-MAC target's DIR/ipxe/MAC). */
typedef struct kiln_cfg_render_target {
	const char *name;
	const char *summary; /* one line for --help */
	unsigned mode;	     /* of the written file: 0600 when it holds a secret */
	unsigned flags;	     /* KILN_CFG_RENDER_* */
	/* renders into b; node only for KILN_CFG_RENDER_PER_NODE */
	int (*render)(const kiln_cfg *cfg, const char *node, kiln_strbuf *b);
} kiln_cfg_render_target;

/* The longest table there may be (callers size arrays by it). */
#define KILN_CFG_RENDER_TARGETS_MAX 24
/* Ends with a row whose name is NULL. */
extern const kiln_cfg_render_target kiln_cfg_render_targets[];
/* The target called name, or NULL. */
const kiln_cfg_render_target *kiln_cfg_render_target_find(const char *name);

/* Renders target (a name of kiln_cfg_render_targets).  slurmdbd.conf reads
 * accounting.storage_password_file: -ENOENT, -EACCES ... when it cannot,
 * -EBADMSG when the password is empty or holds a control character;
 * topology.conf without switches is -ENODATA.  Otherwise output is a pure
 * function of cfg (no time stamps) and starts with a "generated by kiln
 * from FILE" comment.  Returns 0 and a malloc'd string; -EINVAL unknown
 * target or node missing for a per-node target; -ENXIO unknown node;
 * -ENOMEM. */
int kiln_cfg_render(const kiln_cfg *cfg, const char *target, const char *node, char **ret);

/* ---- comparing ------------------------------------------------------ */

/* The schema paths of the scalar keys (node groups and partitions aside)
 * whose loaded values differ between a and b, in schema order, plus
 * "health.xid" when the XID overrides differ and "users", "groups", "mounts"
 * when those lists do: `kiln apply` maps each to what
 * must be restarted.  *ret is a NULL-terminated strv (NULL when nothing
 * differs).  Returns 0, -EINVAL or -ENOMEM. */
int kiln_cfg_diff_keys(const kiln_cfg *a, const kiln_cfg *b, char ***ret);

/* Short Gres type from a GPU model: "NVIDIA H100 80GB HBM3" -> "h100",
 * "NVIDIA A100-SXM4-80GB" -> "a100".  Returns a malloc'd string or NULL. */
char *kiln_cfg_gpu_type_from_model(const char *model);
