/* diff.c — which keys of the cluster file differ between two loaded files.
 *
 * `kiln apply` (config/cli/apply.c) decides what a change needs (a Slurm
 * reconfigure, a daemon restart, a new node image) from two sources: the
 * rendered Slurm files, compared line by line, and this list of the
 * schema's scalar keys whose loaded values differ.  Comparing loaded values,
 * not text, means a reformatted file or a default written out changes
 * nothing.  Node groups and partitions are lists; they reach the nodes only
 * through slurm.conf, gres.conf and the other renders, so their changes are
 * left to the render comparison (except health.xid, which no render shows). */
#include <errno.h>
#include <string.h>

#include "config-internal.h"
#include "kiln/strbuf.h"

static bool str_eq(const char *a, const char *b)
{
	return (!a && !b) || (a && b && streq(a, b));
}

static bool strv_eq(char *const *a, char *const *b)
{
	size_t n = strv_length(a);
	if (n != strv_length(b))
		return false;
	for (size_t i = 0; i < n; i++)
		if (!streq(a[i], b[i]))
			return false;
	return true;
}

/* true when key k holds the same value in a and b */
static bool same(const kiln_cfg_key *k, const kiln_cfg *a, const kiln_cfg *b)
{
	const void *x = kiln_cfg__field(k, (void *) a), *y = kiln_cfg__field(k, (void *) b);
	switch (k->type) {
	case KILN_CFG_STRING:
	case KILN_CFG_PATH:
	case KILN_CFG_HOSTLIST:
		return str_eq(*(char *const *) x, *(char *const *) y);
	case KILN_CFG_INT:
	case KILN_CFG_ENUM:
	case KILN_CFG_NPROC:
		return *(const int *) x == *(const int *) y;
	case KILN_CFG_NNODES: /* MIN, MAX side by side */
		return memcmp(x, y, 2 * sizeof(int)) == 0;
	case KILN_CFG_BOOL:
		return *(const bool *) x == *(const bool *) y;
	case KILN_CFG_DOUBLE:
		return *(const double *) x == *(const double *) y;
	case KILN_CFG_DURATION:
	case KILN_CFG_SIZE_MB:
		return *(const uint64_t *) x == *(const uint64_t *) y;
	case KILN_CFG_IPV4:
		return *(const uint32_t *) x == *(const uint32_t *) y;
	case KILN_CFG_CIDR:
		return a->network.subnet == b->network.subnet &&
		       a->network.prefix == b->network.prefix;
	case KILN_CFG_STRV:
		return strv_eq(*(char **const *) x, *(char **const *) y);
	case KILN_CFG_IPV4_LIST: /* only network.dns */
		return a->network.n_dns == b->network.n_dns &&
		       memcmp(a->network.dns, b->network.dns,
			      a->network.n_dns * sizeof(uint32_t)) == 0;
	default:
		return true;
	}
}

static bool xids_same(const kiln_cfg *a, const kiln_cfg *b)
{
	if (a->health.n_xids != b->health.n_xids)
		return false;
	for (size_t i = 0; i < a->health.n_xids; i++)
		if (a->health.xids[i].xid != b->health.xids[i].xid ||
		    a->health.xids[i].action != b->health.xids[i].action)
			return false;
	return true;
}

/* users[], groups[], mounts[]: element by element (kiln-node-init applies
 * them; kiln apply re-runs it). */
static bool users_same(const kiln_cfg *a, const kiln_cfg *b)
{
	if (a->n_users != b->n_users)
		return false;
	for (size_t i = 0; i < a->n_users; i++) {
		const kiln_cfg_user *x = &a->users[i], *y = &b->users[i];
		if (!streq_ptr(x->name, y->name) || x->uid != y->uid || x->gid != y->gid ||
		    !strv_eq(x->groups, y->groups) || !streq_ptr(x->home, y->home) ||
		    !streq_ptr(x->shell, y->shell) || !streq_ptr(x->comment, y->comment))
			return false;
	}
	return true;
}

static bool groups_same(const kiln_cfg *a, const kiln_cfg *b)
{
	if (a->n_unix_groups != b->n_unix_groups)
		return false;
	for (size_t i = 0; i < a->n_unix_groups; i++)
		if (!streq_ptr(a->unix_groups[i].name, b->unix_groups[i].name) ||
		    a->unix_groups[i].gid != b->unix_groups[i].gid)
			return false;
	return true;
}

static bool mounts_same(const kiln_cfg *a, const kiln_cfg *b)
{
	if (a->n_mounts != b->n_mounts)
		return false;
	for (size_t i = 0; i < a->n_mounts; i++) {
		const kiln_cfg_mount *x = &a->mounts[i], *y = &b->mounts[i];
		if (!streq_ptr(x->what, y->what) || !streq_ptr(x->where, y->where) ||
		    !streq_ptr(x->type, y->type) || !streq_ptr(x->options, y->options) ||
		    x->required != y->required || x->timeout_usec != y->timeout_usec)
			return false;
	}
	return true;
}

int kiln_cfg_diff_keys(const kiln_cfg *a, const kiln_cfg *b, char ***ret)
{
	assert_return(a, -EINVAL);
	assert_return(b, -EINVAL);
	assert_return(ret, -EINVAL);
	_cleanup_strv_free_ char **v = NULL;
	for (const kiln_cfg_key *k = NULL; (k = kiln_cfg__next_key(BASE_ROOT, k));)
		if (!same(k, a, b) && strv_extend(&v, k->path) < 0)
			return -ENOMEM;
	if (!xids_same(a, b) && strv_extend(&v, "health.xid") < 0)
		return -ENOMEM;
	if ((!users_same(a, b) && strv_extend(&v, "users") < 0) ||
	    (!groups_same(a, b) && strv_extend(&v, "groups") < 0) ||
	    (!mounts_same(a, b) && strv_extend(&v, "mounts") < 0))
		return -ENOMEM;
	*ret = TAKE_PTR(v);
	return 0;
}
