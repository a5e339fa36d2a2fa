/* schema.c — the ONE table of cluster-file keys.
 *
 * Every key the cluster file accepts is a row here: its path, type, default,
 * an example, what it means, and where it is stored.  The loader applies the
 * defaults and rejects keys not in the table (with "did you mean"), `kiln show
 * --defaults` prints it, and a test checks docs/config.md against it, so the
 * three can never drift apart.  Defaults written in parentheses, such as
 * "(cluster.name)", are derived after loading and only described here. */
#include <stddef.h>

#include "config-internal.h"

/* Where the install puts the Slurm scripts (slurm/scripts): the Makefile
 * passes $(PREFIX)/libexec/kiln, so a Debian package (PREFIX=/usr) renders
 * Prolog=/usr/libexec/kiln/prolog; builds without it keep /usr/local. */
#ifndef KILN_LIBEXECDIR
#define KILN_LIBEXECDIR "/usr/local/libexec/kiln"
#endif

static const char *const action_names[] = { "ignore", "app", "drain", "reset", "reboot", NULL };
static const char *const quant_names[] = { "none", "int8", "int4", NULL };
static const char *const state_names[] = { "up", "down", "drain", "inactive", NULL };
/* kiln-inferd's --backend, --dtype and --chat-template words, in the order
 * of kiln_cfg_backend, kiln_cfg_dtype and kiln_cfg_chat. */
static const char *const backend_names[] = { "cpu", "cuda", "auto", NULL };
static const char *const dtype_names[] = { "f32", "bf16", "f16", "i8", "q4", "auto", NULL };
static const char *const chat_names[] = { "auto",  "chatml", "llama2", "llama3", "mistral",
					  "gemma", "phi3",   "zephyr", NULL };

#define R(f)	    BASE_ROOT, offsetof(kiln_cfg, f)
#define G(f)	    BASE_GROUP, offsetof(kiln_cfg_group, f)
#define P(f)	    BASE_PART, offsetof(kiln_cfg_partition, f)
#define X(f)	    BASE_XID, offsetof(kiln_cfg_xid, f)
#define SW(f)	    BASE_SWITCH, offsetof(kiln_cfg_switch, f)
#define M(f)	    BASE_MODEL, offsetof(kiln_cfg_model, f)
#define U(f)	    BASE_USER, offsetof(kiln_cfg_user, f)
#define UG(f)	    BASE_UGROUP, offsetof(kiln_cfg_unix_group, f)
#define MT(f)	    BASE_MOUNT, offsetof(kiln_cfg_mount, f)
#define NOF	    BASE_NONE, 0
#define PORT	    1, 65535, NULL
#define NR	    0, 0, NULL
#define RANGE(a, b) a, b, NULL

static const kiln_cfg_key schema[] = {
	{ "cluster", KILN_CFG_GROUP, true, NULL, NULL, "The cluster's identity.", NOF, NR },
	{ "cluster.name", KILN_CFG_STRING, true, NULL, "\"demo\"",
	  "Cluster name: 1 to 63 lowercase letters, digits, '-' and '_'. Also Slurm's ClusterName "
	  "unless "
	  "slurm.cluster_name is set.",
	  R(cluster.name), NR },
	{ "cluster.domain", KILN_CFG_STRING, false, NULL, "\"demo.kiln\"",
	  "DNS domain of the cluster network (RFC 1123: dot-separated labels of 1 to 63 letters, "
	  "digits and '-', none starting or ending with '-'; no final dot); hosts get NAME.DOMAIN "
	  "aliases and DHCP hands it out.",
	  R(cluster.domain), NR },

	{ "network", KILN_CFG_GROUP, true, NULL, NULL, "The cluster (boot) network.", NOF, NR },
	{ "network.subnet", KILN_CFG_CIDR, true, NULL, "\"10.77.0.0/24\"",
	  "The cluster network in CIDR form (prefix 8..30). Every address in the file must lie "
	  "inside it.",
	  R(network.subnet), NR },
	{ "network.gateway", KILN_CFG_IPV4, false, "(head.address)", "\"10.77.0.1\"",
	  "Default route handed to nodes by DHCP.", R(network.gateway), NR },
	{ "network.dns", KILN_CFG_IPV4_LIST, false, "(head.address)", "[ \"10.77.0.1\" ]",
	  "DNS servers handed to nodes by DHCP.", R(network.dns), NR },
	{ "network.mtu", KILN_CFG_INT, false, "1500", "9000", "MTU handed to nodes by DHCP.",
	  R(network.mtu), RANGE(576, 9216) },
	{ "network.boot_interface", KILN_CFG_STRING, false, "\"eth0\"", "\"enp1s0\"",
	  "The head node's interface on the cluster network; dnsmasq serves DHCP/TFTP only there.",
	  R(network.boot_interface), NR },

	{ "head", KILN_CFG_GROUP, true, NULL, NULL,
	  "The head node: slurmctld, dnsmasq, the HTTP boot server.", NOF, NR },
	{ "head.hostname", KILN_CFG_STRING, true, NULL, "\"head\"",
	  "Host name of the head node (SlurmctldHost): a DNS label of 1 to 63 lowercase letters, "
	  "digits and '-', not starting or ending with '-'.",
	  R(head.hostname), NR },
	{ "head.address", KILN_CFG_IPV4, true, NULL, "\"10.77.0.1\"",
	  "Head node address on the cluster network.", R(head.address), NR },

	{ "node_groups", KILN_CFG_LIST, true, NULL, NULL,
	  "Groups of identical compute nodes: ( { name = ...; hosts = ...; ... }, ... ).", NOF,
	  NR },
	{ "node_groups[].name", KILN_CFG_STRING, true, NULL, "\"gpu\"",
	  "A label for the group (unique).", G(name), NR },
	{ "node_groups[].hosts", KILN_CFG_HOSTLIST, true, NULL, "\"node[01-03]\"",
	  "Host names as a Slurm hostlist; zero padding is kept. Each name is a DNS label: 1 to "
	  "63 lowercase letters, digits and '-', not starting or ending with '-'.",
	  G(hosts), NR },
	{ "node_groups[].addresses", KILN_CFG_ADDRESSES, true, NULL, "\"10.77.0.11-10.77.0.13\"",
	  "One address per host, in host order: a range \"FIRST-LAST\" or a list of addresses.",
	  NOF, NR },
	{ "node_groups[].macs", KILN_CFG_MACS, true, NULL, "[ \"52:54:00:77:00:11\", ... ]",
	  "Boot interface MAC of each host, in host order (DHCP and iPXE key on it); multicast, "
	  "broadcast and all-zero MACs are refused.",
	  NOF, NR },
	{ "node_groups[].gpus", KILN_CFG_GROUP, false, NULL, NULL, "GPUs per node.", NOF, NR },
	{ "node_groups[].gpus.model", KILN_CFG_STRING, false, NULL, "\"NVIDIA H100 80GB HBM3\"",
	  "GPU model as nvidia-smi names it.", G(gpu_model), NR },
	{ "node_groups[].gpus.type", KILN_CFG_STRING, false, "(from model)", "\"h100\"",
	  "Short Gres type for Slurm (--gres=gpu:h100:8); derived from the model (\"NVIDIA H100 "
	  "80GB HBM3\" -> h100).",
	  G(gpu_type), NR },
	{ "node_groups[].gpus.count", KILN_CFG_INT, false, "0", "8", "GPUs per node, 0..16.",
	  G(gpu_count), RANGE(0, KILN_CFG_GPUS_MAX) },
	{ "node_groups[].gpus.socket_map", KILN_CFG_STRING, false, "(even split)",
	  "\"0,0,0,0,1,1,1,1\"",
	  "The CPU socket of each GPU, in GPU order (gres.conf Cores=, GPU-NUMA affinity); by "
	  "default the GPUs split evenly over the sockets in order (8-GPU HGX, 2 sockets: GPUs 0-3 "
	  "on socket 0, 4-7 on socket 1), none when they do not split evenly.",
	  G(gpu_socket_map), NR },
	{ "node_groups[].cpus", KILN_CFG_INT, false,
	  "(sockets x cores_per_socket x threads_per_core)", "224",
	  "Logical CPUs per node (Slurm CPUs).", G(cpus), RANGE(1, 65536) },
	{ "node_groups[].sockets", KILN_CFG_INT, false, "1", "2", "CPU sockets per node.",
	  G(sockets), RANGE(1, 64) },
	{ "node_groups[].cores_per_socket", KILN_CFG_INT, false, "1", "56", "Cores per socket.",
	  G(cores_per_socket), RANGE(1, 4096) },
	{ "node_groups[].threads_per_core", KILN_CFG_INT, false, "1", "2",
	  "Hardware threads per core.", G(threads_per_core), RANGE(1, 16) },
	{ "node_groups[].memory_mb", KILN_CFG_SIZE_MB, false, "1024", "\"2T\"",
	  "Memory Slurm may schedule (RealMemory): an integer in MiB or a size such as \"512G\", "
	  "\"2T\"; 1 MiB to 64 TiB (KILN_CFG_MEMORY_MB_MAX: no server has more; larger is a "
	  "unit mistake).",
	  G(memory_mb), NR },
	{ "node_groups[].partitions", KILN_CFG_STRV, false, "[]", "[ \"train\" ]",
	  "Partitions (from slurm.partitions) every host of the group joins.", G(partitions), NR },
	{ "node_groups[].features", KILN_CFG_STRV, false, "[]", "[ \"nvlink\", \"ib\" ]",
	  "Slurm node features (--constraint).", G(features), NR },

	{ "slurm", KILN_CFG_GROUP, false, NULL, NULL, "Slurm settings rendered into slurm.conf.",
	  NOF, NR },
	{ "slurm.cluster_name", KILN_CFG_STRING, false, "(cluster.name)", "\"pod1\"",
	  "ClusterName.", R(slurm.cluster_name), NR },
	{ "slurm.control_port", KILN_CFG_INT, false, "6817", "6817", "SlurmctldPort.",
	  R(slurm.control_port), PORT },
	{ "slurm.slurmd_port", KILN_CFG_INT, false, "6818", "6818", "SlurmdPort.",
	  R(slurm.slurmd_port), PORT },
	{ "slurm.partitions", KILN_CFG_LIST, false, NULL, NULL,
	  "Partitions: ( { name = ...; nodes = ...; ... }, ... ). Nodes join through nodes or "
	  "node_groups[].partitions.",
	  NOF, NR },
	{ "slurm.partitions[].name", KILN_CFG_STRING, true, NULL, "\"train\"",
	  "PartitionName (unique).", P(name), NR },
	{ "slurm.partitions[].nodes", KILN_CFG_HOSTLIST, false, NULL, "\"dgx[01-24]\"",
	  "Member nodes as a hostlist; every name must be a node of node_groups.", P(nodes), NR },
	{ "slurm.partitions[].default", KILN_CFG_BOOL, false, "false", "true",
	  "Default=YES (at most one partition).", P(is_default), NR },
	{ "slurm.partitions[].max_time", KILN_CFG_DURATION, false, "\"infinite\"", "\"24h\"",
	  "MaxTime (bare integers are seconds).", P(max_time_usec), NR },
	{ "slurm.partitions[].state", KILN_CFG_ENUM, false, "\"up\"", "\"drain\"",
	  "State: up, down, drain or inactive.", P(state), 0, 0, state_names },
	{ "slurm.partitions[].extra", KILN_CFG_STRING, false, NULL, "\"OverSubscribe=NO\"",
	  "Passed through at the end of the PartitionName line.", P(extra), NR },
	{ "slurm.slurmd_timeout", KILN_CFG_DURATION, false, "\"300s\"", "\"5m\"", "SlurmdTimeout.",
	  R(slurm.slurmd_timeout_usec), NR },
	{ "slurm.message_timeout", KILN_CFG_DURATION, false, "\"10s\"", "\"30s\"",
	  "MessageTimeout.", R(slurm.message_timeout_usec), NR },
	{ "slurm.resume_timeout", KILN_CFG_DURATION, false, "\"600s\"", "\"10m\"", "ResumeTimeout.",
	  R(slurm.resume_timeout_usec), NR },
	{ "slurm.kill_wait", KILN_CFG_DURATION, false, "\"30s\"", "\"60s\"",
	  "KillWait (SIGTERM to SIGKILL at time limit).", R(slurm.kill_wait_usec), NR },
	{ "slurm.unkillable_timeout", KILN_CFG_DURATION, false, "\"120s\"", "\"180s\"",
	  "UnkillableStepTimeout.", R(slurm.unkillable_timeout_usec), NR },
	{ "slurm.return_to_service", KILN_CFG_INT, false, "2", "1", "ReturnToService (0, 1 or 2).",
	  R(slurm.return_to_service), RANGE(0, 2) },
	{ "slurm.user", KILN_CFG_STRING, false, "\"slurm\"", "\"slurm\"", "SlurmUser.",
	  R(slurm.user), NR },
	{ "slurm.state_dir", KILN_CFG_PATH, false, "\"/var/spool/slurmctld\"",
	  "\"/var/spool/slurmctld\"", "StateSaveLocation.", R(slurm.state_dir), NR },
	{ "slurm.spool_dir", KILN_CFG_PATH, false, "\"/var/spool/slurmd\"", "\"/var/spool/slurmd\"",
	  "SlurmdSpoolDir.", R(slurm.spool_dir), NR },
	{ "slurm.log_dir", KILN_CFG_PATH, false, "\"/var/log/slurm\"", "\"/var/log/slurm\"",
	  "Directory of slurmctld.log and slurmd.log.", R(slurm.log_dir), NR },
	{ "slurm.run_dir", KILN_CFG_PATH, false, "\"/run\"", "\"/run/slurm\"",
	  "Directory of slurmctld.pid and slurmd.pid.", R(slurm.run_dir), NR },
	{ "slurm.select_type", KILN_CFG_STRING, false, "\"cons_tres\"", "\"cons_tres\"",
	  "SelectType without the select/ prefix.", R(slurm.select_type), NR },
	{ "slurm.proctrack_type", KILN_CFG_STRING, false, "\"cgroup\"", "\"linuxproc\"",
	  "ProctrackType without the proctrack/ prefix.", R(slurm.proctrack_type), NR },
	{ "slurm.task_plugin", KILN_CFG_STRING, false, "\"affinity,cgroup\"", "\"none\"",
	  "TaskPlugin names without the task/ prefix, comma separated.", R(slurm.task_plugin), NR },
	{ "slurm.extra", KILN_CFG_STRV, false, "[]", "[ \"SchedulerParameters=bf_continue\" ]",
	  "Lines passed through verbatim at the end of slurm.conf.", R(slurm.extra), NR },
	{ "slurm.def_mem_per_gpu", KILN_CFG_SIZE_MB, false, "(derived)", "\"200G\"",
	  "DefMemPerGPU, memory of a job per GPU when it gives no --mem: by default memory_mb / "
	  "gpus.count of the GPU group with the least memory per GPU, so a 1-GPU job does not "
	  "take the whole node.",
	  R(slurm.def_mem_per_gpu_mb), NR },
	{ "slurm.def_cpu_per_gpu", KILN_CFG_INT, false, "(derived)", "16",
	  "DefCpuPerGPU, CPUs of a job per GPU when it asks for none: by default cpus / "
	  "gpus.count of the GPU group with the fewest CPUs per GPU (none when a group has fewer "
	  "CPUs than GPUs).",
	  R(slurm.def_cpu_per_gpu), RANGE(1, 4096) },
	{ "slurm.reboot_program", KILN_CFG_PATH, false, "\"/usr/sbin/reboot\"", "\"/sbin/reboot\"",
	  "RebootProgram (scontrol reboot, rolling reboots).", R(slurm.reboot_program), NR },
	{ "slurm.configless", KILN_CFG_BOOL, false, "true", "false",
	  "Configless Slurm: slurmctld serves slurm.conf, gres.conf, cgroup.conf and topology.conf "
	  "(SlurmctldParameters=enable_configless), the nodes' slurmd runs with --conf-server, and "
	  "`kiln apply` reaches them with scontrol reconfigure; false: every node renders its own "
	  "copies at boot (kiln-node-init).",
	  R(slurm.configless), NR },

	{ "health", KILN_CFG_GROUP, false, NULL, NULL,
	  "kiln-healthd, the GPU health daemon on every node.", NOF, NR },
	{ "health.enabled", KILN_CFG_BOOL, false, "true", "true",
	  "Run kiln-healthd on the nodes and render its HealthCheckProgram, Prolog and Epilog into "
	  "slurm.conf.",
	  R(health.enabled), NR },
	{ "health.interval", KILN_CFG_DURATION, false, "\"10s\"", "\"5s\"", "NVML poll interval.",
	  R(health.interval_usec), NR },
	{ "health.recover_after", KILN_CFG_DURATION, false, "\"300s\"", "\"10m\"",
	  "How long a drained node must stay healthy before it is resumed.",
	  R(health.recover_after_usec), NR },
	{ "health.metrics_port", KILN_CFG_INT, false, "9400", "9400",
	  "Prometheus /metrics port (dcgm-exporter's port); 0: no HTTP server.",
	  R(health.metrics_port), RANGE(0, 65535) },
	{ "health.metrics_address", KILN_CFG_STRING, false, "\"0.0.0.0\"", "\"127.0.0.1\"",
	  "Address /metrics binds to.", R(health.metrics_address), NR },
	{ "health.nvml_library", KILN_CFG_STRING, false, "\"libnvidia-ml.so.1\"",
	  "\"/usr/lib/libnvidia-ml.so.1\"", "NVML library loaded with dlopen.",
	  R(health.nvml_library), NR },
	{ "health.nvml_timeout", KILN_CFG_DURATION, false, "\"5s\"", "\"5s\"",
	  "An NVML call slower than this marks the GPU unhealthy.", R(health.nvml_timeout_usec),
	  NR },
	{ "health.watchdog", KILN_CFG_DURATION, false, "\"30s\"", "\"1m\"",
	  "systemd WatchdogSec the daemon honours; 0 = off.", R(health.watchdog_usec), NR },
	{ "health.drain", KILN_CFG_BOOL, false, "true", "false",
	  "Drain unhealthy nodes in Slurm (with a reason) and resume them when healthy; false only "
	  "reports.",
	  R(health.drain), NR },
	{ "health.thresholds", KILN_CFG_GROUP, false, NULL, NULL, "Warning and failure thresholds.",
	  NOF, NR },
	{ "health.thresholds.temp_warn_c", KILN_CFG_INT, false, "85", "83",
	  "GPU temperature warning (Celsius).", R(health.thresholds.temp_warn_c), RANGE(1, 150) },
	{ "health.thresholds.temp_max_c", KILN_CFG_INT, false, "0", "90",
	  "GPU temperature that drains the node; 0 = the GPU's own slowdown temperature from NVML.",
	  R(health.thresholds.temp_max_c), RANGE(0, 150) },
	{ "health.thresholds.power_warn_pct", KILN_CFG_INT, false, "105", "100",
	  "Power draw warning in percent of the enforced power limit.",
	  R(health.thresholds.power_warn_pct), RANGE(1, 200) },
	{ "health.thresholds.ecc_sbe_warn", KILN_CFG_INT, false, "1000", "100",
	  "Volatile single-bit ECC errors that raise a warning.", R(health.thresholds.ecc_sbe_warn),
	  RANGE(0, 1000000000) },
	{ "health.thresholds.pcie_replay_warn_per_min", KILN_CFG_INT, false, "100", "50",
	  "PCIe replay counter rate (per minute) that raises a warning.",
	  R(health.thresholds.pcie_replay_warn_per_min), RANGE(0, 1000000000) },
	{ "health.thresholds.remap_pending", KILN_CFG_ENUM, false, "\"drain\"", "\"reset\"",
	  "Action when rows are pending remap (a GPU reset applies them): ignore, app, drain, "
	  "reset or reboot.",
	  R(health.thresholds.remap_pending), 0, 0, action_names },
	{ "health.thresholds.remap_failure", KILN_CFG_ENUM, false, "\"drain\"", "\"drain\"",
	  "Action when row remapping failed (the GPU needs service).",
	  R(health.thresholds.remap_failure), 0, 0, action_names },
	{ "health.xid", KILN_CFG_LIST, false, NULL, NULL,
	  "Overrides of the built-in XID actions: ( { xid = 79; action = \"reboot\"; }, ... ).",
	  NOF, NR },
	{ "health.xid[].xid", KILN_CFG_INT, true, NULL, "79", "The XID number.", X(xid),
	  RANGE(1, 999) },
	{ "health.xid[].action", KILN_CFG_ENUM, true, NULL, "\"reboot\"",
	  "ignore, app, drain, reset or reboot.", X(action), 0, 0, action_names },
	{ "health.active_on_start", KILN_CFG_BOOL, false, "true", "false",
	  "Run the active checks (GEMM burn, memory test) when the daemon starts.",
	  R(health.active_on_start), NR },
	{ "health.active_interval", KILN_CFG_DURATION, false, "0", "\"24h\"",
	  "Run the active checks on idle nodes this often; 0 = never.",
	  R(health.active_interval_usec), NR },
	{ "health.gemm_seconds", KILN_CFG_INT, false, "10", "30",
	  "Length of the GEMM burn check per GPU.", R(health.gemm_seconds), RANGE(1, 3600) },
	{ "health.memtest_fraction", KILN_CFG_DOUBLE, false, "0.05", "0.5",
	  "Fraction of GPU memory the memory test covers.", R(health.memtest_fraction), NR },
	{ "health.check_program", KILN_CFG_PATH, false, "\"" KILN_LIBEXECDIR "/health-check\"",
	  "\"" KILN_LIBEXECDIR "/health-check\"", "Slurm HealthCheckProgram.",
	  R(health.check_program), NR },
	{ "health.prolog", KILN_CFG_PATH, false, "\"" KILN_LIBEXECDIR "/prolog\"",
	  "\"" KILN_LIBEXECDIR "/prolog\"", "Slurm Prolog.", R(health.prolog), NR },
	{ "health.epilog", KILN_CFG_PATH, false, "\"" KILN_LIBEXECDIR "/epilog\"",
	  "\"" KILN_LIBEXECDIR "/epilog\"", "Slurm Epilog.", R(health.epilog), NR },
	{ "health.health_check_interval", KILN_CFG_DURATION, false, "\"300s\"", "\"60s\"",
	  "Slurm HealthCheckInterval.", R(health.health_check_interval_usec), NR },

	{ "launcher", KILN_CFG_GROUP, false, NULL, NULL, "kiln-run, the elastic training launcher.",
	  NOF, NR },
	{ "launcher.port", KILN_CFG_INT, false, "29500", "29500",
	  "Rendezvous store port (MASTER_PORT).", R(launcher.port), PORT },
	{ "launcher.nnodes", KILN_CFG_NNODES, false, "\"1:1\"", "\"2:4\"",
	  "Default node count as MIN:MAX (elastic) or N.", R(launcher.nnodes_min), NR },
	{ "launcher.nproc_per_node", KILN_CFG_NPROC, false, "\"gpu\"", "8",
	  "Workers per node: \"gpu\" (one per GPU) or a number.", R(launcher.nproc_per_node), NR },
	{ "launcher.max_restarts", KILN_CFG_INT, false, "3", "10",
	  "Restarts of the worker group before giving up.", R(launcher.max_restarts),
	  RANGE(0, 1000) },
	{ "launcher.heartbeat", KILN_CFG_DURATION, false, "\"1s\"", "\"2s\"",
	  "Agent heartbeat interval.", R(launcher.heartbeat_usec), NR },
	{ "launcher.dead_after", KILN_CFG_DURATION, false, "\"5s\"", "\"10s\"",
	  "An agent missing heartbeats this long is dead.", R(launcher.dead_after_usec), NR },
	{ "launcher.last_call", KILN_CFG_DURATION, false, "\"10s\"", "\"30s\"",
	  "After MIN nodes joined, wait this long for more (up to MAX).",
	  R(launcher.last_call_usec), NR },
	{ "launcher.join_timeout", KILN_CFG_DURATION, false, "\"300s\"", "\"10m\"",
	  "Give up when MIN nodes have not joined in this time.", R(launcher.join_timeout_usec),
	  NR },
	{ "launcher.grace", KILN_CFG_DURATION, false, "\"120s\"", "\"60s\"",
	  "Time workers get to checkpoint after SIGTERM before SIGKILL.", R(launcher.grace_usec),
	  NR },
	{ "launcher.exclude_after_failures", KILN_CFG_INT, false, "2", "3",
	  "Exclude a node from new rounds after this many failures on it.",
	  R(launcher.exclude_after_failures), RANGE(1, 1000) },
	{ "launcher.prefix_output", KILN_CFG_BOOL, false, "true", "false",
	  "Prefix worker output lines with their rank.", R(launcher.prefix_output), NR },
	{ "launcher.health_check", KILN_CFG_BOOL, false, "true", "false",
	  "Ask kiln-healthd before starting workers; unhealthy nodes leave the round.",
	  R(launcher.health_check), NR },

	{ "inference", KILN_CFG_GROUP, false, NULL, NULL,
	  "kiln-inferd, the OpenAI-compatible inference server.", NOF, NR },
	{ "inference.enabled", KILN_CFG_BOOL, false, "false", "true",
	  "Run kiln-inferd on the inference nodes.", R(inference.enabled), NR },
	{ "inference.port", KILN_CFG_INT, false, "8000", "8000", "HTTP port.", R(inference.port),
	  PORT },
	{ "inference.address", KILN_CFG_STRING, false, "\"127.0.0.1\"", "\"0.0.0.0\"",
	  "HTTP bind address (kiln-inferd --listen); loopback unless the file opens it.",
	  R(inference.address), NR },
	{ "inference.model", KILN_CFG_PATH, false, NULL, "\"/srv/models/llama-8b\"",
	  "Model directory (safetensors); required when enabled.", R(inference.model), NR },
	{ "inference.nodes", KILN_CFG_STRING, false, "(every node)", "\"infer\"",
	  "Where kiln-inferd runs: a partition name or a hostlist of nodes.", R(inference.nodes),
	  NR },
	{ "inference.max_batch", KILN_CFG_INT, false, "32", "64",
	  "Most sequences batched together.", R(inference.max_batch), RANGE(1, 4096) },
	{ "inference.kv_block_size", KILN_CFG_INT, false, "16", "32", "Tokens per KV-cache block.",
	  R(inference.kv_block_size), RANGE(1, 1024) },
	{ "inference.kv_cache_mb", KILN_CFG_SIZE_MB, false, "0", "\"40G\"",
	  "KV-cache size; 0 = what is left after the weights.", R(inference.kv_cache_mb), NR },
	{ "inference.quant", KILN_CFG_ENUM, false, "\"none\"", "\"int8\"",
	  "Weight quantization: none, int8 or int4.", R(inference.quant), 0, 0, quant_names },
	{ "inference.name", KILN_CFG_STRING, false, "(the model's base name)", "\"llama-3-8b\"",
	  "The model's name in the API (kiln-inferd --name).", R(inference.name), NR },
	{ "inference.tokenizer", KILN_CFG_PATH, false, NULL,
	  "\"/srv/models/llama-3-8b/tokenizer.json\"",
	  "Tokenizer: GGUF, tokenizer.json or tokenizer.bin (kiln-inferd --tokenizer); unset: the "
	  "model's own when it is a GGUF holding one.",
	  R(inference.tokenizer), NR },
	{ "inference.backend", KILN_CFG_ENUM, false, "\"cpu\"", "\"cuda\"",
	  "kk backend: cpu, cuda, or auto (cuda when its module, driver and a device are there, "
	  "else cpu, with one log line saying why) (kiln-inferd --backend).",
	  R(inference.backend), 0, 0,
	  backend_names },
	{ "inference.dtype", KILN_CFG_ENUM, false, "\"auto\"", "\"bf16\"",
	  "Weight dtype: auto (as the model file stores its weights: Q8_0 as i8, Q4_0 as q4, "
	  "bf16, f16 and f32 as themselves, the closest the backend computes on otherwise, "
	  "logged), f32, bf16, f16, i8 or q4 (kiln-inferd --dtype).",
	  R(inference.dtype), 0, 0, dtype_names },
	{ "inference.chat_template", KILN_CFG_ENUM, false, "\"auto\"", "\"llama3\"",
	  "Chat template: auto (detected from the tokenizer, else chatml), chatml, llama2, llama3, "
	  "mistral, gemma, phi3 or zephyr (kiln-inferd --chat-template).",
	  R(inference.chat_template), 0, 0, chat_names },
	{ "inference.context_length", KILN_CFG_INT, false, "0", "4096",
	  "Longest sequence served; 0 = the model's own (kiln-inferd --context-length).",
	  R(inference.context_length), RANGE(0, 1 << 24) },
	{ "inference.kv_blocks", KILN_CFG_INT, false, "1024", "8192",
	  "KV-cache blocks of 16 tokens (kiln-inferd --kv-blocks).", R(inference.kv_blocks),
	  RANGE(1, 1 << 20) },
	{ "inference.max_running", KILN_CFG_INT, false, "64", "128",
	  "Sequences per engine step (kiln-inferd --max-running).", R(inference.max_running),
	  RANGE(1, 4096) },
	{ "inference.max_waiting", KILN_CFG_INT, false, "1024", "256",
	  "Queued requests before 429 (kiln-inferd --max-waiting).", R(inference.max_waiting),
	  RANGE(1, 65536) },
	{ "inference.drain_grace", KILN_CFG_DURATION, false, "\"30s\"", "\"2m\"",
	  "After SIGTERM: time in-flight requests get to finish before they are cancelled "
	  "(kiln-inferd --drain-grace).",
	  R(inference.drain_grace_usec), NR },
	{ "inference.memory_mb", KILN_CFG_SIZE_MB, false, "0", "\"60G\"",
	  "Memory the models may take together (weights + KV cache, estimated per model); a "
	  "set that does not fit is refused at start. 0 = the node's limit on the cpu backend "
	  "(cgroup memory.max, else physical RAM), no check on cuda (kiln-inferd "
	  "--memory-budget).",
	  R(inference.memory_mb), NR },
	{ "inference.api_keys_file", KILN_CFG_PATH, false, NULL, "\"/etc/kiln/inferd-keys\"",
	  "File of API keys, one per line ('#' comments); requests need \"Authorization: Bearer "
	  "KEY\". Unset: no keys. Refused when every user may read it, its group or every user "
	  "may write it, or a user other than root or kiln-inferd's owns it (kiln-inferd "
	  "--api-keys-file).",
	  R(inference.api_keys_file), NR },
	{ "inference.metrics_auth", KILN_CFG_BOOL, false, "false", "true",
	  "GET /metrics needs a key too (with api_keys_file); /health is always open "
	  "(kiln-inferd --metrics-auth).",
	  R(inference.metrics_auth), NR },
	{ "inference.models", KILN_CFG_LIST, false, NULL, NULL,
	  "Several models in one kiln-inferd: ( { name = ...; path = ...; ... }, ... ); instead "
	  "of inference.model (both is an error). Keys left out take the section's key of the "
	  "same name.",
	  NOF, NR },
	{ "inference.models[].name", KILN_CFG_STRING, false, "(the path's base name)",
	  "\"llama-3-8b\"", "The model's name in the API (unique; the request's \"model\").",
	  M(name), NR },
	{ "inference.models[].path", KILN_CFG_PATH, true, NULL, "\"/srv/models/llama-3-8b\"",
	  "Model file or directory (kiln-inferd --model).", M(path), NR },
	{ "inference.models[].tokenizer", KILN_CFG_PATH, false, "(inference.tokenizer)",
	  "\"/srv/models/llama-3-8b/tokenizer.json\"", "Tokenizer of this model.", M(tokenizer),
	  NR },
	{ "inference.models[].dtype", KILN_CFG_ENUM, false, "(inference.dtype)", "\"bf16\"",
	  "Weight dtype: auto, f32, bf16, f16, i8 or q4.", M(dtype), 0, 0, dtype_names },
	{ "inference.models[].context_length", KILN_CFG_INT, false, "(inference.context_length)",
	  "4096", "Longest sequence served; 0 = the model's own.", M(context_length),
	  RANGE(0, 1 << 24) },
	{ "inference.models[].kv_blocks", KILN_CFG_INT, false, "(inference.kv_blocks)", "8192",
	  "KV-cache blocks of 16 tokens (not with kv_cache_mb).", M(kv_blocks), RANGE(1, 1 << 20) },
	{ "inference.models[].kv_cache_mb", KILN_CFG_SIZE_MB, false, "(unset: kv_blocks)", "\"8G\"",
	  "KV-cache size instead of kv_blocks: as many blocks as fit (0 = kv_blocks decides).",
	  M(kv_cache_mb), NR },
	{ "inference.models[].chat_template", KILN_CFG_ENUM, false, "(inference.chat_template)",
	  "\"llama3\"", "Chat template (the words of inference.chat_template).", M(chat_template),
	  0, 0, chat_names },
	{ "inference.cpu_threads", KILN_CFG_INT, false, "0", "16",
	  "Compute threads of the cpu backend; 0 = the CPUs of kiln-inferd's affinity mask and "
	  "cgroup quota (kiln-inferd --cpu-threads).",
	  R(inference.cpu_threads), RANGE(0, 256) },
	{ "inference.allow_groups", KILN_CFG_STRV, false, "(root)", "[ \"root\", \"inferops\" ]",
	  "Unix groups whose members may run Slurm jobs on the inference nodes: the AllowGroups= "
	  "of every partition holding one (root and SlurmUser always may). kiln-inferd uses "
	  "those nodes' GPUs outside Slurm, so by default (root: [] means it too) no user can be "
	  "handed them. [ \"ALL\" ] opens the partitions (a warning).",
	  R(inference.allow_groups), NR },

	{ "image", KILN_CFG_GROUP, false, NULL, NULL,
	  "The stateless node image and how nodes boot it.", NOF, NR },
	{ "image.base", KILN_CFG_STRING, false, "\"bookworm\"", "\"bookworm\"",
	  "Debian suite of the image.", R(image.base), NR },
	{ "image.mirror", KILN_CFG_STRING, false, "\"http://deb.debian.org/debian\"",
	  "\"http://mirror.local/debian\"", "Debian mirror mmdebstrap uses.", R(image.mirror), NR },
	{ "image.packages", KILN_CFG_STRV, false, "[]", "[ \"infiniband-diags\" ]",
	  "Extra Debian packages in the image.", R(image.packages), NR },
	{ "image.output_dir", KILN_CFG_PATH, false, "\"/var/lib/kiln/image\"", "\"/srv/kiln/http\"",
	  "Directory served at http_url: vmlinuz, initrd.img, boot.ipxe, cluster.cfg "
	  "(make image writes build/image/; copy them here or use IMAGE_OUT=).",
	  R(image.output_dir), NR },
	{ "image.tftp_dir", KILN_CFG_PATH, false, "\"/srv/kiln/tftp\"", "\"/srv/tftp\"",
	  "TFTP root holding undionly.kpxe and ipxe.efi.", R(image.tftp_dir), NR },
	{ "image.http_url", KILN_CFG_STRING, false, "(http://HEAD_ADDRESS/kiln)",
	  "\"http://10.77.0.1/kiln\"",
	  "URL the nodes fetch boot.ipxe, kernel, initrd and cluster.cfg from.", R(image.http_url),
	  NR },
	{ "image.kernel_cmdline", KILN_CFG_STRING, false, "\"\"", "\"console=ttyS0\"",
	  "Extra kernel command line.", R(image.kernel_cmdline), NR },
	{ "image.ssh_keys", KILN_CFG_STRV, false, "[]", "[ \"ssh-ed25519 AAAA... admin@head\" ]",
	  "SSH public keys written to root's authorized_keys in the image.", R(image.ssh_keys),
	  NR },
	{ "image.munge_key", KILN_CFG_PATH, false, "\"/etc/munge/munge.key\"",
	  "\"/etc/kiln/munge.key\"",
	  "The head node's munge key: `kiln serve` hands it to the nodes at boot (never in the "
	  "image).",
	  R(image.munge_key), NR },
	{ "image.signing_key", KILN_CFG_PATH, false, "\"/etc/kiln/head.key\"",
	  "\"/etc/kiln/head.key\"",
	  "The head node's secret ed25519 key (`kiln keygen`, mode 0600) that signs cluster.cfg "
	  "(`kiln sign`, `kiln apply`, the image build); its public half (the same name with "
	  ".pub) goes into the image, and kiln-node-init refuses a file it did not sign.",
	  R(image.signing_key), NR },
	{ "image.nvidia", KILN_CFG_BOOL, false, "false", "true",
	  "Build the GPU node's image: the NVIDIA driver (image.nvidia_apt_source, _debs or Debian's), "
	  "nvidia-persistenced, Fabric Manager and the CUDA runtime libraries kiln links.",
	  R(image.nvidia), NR },
	/* Where image.nvidia's driver comes from (docs/image.md, "GPU nodes").
	 * Flat image.nvidia_* names: image.nvidia itself is a boolean, and a
	 * libconfig setting cannot also be a group. */
	{ "image.nvidia_apt_source", KILN_CFG_STRING, false, NULL,
	  "\"https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/ /\"",
	  "NVIDIA's apt repository as \"URL SUITE [COMPONENT...]\" (a flat repository's suite is "
	  "\"/\"), for a driver new enough for CUDA 13 (>= 580); needs image.nvidia_apt_keyring. "
	  "Unset (and no nvidia_debs): Debian's driver (535 in bookworm: too old for CUDA 13).",
	  R(image.nvidia_apt_source), NR },
	{ "image.nvidia_apt_keyring", KILN_CFG_PATH, false, NULL,
	  "\"/usr/share/keyrings/cuda-archive-keyring.gpg\"",
	  "Keyring (on the build machine) that signs image.nvidia_apt_source.",
	  R(image.nvidia_apt_keyring), NR },
	{ "image.nvidia_debs", KILN_CFG_PATH, false, NULL, "\"/srv/kiln/nvidia-580\"",
	  "Directory (on the build machine) of NVIDIA's driver .debs: every *.deb in it is "
	  "installed, dependencies from image.mirror. Instead of nvidia_apt_source.",
	  R(image.nvidia_debs), NR },
	{ "image.nvidia_packages", KILN_CFG_STRV, false, "(per source)",
	  "[ \"nvidia-driver-cuda\", \"nvidia-kernel-open-dkms\" ]",
	  "Driver packages to install. Default from NVIDIA's repository: nvidia-driver-cuda, "
	  "nvidia-kernel-open-dkms, nvidia-persistenced; from Debian: nvidia-kernel-dkms, "
	  "nvidia-smi, libnvidia-ml1, libcuda1, nvidia-persistenced, firmware-nvidia-gsp, "
	  "nvidia-modprobe; with "
	  "nvidia_debs: none beyond the .debs.",
	  R(image.nvidia_packages), NR },
	{ "image.nvidia_fabricmanager", KILN_CFG_STRING, false, NULL,
	  "\"nvidia-fabricmanager-580\"",
	  "Fabric Manager package for NVSwitch systems (HGX), from the same source as the driver; "
	  "installed with its service enabled. Its branch must be the driver's.",
	  R(image.nvidia_fabricmanager), NR },
	{ "image.nvidia_cuda_dir", KILN_CFG_PATH, false, "\"/usr/local/cuda\"", "\"/opt/cuda-13.0\"",
	  "CUDA toolkit (on the build machine) whose runtime libraries kiln's CUDA backend links "
	  "(libcudart, libcublasLt, libnccl: as ldd finds them) are copied into the image, with its "
	  "licence notices in /usr/share/doc/kiln-cuda.",
	  R(image.nvidia_cuda_dir), NR },
	/* kiln serve (config/cli/serve.c, docs/serve.md) */
	{ "image.serve_listen", KILN_CFG_STRING, false, "(http_url's host:port)", "\"0.0.0.0:80\"",
	  "ADDRESS:PORT kiln serve listens on (an IPv4 literal, or [IPv6]:PORT); unset: the host "
	  "and port of image.http_url, which must then be an address.",
	  R(image.serve_listen), NR },
	{ "image.secrets_only_when_down", KILN_CFG_BOOL, false, "false", "true",
	  "kiln serve hands a node its secrets only while Slurm lists it down, not responding or "
	  "rebooting (or does not know it), as Warewulf's secure overlays do; a node rebooted "
	  "within SlurmdTimeout then waits, and kiln apply cannot re-deliver to running nodes.",
	  R(image.secrets_only_when_down), NR },
	{ "image.root_password_file", KILN_CFG_PATH, false, NULL,
	  "\"/etc/kiln/root-password-hash\"",
	  "File on the head node (root-owned, mode 0600) holding root's crypt(3) password hash "
	  "for the nodes; kiln serve hands it to kiln-node-init at boot, never in the image or "
	  "the cluster file. Unset: not delivered (root's password stays locked). Replaces "
	  "image.root_password_hash, which is refused.",
	  R(image.root_password_file), NR },

	/* Thresholds of the alert rules (kiln render kiln-alerts.yml, docs/monitoring.md). */
	{ "monitoring", KILN_CFG_GROUP, false, NULL, NULL,
	  "Prometheus scrape interval and alert thresholds (kiln render prometheus).", NOF, NR },
	{ "monitoring.scrape_interval", KILN_CFG_DURATION, false, "\"15s\"", "\"30s\"",
	  "How often Prometheus scrapes kiln-healthd and kiln-inferd.",
	  R(monitoring.scrape_interval_usec), NR },
	{ "monitoring.drained_for", KILN_CFG_DURATION, false, "\"30m\"", "\"1h\"",
	  "KilnNodeDrained fires when kiln-healthd has drained a node this long.",
	  R(monitoring.drained_for_usec), NR },
	{ "monitoring.throttle_for", KILN_CFG_DURATION, false, "\"10m\"", "\"5m\"",
	  "KilnGPUThermalThrottling fires when a GPU's clocks are thermally slowed this long.",
	  R(monitoring.throttle_for_usec), NR },
	{ "monitoring.healthd_down_for", KILN_CFG_DURATION, false, "\"5m\"", "\"2m\"",
	  "KilnHealthdDown fires when a node's kiln-healthd cannot be scraped this long.",
	  R(monitoring.healthd_down_for_usec), NR },
	{ "monitoring.queue_waiting", KILN_CFG_INT, false, "512", "256",
	  "KilnInferenceQueueSaturated fires when more requests than this wait in a kiln-inferd "
	  "queue for 5 minutes.",
	  R(monitoring.queue_waiting), RANGE(1, 1000000) },
	{ "monitoring.ttft_p99", KILN_CFG_DURATION, false, "\"2s\"", "\"500ms\"",
	  "KilnInferenceTTFTHigh fires when a model's p99 time to first token stays above this "
	  "for 10 minutes.",
	  R(monitoring.ttft_p99_usec), NR },

	{ "accounting", KILN_CFG_GROUP, false, NULL, NULL,
	  "Slurm job accounting through slurmdbd; off unless storage_host is set.", NOF, NR },
	{ "accounting.storage_host", KILN_CFG_STRING, false, NULL, "\"db\"",
	  "The MariaDB/MySQL server of the accounting database (slurmdbd.conf StorageHost); "
	  "setting it turns accounting on: slurm.conf gets "
	  "AccountingStorageType=accounting_storage/slurmdbd.",
	  R(accounting.storage_host), NR },
	{ "accounting.storage_port", KILN_CFG_INT, false, "3306", "3306", "StoragePort.",
	  R(accounting.storage_port), PORT },
	{ "accounting.storage_user", KILN_CFG_STRING, false, "\"slurm\"", "\"slurm\"",
	  "StorageUser, the database user.", R(accounting.storage_user), NR },
	{ "accounting.storage_password_file", KILN_CFG_PATH, false, NULL,
	  "\"/etc/kiln/slurmdbd.pass\"",
	  "A file holding the database password (required with storage_host; the password is "
	  "never written in the cluster file). `kiln render slurmdbd.conf` reads it on the head "
	  "node.",
	  R(accounting.storage_password_file), NR },
	{ "accounting.storage_loc", KILN_CFG_STRING, false, "\"slurm_acct_db\"", "\"pod1_acct\"",
	  "StorageLoc, the database name.", R(accounting.storage_loc), NR },
	{ "accounting.dbd_host", KILN_CFG_STRING, false, "(head.hostname)", "\"head\"",
	  "Where slurmdbd runs (DbdHost; slurm.conf AccountingStorageHost).",
	  R(accounting.dbd_host), NR },
	{ "accounting.dbd_port", KILN_CFG_INT, false, "6819", "6819",
	  "DbdPort (slurm.conf AccountingStoragePort).", R(accounting.dbd_port), PORT },

	{ "logging", KILN_CFG_GROUP, false, NULL, NULL,
	  "Where the nodes' journal goes (a stateless node's is in RAM, lost at reboot).", NOF,
	  NR },
	{ "logging.forward", KILN_CFG_BOOL, false, "true", "false",
	  "Forward every node's journal to the head node: kiln-node-init configures and starts "
	  "systemd-journal-upload (systemd-journal-remote must listen on the head).",
	  R(logging.forward), NR },
	{ "logging.url", KILN_CFG_STRING, false, "(http://HEAD_ADDRESS:19532)",
	  "\"https://head:19532\"", "systemd-journal-remote's URL (journal-upload.conf URL=).",
	  R(logging.url), NR },
	{ "time", KILN_CFG_GROUP, false, NULL, NULL,
	  "The nodes' clocks (munge rejects credentials from a clock off by minutes).", NOF, NR },
	{ "time.sync", KILN_CFG_BOOL, false, "true", "false",
	  "Keep the nodes' clocks with systemd-timesyncd against time.servers (kiln-node-init).",
	  R(time.sync), NR },
	{ "time.servers", KILN_CFG_STRV, false, "(head.address)",
	  "[ \"10.77.0.1\", \"ntp.example.org\" ]",
	  "NTP servers of the nodes (timesyncd.conf NTP=); by default the head node, which then "
	  "serves NTP (chrony with allow SUBNET).",
	  R(time.servers), NR },

	{ "topology", KILN_CFG_GROUP, false, NULL, NULL,
	  "The network's switch tree, for Slurm's topology/tree (topology.conf).", NOF, NR },
	{ "topology.switches", KILN_CFG_LIST, false, NULL, NULL,
	  "Switches: ( { name = \"leaf1\"; nodes = \"dgx[01-08]\"; }, { name = \"spine\"; switches "
	  "= \"leaf[1-4]\"; } ). With any, slurm.conf gets TopologyPlugin=topology/tree and "
	  "`kiln render topology.conf` the tree; without, Slurm's flat default.",
	  NOF, NR },
	{ "topology.switches[].name", KILN_CFG_STRING, true, NULL, "\"leaf1\"",
	  "SwitchName (unique; letters, digits, '-', '_', '.').", SW(name), NR },
	{ "topology.switches[].nodes", KILN_CFG_HOSTLIST, false, NULL, "\"dgx[01-08]\"",
	  "A leaf switch: the nodes cabled to it (each node under one leaf).", SW(nodes), NR },
	{ "topology.switches[].switches", KILN_CFG_HOSTLIST, false, NULL, "\"leaf[1-4]\"",
	  "A higher switch: the switches below it (each switch under at most one).", SW(switches),
	  NR },

	/* ---- users, groups and shared storage (check-users.c; render.c's
	 * sysusers and mounts; kiln-healthd's mount check) ---- */
	{ "users", KILN_CFG_LIST, false, NULL, NULL,
	  "Cluster users with fixed ids, the same on every node and the head node (kiln render "
	  "sysusers): ( { name = \"alice\"; uid = 2001; groups = [ \"research\" ]; }, ... ). "
	  "No passwords: users reach the nodes through Slurm (and ssh keys in their home).",
	  NOF, NR },
	{ "users[].name", KILN_CFG_STRING, true, NULL, "\"alice\"",
	  "Login name (unique): a lowercase letter or '_', then lowercase letters, digits, '_' "
	  "and '-'; at most 32. Not a system account of the node image (root, slurm, munge ...).",
	  U(name), NR },
	{ "users[].uid", KILN_CFG_INT, true, NULL, "2001",
	  "User id (unique): 1000 to 59999 or above 65535; below 1000 only with system = true.",
	  U(uid), RANGE(1, 2147483646) },
	{ "users[].gid", KILN_CFG_INT, false, "(uid)", "2000",
	  "Primary group: a gid of groups[], or the uid (the default: a group of the user's own, "
	  "named after the user).",
	  U(gid), RANGE(1, 2147483646) },
	{ "users[].groups", KILN_CFG_STRV, false, "[]", "[ \"research\", \"inferops\" ]",
	  "Supplementary groups: names of groups[].", U(groups), NR },
	{ "users[].home", KILN_CFG_PATH, false, "(/home/NAME)", "\"/home/alice\"",
	  "Home directory (on a shared mount, as a rule; not created by kiln).", U(home), NR },
	{ "users[].shell", KILN_CFG_PATH, false, "\"/bin/bash\"", "\"/bin/zsh\"", "Login shell.",
	  U(shell), NR },
	{ "users[].comment", KILN_CFG_STRING, false, NULL, "\"Alice Liddell\"",
	  "GECOS field (the user's full name); no ':', '\"' or control characters.", U(comment),
	  NR },
	{ "users[].system", KILN_CFG_BOOL, false, "false", "true",
	  "The uid lies below 1000 on purpose (a site's existing low ids); without it one is "
	  "refused as a clash with Debian's system accounts.",
	  U(system), NR },
	{ "groups", KILN_CFG_LIST, false, NULL, NULL,
	  "Cluster groups with fixed gids: ( { name = \"research\"; gid = 3000; }, ... ).", NOF,
	  NR },
	{ "groups[].name", KILN_CFG_STRING, true, NULL, "\"research\"",
	  "Group name (unique; the rules of users[].name).", UG(name), NR },
	{ "groups[].gid", KILN_CFG_INT, true, NULL, "3000",
	  "Group id (unique): 1000 to 59999 or above 65535; below 1000 only with system = true.",
	  UG(gid), RANGE(1, 2147483646) },
	{ "groups[].system", KILN_CFG_BOOL, false, "false", "true",
	  "The gid lies below 1000 on purpose.", UG(system), NR },
	{ "mounts", KILN_CFG_LIST, false, NULL, NULL,
	  "Shared filesystems every node mounts (kiln render mounts: systemd mount units ordered "
	  "before slurmd): ( { what = \"head:/home\"; where = \"/home\"; type = \"nfs\"; "
	  "options = \"vers=4.2,hard\"; }, ... ).",
	  NOF, NR },
	{ "mounts[].what", KILN_CFG_STRING, true, NULL, "\"head:/home\"",
	  "What to mount (What=): \"HOST:/PATH\" for NFS, a device, or the source a type takes; "
	  "no spaces or control characters.",
	  MT(what), NR },
	{ "mounts[].where", KILN_CFG_PATH, true, NULL, "\"/home\"",
	  "Mount point (Where=, unique): absolute, normalized, not / or a system directory "
	  "(/etc, /usr, /proc ...). The unit is named after it (/home: home.mount).",
	  MT(where), NR },
	{ "mounts[].type", KILN_CFG_STRING, false, "\"nfs\"", "\"nfs4\"",
	  "Filesystem type (Type=): nfs, nfs4, cifs, lustre, fuse.sshfs, tmpfs ...", MT(type), NR },
	{ "mounts[].options", KILN_CFG_STRING, false, NULL, "\"vers=4.2,hard,noatime\"",
	  "Mount options (Options=), comma separated; unset: the type's defaults.", MT(options),
	  NR },
	{ "mounts[].required", KILN_CFG_BOOL, false, "true", "false",
	  "A node without it is drained by kiln-healthd (reason \"kiln: mount WHERE (WHAT TYPE) "
	  "missing\") and resumed when it is back; false: a warning only.",
	  MT(required), NR },
	{ "mounts[].timeout", KILN_CFG_DURATION, false, "\"10s\"", "\"30s\"",
	  "kiln-healthd checks that the mount answers (statfs) on every poll: one that does not "
	  "within this is \"not responding\" (a hung NFS server), treated as missing.",
	  MT(timeout_usec), NR },
};

const kiln_cfg_key *kiln_cfg_schema(size_t *ret_n)
{
	if (ret_n)
		*ret_n = ARRAY_SIZE(schema);
	return schema;
}

const kiln_cfg_key *kiln_cfg__next_key(int base, const kiln_cfg_key *k)
{
	for (k = k ? k + 1 : schema; k < schema + ARRAY_SIZE(schema); k++)
		if (k->base == base)
			return k;
	return NULL;
}

/* ---- names of the enums and types -------------------------------------- */

const char *kiln_cfg_action_to_string(kiln_cfg_action a)
{
	return a >= 0 && a < _KILN_ACTION_MAX ? action_names[a] : NULL;
}
const char *kiln_cfg_quant_to_string(kiln_cfg_quant q)
{
	return q >= 0 && q < _KILN_QUANT_MAX ? quant_names[q] : NULL;
}
const char *kiln_cfg_backend_to_string(kiln_cfg_backend b)
{
	return b >= 0 && b < _KILN_BACKEND_MAX ? backend_names[b] : NULL;
}
const char *kiln_cfg_dtype_to_string(kiln_cfg_dtype d)
{
	return d >= 0 && d < _KILN_DTYPE_MAX ? dtype_names[d] : NULL;
}
const char *kiln_cfg_chat_to_string(kiln_cfg_chat c)
{
	return c >= 0 && c < _KILN_CHAT_MAX ? chat_names[c] : NULL;
}
const char *kiln_cfg_part_state_to_string(kiln_cfg_part_state s)
{
	static const char *const upper[] = { "UP", "DOWN", "DRAIN", "INACTIVE" };
	return s >= 0 && s < _KILN_PART_STATE_MAX ? upper[s] : NULL;
}

const char *kiln_cfg_type_to_string(kiln_cfg_type t)
{
	static const char *const names[] = {
		[KILN_CFG_STRING] = "string",	    [KILN_CFG_INT] = "integer",
		[KILN_CFG_BOOL] = "boolean",	    [KILN_CFG_DOUBLE] = "number",
		[KILN_CFG_DURATION] = "duration",   [KILN_CFG_SIZE_MB] = "size",
		[KILN_CFG_IPV4] = "address",	    [KILN_CFG_CIDR] = "cidr",
		[KILN_CFG_HOSTLIST] = "hostlist",   [KILN_CFG_PATH] = "path",
		[KILN_CFG_ENUM] = "enum",	    [KILN_CFG_STRV] = "strings",
		[KILN_CFG_IPV4_LIST] = "addresses", [KILN_CFG_ADDRESSES] = "address-range",
		[KILN_CFG_MACS] = "macs",	    [KILN_CFG_NNODES] = "min:max",
		[KILN_CFG_NPROC] = "gpu-or-count",  [KILN_CFG_GROUP] = "group",
		[KILN_CFG_LIST] = "list",
	};
	return t >= 0 && t < _KILN_CFG_TYPE_MAX ? names[t] : NULL;
}
