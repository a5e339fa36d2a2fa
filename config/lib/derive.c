/* derive.c — the defaults that depend on other keys.
 *
 * The schema (schema.c) writes these in parentheses: "(head.address)",
 * "(cluster.name)", "(from model)", "(sockets x cores_per_socket x
 * threads_per_core)", "(http://HEAD_ADDRESS/kiln)".  Every other default is
 * applied from the schema table itself before the file is read; these are
 * filled here, after the checks, for the keys the file leaves unset.  Each
 * rule is written once, here, and read by render.c and every program
 * through the kiln_cfg. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <ctype.h>

#include "config-internal.h"
#include "kiln/parse.h"

/* inference.models: what an element leaves out comes from the section's
 * flat key of the same name; the flat shorthand (inference.model, name,
 * tokenizer ...) becomes a one-element list, so kiln-inferd and kiln check
 * read one list either way.  The older inference.quant says int8/int4
 * where dtype stays f32 or auto (check_inference_dtype refuses them
 * disagreeing). */
static void derive_models(loader *L)
{
	kiln_cfg_inference *in = &L->cfg->inference;
	kiln_cfg_dtype dt = in->dtype;
	const bool plain = dt == KILN_DTYPE_F32 || dt == KILN_DTYPE_AUTO;
	if (plain && in->quant == KILN_QUANT_INT8)
		dt = KILN_DTYPE_I8;
	else if (plain && in->quant == KILN_QUANT_INT4)
		dt = KILN_DTYPE_Q4;
	bool flat = false;
	if (in->n_models == 0 && in->model) {
		free(in->models);
		if (!(in->models = calloc(1, sizeof(*in->models)))) {
			L->oom = 1;
			return;
		}
		in->n_models = 1;
		in->models[0].line = kiln_cfg__root_line(L, "inference.model");
		if (!(in->models[0].path = strdup(in->model)) ||
		    (in->name && !(in->models[0].name = strdup(in->name)))) {
			L->oom = 1;
			return;
		}
		flat = true;
	}
	for (size_t i = 0; i < in->n_models; i++) {
		kiln_cfg_model *m = &in->models[i];
		config_setting_t *e = flat ? NULL : L->model_set[i];
#define UNSET(key) (!e || !config_setting_get_member(e, key))
		if (UNSET("tokenizer") && in->tokenizer &&
		    !(m->tokenizer = strdup(in->tokenizer))) {
			L->oom = 1;
			return;
		}
		if (UNSET("dtype"))
			m->dtype = dt;
		if (UNSET("chat_template"))
			m->chat_template = in->chat_template;
		if (UNSET("context_length"))
			m->context_length = in->context_length;
		if (UNSET("kv_blocks"))
			m->kv_blocks = in->kv_blocks;
#undef UNSET
		if (!m->name && m->path) { /* no path: reported missing already */
			const char *slash = strrchr(m->path, '/');
			if (!(m->name = strdup(slash && slash[1] ? slash + 1 : m->path))) {
				L->oom = 1;
				return;
			}
		}
	}
}

void kiln_cfg__derive(loader *L)
{
	kiln_cfg *c = L->cfg;
	char b1[16];

	/* network.gateway and network.dns: the head node. */
	if (!c->network.gateway)
		c->network.gateway = c->head.address;
	if (c->network.n_dns == 0 && c->head.address) {
		free(c->network.dns);
		c->network.dns = calloc(2, sizeof(uint32_t));
		if (!c->network.dns) {
			L->oom = 1;
			return;
		}
		c->network.dns[0] = c->head.address;
		c->network.n_dns = 1;
	}

	/* node_groups[].gpus.type from the model, cpus from the topology. */
	for (size_t gi = 0; gi < c->n_groups; gi++) {
		kiln_cfg_group *g = &c->groups[gi];
		if (g->gpu_count > 0 && !g->gpu_type && g->gpu_model) {
			g->gpu_type = kiln_cfg_gpu_type_from_model(g->gpu_model);
			if (!g->gpu_type) {
				L->oom = 1;
				return;
			}
		}
		if (g->cpus == 0)
			g->cpus = g->sockets * g->cores_per_socket * g->threads_per_core;
		/* GPU-to-socket: the even split (HGX) unless socket_map says */
		if (!g->gpu_socket_map) {
			bool even = g->sockets > 1 && g->gpu_count % g->sockets == 0;
			for (int k = 0; k < g->gpu_count && k < KILN_CFG_GPUS_MAX; k++)
				g->gpu_socket[k] = even ? k / (g->gpu_count / g->sockets) : -1;
		}
	}

	/* Gres types are case-sensitive in Slurm: "H100" beside "h100" makes two
	 * types, and --gres=gpu:h100 never lands on the "H100" nodes. */
	for (size_t gi = 0; gi < c->n_groups; gi++) {
		const kiln_cfg_group *g = &c->groups[gi];
		if (g->gpu_count <= 0 || !g->gpu_type)
			continue;
		for (size_t j = 0; j < gi; j++) {
			const kiln_cfg_group *o = &c->groups[j];
			if (o->gpu_count <= 0 || !o->gpu_type || streq(o->gpu_type, g->gpu_type) ||
			    strcasecmp(o->gpu_type, g->gpu_type) != 0)
				continue;
			config_setting_t *gs = L->group_set[gi];
			config_setting_t *gp = gs ? config_setting_get_member(gs, "gpus") : NULL;
			char p[96], h[160];
			snprintf(p, sizeof(p), "node_groups[%zu].gpus.type", gi);
			snprintf(h, sizeof(h), "write the same case in both groups (\"%s\")",
				 o->gpu_type);
			kiln_cfg__add_warning(
				L, gp ? kiln_cfg__member_line(gp, "type") : g->line, p, h,
				"GPU type \"%s\" differs only in case from \"%s\" of group \"%s\" "
				"(line %d): Slurm sees two types, and --gres=gpu:%s never matches "
				"these nodes",
				g->gpu_type, o->gpu_type, strempty(o->name), o->line, o->gpu_type);
			break;
		}
	}

	/* DefMemPerGPU / DefCpuPerGPU: the GPU group with the least per GPU,
	 * so the default fits on every GPU node (a job without --mem must not
	 * take a whole 8-GPU node's memory for one GPU). */
	bool mem_set = config_lookup(L->lc, "slurm.def_mem_per_gpu") != NULL;
	bool cpu_set = config_lookup(L->lc, "slurm.def_cpu_per_gpu") != NULL, cpu_none = false;
	for (size_t gi = 0; gi < c->n_groups; gi++) {
		const kiln_cfg_group *g = &c->groups[gi];
		if (g->gpu_count <= 0)
			continue;
		uint64_t mem = g->memory_mb / (uint64_t) g->gpu_count;
		int cpu = g->cpus / g->gpu_count;
		if (!mem_set && (!c->slurm.def_mem_per_gpu_mb || mem < c->slurm.def_mem_per_gpu_mb))
			c->slurm.def_mem_per_gpu_mb = MAX(mem, (uint64_t) 1);
		if (!cpu_set && cpu == 0)
			cpu_none = true; /* fewer CPUs than GPUs: no default fits a full node */
		else if (!cpu_set && (!c->slurm.def_cpu_per_gpu || cpu < c->slurm.def_cpu_per_gpu))
			c->slurm.def_cpu_per_gpu = cpu;
	}
	if (cpu_none)
		c->slurm.def_cpu_per_gpu = 0;

	/* slurm.cluster_name and image.http_url. */
	if (!c->slurm.cluster_name && c->cluster.name &&
	    !(c->slurm.cluster_name = strdup(c->cluster.name)))
		L->oom = 1;
	if (!c->image.http_url && asprintf(&c->image.http_url, "http://%s/kiln",
					   kiln_format_ipv4(b1, c->head.address)) < 0) {
		c->image.http_url = NULL;
		L->oom = 1;
	}
	derive_models(L);
}

char *kiln_cfg_gpu_type_from_model(const char *model)
{
	if (!model)
		return NULL;
	/* The first word with a digit that is not a vendor or memory size:
	 * "NVIDIA H100 80GB HBM3" -> h100, "Tesla V100-SXM2-32GB" -> v100. */
	const char *p = model;
	while (*p) {
		while (*p && !isalnum((unsigned char) *p))
			p++;
		const char *w = p;
		while (*p && isalnum((unsigned char) *p))
			p++;
		size_t l = (size_t) (p - w);
		bool digit = false, alpha = false;
		for (size_t i = 0; i < l; i++) {
			if (isdigit((unsigned char) w[i]))
				digit = true;
			else
				alpha = true;
		}
		if (l && digit && alpha) {
			char *s = strndup(w, l);
			if (!s)
				return NULL;
			for (char *q = s; *q; q++)
				*q = (char) tolower((unsigned char) *q);
			return s;
		}
	}
	/* No model number: the whole name, lowercased, non-alnum dropped. */
	char *s = malloc(strlen(model) + 4);
	if (!s)
		return NULL;
	size_t j = 0;
	for (const char *q = model; *q; q++)
		if (isalnum((unsigned char) *q))
			s[j++] = (char) tolower((unsigned char) *q);
	if (j == 0)
		s[j++] = 'g', s[j++] = 'p', s[j++] = 'u';
	s[j] = 0;
	return s;
}
