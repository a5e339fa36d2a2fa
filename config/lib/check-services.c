/* check-services.c — the service sections across keys: slurm, health,
 * launcher, inference and image.
 *
 * Duration ranges a single key cannot state (Slurm's 16-bit timeouts),
 * words that land unquoted in slurm.conf, thresholds that must agree with
 * each other, where kiln-inferd runs, and what the node image may hold (an
 * image never ships a root account without a secret). */
#include <arpa/inet.h>
#include <assert.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config-internal.h"
#include "kiln/hostlist.h"
#include "kiln/parse.h"

/* Durations whose range one key alone cannot express: Slurm keeps most of
 * its timeouts in 16-bit fields, and a daemon polling every 0 s would spin. */
#define SEC KILN_USEC_PER_SEC
static const struct {
	const char *path;
	uint64_t min, max; /* usec, inclusive */
} duration_limits[] = {
	{ "slurm.slurmd_timeout", 1 * SEC, 65533 * SEC },
	{ "slurm.message_timeout", 1 * SEC, 65533 * SEC },
	{ "slurm.resume_timeout", 1 * SEC, 65533 * SEC },
	{ "slurm.kill_wait", 1 * SEC, 65533 * SEC },
	{ "slurm.unkillable_timeout", 1 * SEC, 65533 * SEC },
	{ "health.health_check_interval", 1 * SEC, 65533 * SEC },
	{ "health.interval", 100 * KILN_USEC_PER_MSEC, 86400 * SEC },
	{ "health.recover_after", 0, 365 * 86400 * SEC },
	{ "health.nvml_timeout", 1 * KILN_USEC_PER_MSEC, 3600 * SEC },
	{ "health.watchdog", 0, 86400 * SEC },
	{ "health.active_interval", 0, 365 * 86400 * SEC },
	{ "launcher.heartbeat", 10 * KILN_USEC_PER_MSEC, 3600 * SEC },
	{ "launcher.dead_after", 10 * KILN_USEC_PER_MSEC, 86400 * SEC },
	{ "launcher.last_call", 0, 86400 * SEC },
	{ "launcher.join_timeout", 1 * SEC, KILN_USEC_INFINITY },
	{ "launcher.grace", 0, 86400 * SEC },
};

void kiln_cfg__check_durations(loader *L)
{
	for (size_t i = 0; i < ARRAY_SIZE(duration_limits); i++) {
		const kiln_cfg_key *k = kiln_cfg__find_key(duration_limits[i].path);
		assert(k && k->type == KILN_CFG_DURATION && k->base == BASE_ROOT);
		uint64_t v = *(uint64_t *) kiln_cfg__field(k, L->cfg);
		if (v >= duration_limits[i].min && v <= duration_limits[i].max)
			continue;
		char a[32], b[32], x[32];
		kiln_format_duration(x, sizeof(x), v);
		kiln_format_duration(a, sizeof(a), duration_limits[i].min);
		kiln_format_duration(b, sizeof(b), duration_limits[i].max);
		kiln_cfg__root_error(L, k->path, NULL, "%s is out of range %s..%s", x, a, b);
	}
	for (size_t i = 0; i < L->cfg->slurm.n_partitions; i++) {
		uint64_t v = L->cfg->slurm.partitions[i].max_time_usec;
		if (v != KILN_USEC_INFINITY && (v < 60 * SEC || v > 365ULL * 86400 * SEC)) {
			char p[64], x[32];
			snprintf(p, sizeof(p), "slurm.partitions[%zu].max_time", i);
			kiln_cfg__add_error(L, kiln_cfg__member_line(L->part_set[i], "max_time"), p,
					    "use 1m..365d or \"infinite\"", "%s is out of range",
					    kiln_format_duration(x, sizeof(x), v));
		}
	}
}
#undef SEC

/* Values written unquoted into generated files. */
void kiln_cfg__check_service_words(loader *L)
{
	static const struct {
		const char *path, *extra;
	} words[] = {
		{ "slurm.user", "._-" },	 { "slurm.select_type", "_" },
		{ "slurm.proctrack_type", "_" }, { "slurm.task_plugin", "_," },
		{ "slurm.cluster_name", "_-" },	 { "health.metrics_address", ".:" },
		{ "inference.address", ".:" },
	};
	for (size_t i = 0; i < ARRAY_SIZE(words); i++)
		kiln_cfg__check_root_word(L, words[i].path, words[i].extra);
}

/* Debian policy's package name alphabet: the names go to apt-get and
 * mmdebstrap --include=a,b, where a comma or space would add others. */
static bool is_debian_package_name(const char *k)
{
	bool ok = k[0] && (islower((unsigned char) k[0]) || isdigit((unsigned char) k[0]));
	for (const char *q = k; ok && *q; q++)
		ok = islower((unsigned char) *q) || isdigit((unsigned char) *q) || strchr(".+-", *q);
	return ok;
}

/* image.nvidia_*: where the GPU image's driver comes from.  Paths name
 * files on the build machine, so their existence is checked by
 * image/build-image.sh, not here (nodes check the same file). */
static void check_image_nvidia(loader *L)
{
	const kiln_cfg_image *im = &L->cfg->image;
	static const char *const keys[] = { "image.nvidia_apt_source", "image.nvidia_apt_keyring",
					    "image.nvidia_debs",       "image.nvidia_packages",
					    "image.nvidia_fabricmanager" };
	if (!im->nvidia) {
		for (size_t i = 0; i < ARRAY_SIZE(keys); i++)
			if (kiln_cfg__root_line(L, keys[i]) > 0)
				kiln_cfg__add_warning(L, kiln_cfg__root_line(L, keys[i]), keys[i],
						      "set image.nvidia = true to build a GPU image",
						      "ignored: image.nvidia is false");
		return;
	}
	if (im->nvidia_apt_source && im->nvidia_debs)
		kiln_cfg__root_error(L, "image.nvidia_debs",
				     "keep one of image.nvidia_debs and image.nvidia_apt_source",
				     "the driver comes from one source, and "
				     "image.nvidia_apt_source is set too");
	if (im->nvidia_apt_source) {
		const char *a = im->nvidia_apt_source, *sp = strchr(a, ' ');
		if (!startswith(a, "http://") && !startswith(a, "https://"))
			kiln_cfg__root_error(L, "image.nvidia_apt_source",
					     "write it like \"https://developer.download.nvidia.com/"
					     "compute/cuda/repos/debian12/x86_64/ /\"",
					     "\"%s\" does not start with an http:// or https:// URL", a);
		else if (!sp || !sp[1] || sp[1] == ' ' || strpbrk(a, "\t\n\r[]"))
			kiln_cfg__root_error(L, "image.nvidia_apt_source",
					     "write \"URL SUITE [COMPONENT...]\"; NVIDIA's flat "
					     "repository's suite is \"/\"",
					     "\"%s\" is not \"URL SUITE [COMPONENT...]\"", a);
		if (!im->nvidia_apt_keyring)
			kiln_cfg__root_error(L, "image.nvidia_apt_source",
					     "set image.nvidia_apt_keyring to NVIDIA's keyring "
					     "(cuda-archive-keyring.gpg from the cuda-keyring package)",
					     "an apt source needs the keyring that signs it");
	} else if (im->nvidia_apt_keyring)
		kiln_cfg__root_error(L, "image.nvidia_apt_keyring",
				     "set image.nvidia_apt_source, or remove the keyring",
				     "a keyring without image.nvidia_apt_source");
	if (!im->nvidia_apt_source && !im->nvidia_debs)
		kiln_cfg__add_warning(
			L, kiln_cfg__root_line(L, "image.nvidia"), "image.nvidia",
			"name NVIDIA's packages (>= 580) in image.nvidia_apt_source or "
			"image.nvidia_debs (docs/image.md, \"GPU nodes\")",
			"the driver comes from Debian (535 in bookworm), which cannot run CUDA 13 "
			"(it needs >= 580): kiln's CUDA backend will not load on these nodes");
	for (size_t i = 0; im->nvidia_packages && im->nvidia_packages[i]; i++) {
		char p[48];
		snprintf(p, sizeof(p), "image.nvidia_packages[%zu]", i);
		if (!is_debian_package_name(im->nvidia_packages[i]))
			kiln_cfg__add_error(L, kiln_cfg__root_line(L, "image.nvidia_packages"), p,
					    "Debian package names use a-z, 0-9, '.', '+' and '-'",
					    "\"%s\" is not a Debian package name",
					    im->nvidia_packages[i]);
	}
	if (im->nvidia_fabricmanager && !is_debian_package_name(im->nvidia_fabricmanager))
		kiln_cfg__root_error(L, "image.nvidia_fabricmanager",
				     "name the package, like \"nvidia-fabricmanager-580\"",
				     "\"%s\" is not a Debian package name",
				     im->nvidia_fabricmanager);
}

/* image.serve_listen: "IPV4:PORT" or "[IPV6]:PORT", an address (kiln serve
 * does not resolve names) and a port 1-65535. */
static bool listen_ok(const char *s)
{
	char host[64];
	const char *port;
	struct in6_addr a6;
	struct in_addr a4;
	int p;
	if (s[0] == '[') {
		const char *close = strchr(s, ']');
		if (!close || close[1] != ':' || (size_t) (close - s - 1) >= sizeof(host))
			return false;
		snprintf(host, sizeof(host), "%.*s", (int) (close - s - 1), s + 1);
		port = close + 2;
		if (inet_pton(AF_INET6, host, &a6) != 1)
			return false;
	} else {
		const char *colon = strrchr(s, ':');
		if (!colon || (size_t) (colon - s) >= sizeof(host))
			return false;
		snprintf(host, sizeof(host), "%.*s", (int) (colon - s), s);
		port = colon + 1;
		if (inet_pton(AF_INET, host, &a4) != 1)
			return false;
	}
	return kiln_parse_int(port, 1, 65535, &p) >= 0;
}

void kiln_cfg__check_image(loader *L)
{
	kiln_cfg *c = L->cfg;
	if (c->image.serve_listen && !listen_ok(c->image.serve_listen))
		kiln_cfg__root_error(
			L, "image.serve_listen",
			"write it like \"10.77.0.1:80\" or \"[fd00::1]:80\"",
			"\"%s\" is not ADDRESS:PORT (an IP address, not a name; a port "
			"from 1 to 65535)",
			c->image.serve_listen);
	if (c->image.http_url) {
		if (!startswith(c->image.http_url, "http://") &&
		    !startswith(c->image.http_url, "https://"))
			kiln_cfg__root_error(
				L, "image.http_url", "write it like \"http://10.0.0.1/kiln\"",
				"\"%s\" is not an http:// or https:// URL", c->image.http_url);
		else if (strpbrk(c->image.http_url, " \t"))
			kiln_cfg__root_error(L, "image.http_url", NULL, "URL contains a space");
	}
	for (size_t i = 0; c->image.packages && c->image.packages[i]; i++) {
		const char *k = c->image.packages[i];
		char p[48];
		bool ok = k[0] && (islower((unsigned char) k[0]) || isdigit((unsigned char) k[0]));
		for (const char *q = k; ok && *q; q++)
			ok = islower((unsigned char) *q) || isdigit((unsigned char) *q) ||
			     strchr(".+-", *q);
		snprintf(p, sizeof(p), "image.packages[%zu]", i);
		/* Names go to mmdebstrap --include=a,b: Debian policy's package
		 * name alphabet keeps a stray comma or space from adding others. */
		if (!ok)
			kiln_cfg__add_error(L, kiln_cfg__root_line(L, "image.packages"), p,
					    "Debian package names use a-z, 0-9, '.', '+' and '-'",
					    "\"%s\" is not a Debian package name", k);
	}
	for (size_t i = 0; c->image.ssh_keys && c->image.ssh_keys[i]; i++) {
		const char *k = c->image.ssh_keys[i];
		char p[48];
		snprintf(p, sizeof(p), "image.ssh_keys[%zu]", i);
		/* One authorized_keys line each: a newline would smuggle in a second. */
		if (strpbrk(k, "\n\r") || !strchr(k, ' ') ||
		    !(startswith(k, "ssh-") || startswith(k, "ecdsa-") || startswith(k, "sk-")))
			kiln_cfg__add_error(
				L, kiln_cfg__root_line(L, "image.ssh_keys"), p,
				"paste one line of a .pub file, like \"ssh-ed25519 AAAA... "
				"admin@head\"",
				"not an SSH public key line");
	}
	check_image_nvidia(L);
}

/* health.* and launcher.* keys that must agree with each other. */
void kiln_cfg__check_health(loader *L)
{
	kiln_cfg *c = L->cfg;
	for (size_t i = 0; i < c->health.n_xids; i++)
		for (size_t j = 0; j < i; j++)
			if (c->health.xids[i].xid &&
			    c->health.xids[i].xid == c->health.xids[j].xid) {
				kiln_cfg__member_error(L, "health.xid", i, L->xid_set[i], "xid",
						       NULL, "XID %d is already set at line %d",
						       c->health.xids[i].xid,
						       c->health.xids[j].line);
				break;
			}
	if (c->health.memtest_fraction < 0.0 || c->health.memtest_fraction > 1.0)
		kiln_cfg__root_error(L, "health.memtest_fraction", NULL, "%g is out of range 0..1",
				     c->health.memtest_fraction);
	if (c->health.thresholds.temp_max_c &&
	    c->health.thresholds.temp_max_c < c->health.thresholds.temp_warn_c)
		kiln_cfg__root_error(
			L, "health.thresholds.temp_max_c", NULL, "%d C is below temp_warn_c (%d C)",
			c->health.thresholds.temp_max_c, c->health.thresholds.temp_warn_c);
	if (c->launcher.dead_after_usec <= c->launcher.heartbeat_usec)
		kiln_cfg__root_error(L, "launcher.dead_after", NULL,
				     "must be longer than launcher.heartbeat");
}

static void check_inference_dtype(loader *L);
static void check_inference_overlap(loader *L);
static void check_inference_open(loader *L);

/* Inference: where it runs (marks cfg->nodes[].inference), what it
 * serves, and that Slurm does not get the same GPUs. */
/* The longest model name kiln-inferd takes (its INFERD_NAME_MAX): the
 * name is echoed in every reply and in the metrics' model_name label. */
#define MODEL_NAME_MAX 128

/* A model's name in the API: its name, else the path's base name. */
static const char *model_api_name(const kiln_cfg_model *m)
{
	const char *slash = m->path ? strrchr(m->path, '/') : NULL;
	return m->name ? m->name : slash && slash[1] ? slash + 1 : m->path ? m->path : "";
}

/* inference.models: not beside the flat inference.model (which would the
 * server serve?), names unique (requests are routed by them), one way to
 * size each KV cache. */
static void check_inference_models(loader *L)
{
	const kiln_cfg_inference *in = &L->cfg->inference;
	config_setting_t *list = config_lookup(L->lc, "inference.models");
	if (list && in->model)
		kiln_cfg__root_error(L, "inference.models",
				     "keep one: move model (and name, tokenizer ...) into the list "
				     "as an element, or drop the list",
				     "both inference.models and inference.model are set");
	if (list && in->enabled && in->n_models == 0 &&
	    config_setting_type(list) == CONFIG_TYPE_LIST)
		kiln_cfg__root_error(L, "inference.models",
				     "add ( { name = \"NAME\"; path = \"/path/to/model\"; } )",
				     "the list is empty but inference is enabled");
	for (size_t i = 0; i < in->n_models; i++) {
		const kiln_cfg_model *m = &in->models[i];
		config_setting_t *e = L->model_set[i];
		if (config_setting_get_member(e, "kv_blocks") &&
		    config_setting_get_member(e, "kv_cache_mb"))
			kiln_cfg__member_error(
				L, "inference.models", i, e, "kv_cache_mb", "give one of them",
				"both kv_blocks and kv_cache_mb size this model's KV "
				"cache");
		const char *name = model_api_name(m);
		if (strlen(name) > MODEL_NAME_MAX || !*name)
			kiln_cfg__member_error(L, "inference.models", i, e, "name",
					       "use 1 to 128 characters",
					       "a model name of %zu characters", strlen(name));
		for (size_t j = 0; j < i; j++)
			if (streq(name, model_api_name(&in->models[j]))) {
				kiln_cfg__member_error(
					L, "inference.models", i, e, m->name ? "name" : "path",
					"give each model its own name = \"...\"",
					"two models are named \"%s\" (inference.models[%zu], line "
					"%d): requests pick a model by its name",
					name, j, in->models[j].line);
				break;
			}
	}
}

void kiln_cfg__check_inference(loader *L)
{
	kiln_cfg *c = L->cfg;
	if (c->inference.enabled && !c->inference.model && c->inference.n_models == 0)
		kiln_cfg__add_error(
			L, kiln_cfg__root_line(L, "inference.enabled"), "inference.model",
			"set model = \"/path/to/model\"; (or models = ( { name = ...; path "
			"= ...; } );) or enabled = false;",
			"missing required setting when inference is enabled");
	check_inference_models(L);
	if (c->inference.nodes) {
		const kiln_cfg_partition *p = kiln_cfg_find_partition(c, c->inference.nodes);
		if (p) {
			for (size_t i = 0; p->members && p->members[i]; i++) {
				ssize_t ni = kiln_cfg__node_index(L, p->members[i]);
				if (ni >= 0)
					c->nodes[ni].inference = c->inference.enabled;
			}
		} else {
			_cleanup_strv_free_ char **v = NULL;
			size_t nv = 0;
			if (kiln_hostlist_expand(c->inference.nodes, &v, &nv, NULL) < 0)
				kiln_cfg__root_error(L, "inference.nodes", NULL,
						     "\"%s\" is neither a partition nor a hostlist",
						     c->inference.nodes);
			else {
				int line = kiln_cfg__root_line(L, "inference.nodes");
				for (size_t i = 0; i < nv; i++) {
					ssize_t ni = kiln_cfg__listed_node(L, v[i], line,
									   "inference.nodes",
									   "node or partition");
					if (ni >= 0)
						c->nodes[ni].inference = c->inference.enabled;
				}
			}
		}
	} else
		for (size_t i = 0; i < c->n_nodes; i++)
			c->nodes[i].inference = c->inference.enabled;
	check_inference_dtype(L);
	check_inference_overlap(L);
	check_inference_open(L);
}

/* An address only this host can reach: 127.0.0.0/8, ::1 or an IPv4-mapped
 * 127/8.  Unset is kiln-inferd's default, 127.0.0.1.  Anything else
 * (0.0.0.0, ::, a node's address) takes requests from the network. */
static bool address_is_loopback(const char *a)
{
	struct in_addr v4;
	struct in6_addr v6;
	if (!a)
		return true;
	if (inet_pton(AF_INET, a, &v4) == 1)
		return (ntohl(v4.s_addr) >> 24) == 127;
	if (inet_pton(AF_INET6, a, &v6) != 1)
		return false;
	if (IN6_IS_ADDR_LOOPBACK(&v6))
		return true;
	return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
}

/* kiln-inferd serving the network without keys answers anyone who reaches
 * the port, with the nodes' GPUs.  That may be meant (a closed cluster
 * network), so it is a warning, an error under `kiln check --strict`. */
static void check_inference_open(loader *L)
{
	const kiln_cfg_inference *in = &L->cfg->inference;
	if (!in->enabled || in->api_keys_file || address_is_loopback(in->address))
		return;
	kiln_cfg__add_warning(L, kiln_cfg__root_line(L, "inference.address"), "inference.address",
			      "set inference.api_keys_file (docs/kiln-inferd.md, \"API keys\"), or "
			      "bind a loopback address",
			      "kiln-inferd listens on %s without inference.api_keys_file: anyone "
			      "on the network who reaches port %d can use the models",
			      in->address, in->port);
}

/* inference.dtype is kiln-inferd's word for the weights; the older
 * inference.quant may say the same (int8 = i8, int4 = q4) or stay "none",
 * never something else. */
static void check_inference_dtype(loader *L)
{
	const kiln_cfg_inference *in = &L->cfg->inference;
	static const kiln_cfg_dtype same[] = {
		[KILN_QUANT_INT8] = KILN_DTYPE_I8, [KILN_QUANT_INT4] = KILN_DTYPE_Q4
	};
	if (in->quant == KILN_QUANT_NONE || in->dtype == KILN_DTYPE_F32 ||
	    in->dtype == KILN_DTYPE_AUTO || in->dtype == same[in->quant])
		return;
	kiln_cfg__root_error(L, "inference.quant",
			     "drop quant and keep dtype (kiln-inferd's word for the weights)",
			     "quant = \"%s\" disagrees with dtype = \"%s\"",
			     kiln_cfg_quant_to_string(in->quant),
			     kiln_cfg_dtype_to_string(in->dtype));
}

/* An inference node's GPUs belong to kiln-inferd: Slurm must not hand them
 * to jobs too.  kiln refuses the overlap rather than rewriting what Slurm
 * sees: a node with GPUs that serves inference may be in no Slurm partition
 * but the one inference.nodes names (that one is the inference nodes' own,
 * listed for sinfo; docs/config.md, "inference"). */
static void check_inference_overlap(loader *L)
{
	const kiln_cfg *c = L->cfg;
	if (!c->inference.enabled)
		return;
	for (size_t i = 0; i < c->n_nodes; i++) {
		const kiln_cfg_node *n = &c->nodes[i];
		if (!n->inference || !n->group || n->group->gpu_count == 0)
			continue;
		for (size_t j = 0; j < c->slurm.n_partitions; j++) {
			const kiln_cfg_partition *p = &c->slurm.partitions[j];
			if (c->inference.nodes && streq(p->name, c->inference.nodes))
				continue;
			for (size_t m = 0; p->members && m < p->n_members; m++) {
				if (!streq(p->members[m], n->name))
					continue;
				char path[64];
				snprintf(path, sizeof(path), "slurm.partitions[%zu]", j);
				kiln_cfg__add_error(
					L, kiln_cfg__setting_line(L->part_set[j]), path,
					"take it out of the partition, or out of inference.nodes",
					"partition \"%s\" hands %s's GPUs to Slurm jobs, but %s "
					"serves inference (inference.nodes)",
					p->name, n->name, n->name);
				break;
			}
		}
	}
}
