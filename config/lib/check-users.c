/* check-users.c — users[], groups[], mounts[] and the inference partitions.
 *
 * A cluster many people share needs the same accounts on every node (a job
 * runs as the submitting uid, and slurmd must resolve it), the same shared
 * filesystems, and the inference nodes' GPUs kept away from users' jobs.
 * The accounts are rendered as a sysusers.d file with fixed ids (render.c,
 * kiln render sysusers), so every clash systemd-sysusers would meet at boot
 * on a node, far from the admin, is an error here: bad names, duplicate
 * names or ids, ids in Debian's system or reserved ranges, names of the
 * image's own system accounts, a primary or supplementary group that is not
 * defined.  Mounts become systemd units named after the mount point
 * (kiln render mounts), so the mount point must be a normalized absolute
 * path, unique, and not a directory the system itself needs.  Last, the
 * partitions that hold an inference node get inference.allow_groups as
 * AllowGroups=: a partition's own extra setting the same key is an error,
 * and a partition mixing inference and other nodes a warning (its other
 * nodes are closed too). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config-internal.h"
#include "kiln/parse.h"

/* useradd's and systemd-sysusers' limit on a name (utmp's ut_user). */
#define ACCOUNT_NAME_MAX 32

/* Accounts the node image has of its own (Debian's base system, systemd,
 * the packages kiln installs): a cluster user of that name would take over
 * a daemon's identity or be refused by systemd-sysusers at boot. */
static const char *const image_accounts[] = {
	"root",
	"daemon",
	"bin",
	"sys",
	"sync",
	"games",
	"man",
	"lp",
	"mail",
	"news",
	"uucp",
	"proxy",
	"www-data",
	"backup",
	"list",
	"irc",
	"gnats",
	"nobody",
	"nogroup",
	"_apt",
	"messagebus",
	"systemd-network",
	"systemd-resolve",
	"systemd-timesync",
	"systemd-journal",
	"systemd-journal-remote",
	"systemd-journal-upload",
	"systemd-coredump",
	"sshd",
	"munge",
	"slurm",
	"kiln",
	"kiln-inferd",
	"kiln-healthd",
	"nvidia-persistenced",
	"tty",
	"disk",
	"kmem",
	"dialout",
	"video",
	"render",
	"audio",
	"adm",
	"sudo",
	"staff",
	"users",
	"input",
	"kvm",
	"utmp",
	"shadow",
	"operator",
	"cdrom",
	"floppy",
	"tape",
	"voice",
	"plugdev",
	"netdev",
	"src",
	NULL,
};

/* Mount points a shared filesystem must not cover: the system's own. */
static const char *const system_dirs[] = {
	"/bin",	 "/boot", "/dev", "/etc",     "/lib",	  "/lib64",	"/proc", "/run",
	"/sbin", "/sys",  "/usr", "/var/lib", "/var/log", "/var/spool", "/tmp",	 NULL,
};

bool kiln_cfg__valid_account_name(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n > ACCOUNT_NAME_MAX)
		return false;
	if (!((s[0] >= 'a' && s[0] <= 'z') || s[0] == '_'))
		return false;
	for (const char *p = s; *p; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_' ||
		      *p == '-'))
			return false;
	return true;
}

#define NAME_HINT                                                                            \
	"start with a lowercase letter or '_', then lowercase letters, digits, '_' and '-' " \
	"(at most 32)"

static bool is_image_account(const char *name)
{
	for (size_t i = 0; image_accounts[i]; i++)
		if (streq(image_accounts[i], name))
			return true;
	return false;
}

/* An id's range: Debian's system ids need system = true, the reserved
 * block is refused. */
static void check_id(loader *L, const char *list, size_t i, config_setting_t *e, const char *key,
		     int id, bool system)
{
	if (id <= 0)
		return; /* unset or out of range: reported already */
	if (id <= KILN_CFG_ID_SYSTEM_MAX && !system)
		kiln_cfg__member_error(L, list, i, e, key,
				       "pick an id from 1000 to 59999, or add system = true if "
				       "this low id is your site's on purpose",
				       "%d is a system id (below 1000: Debian's own accounts, "
				       "such as the image's munge and slurm)",
				       id);
	else if (id >= KILN_CFG_ID_RESERVED_FIRST && id <= KILN_CFG_ID_RESERVED_LAST)
		kiln_cfg__member_error(L, list, i, e, key,
				       "pick an id from 1000 to 59999, or above 65535",
				       "%d is in the reserved range 60000-65535 (Debian's, "
				       "systemd's DynamicUser=, nobody)",
				       id);
}

static ssize_t find_group(const kiln_cfg *c, const char *name)
{
	for (size_t i = 0; i < c->n_unix_groups; i++)
		if (c->unix_groups[i].name && streq(c->unix_groups[i].name, name))
			return (ssize_t) i;
	return -1;
}

static ssize_t find_gid(const kiln_cfg *c, int gid)
{
	for (size_t i = 0; i < c->n_unix_groups; i++)
		if (c->unix_groups[i].gid == gid)
			return (ssize_t) i;
	return -1;
}

static void check_groups(loader *L)
{
	kiln_cfg *c = L->cfg;
	for (size_t i = 0; i < c->n_unix_groups; i++) {
		const kiln_cfg_unix_group *g = &c->unix_groups[i];
		config_setting_t *e = L->ugroup_set[i];
		if (!e)
			continue;
		if (g->name && !kiln_cfg__valid_account_name(g->name))
			kiln_cfg__member_error(L, "groups", i, e, "name", NAME_HINT,
					       "invalid group name \"%s\"", g->name);
		else if (g->name && is_image_account(g->name))
			kiln_cfg__member_error(L, "groups", i, e, "name", "pick another name",
					       "\"%s\" is a group of the node image itself",
					       g->name);
		check_id(L, "groups", i, e, "gid", g->gid, g->system);
		for (size_t j = 0; j < i; j++) {
			const kiln_cfg_unix_group *o = &c->unix_groups[j];
			if (g->name && o->name && streq(g->name, o->name))
				kiln_cfg__member_error(L, "groups", i, e, "name", NULL,
						       "duplicate group \"%s\" (also on line %d)",
						       g->name, o->line);
			if (g->gid > 0 && g->gid == o->gid)
				kiln_cfg__member_error(L, "groups", i, e, "gid", NULL,
						       "gid %d is also group \"%s\"'s (line %d)",
						       g->gid, strempty(o->name), o->line);
		}
	}
}

static void check_user(loader *L, size_t i)
{
	kiln_cfg *c = L->cfg;
	kiln_cfg_user *u = &c->users[i];
	config_setting_t *e = L->user_set[i];
	if (!e)
		return;
	if (u->name && !kiln_cfg__valid_account_name(u->name))
		kiln_cfg__member_error(L, "users", i, e, "name", NAME_HINT,
				       "invalid user name \"%s\"", u->name);
	else if (u->name && is_image_account(u->name))
		kiln_cfg__member_error(L, "users", i, e, "name", "pick another name",
				       "\"%s\" is an account of the node image itself", u->name);
	check_id(L, "users", i, e, "uid", u->uid, u->system);
	for (size_t j = 0; j < i; j++) {
		const kiln_cfg_user *o = &c->users[j];
		if (u->name && o->name && streq(u->name, o->name))
			kiln_cfg__member_error(L, "users", i, e, "name", NULL,
					       "duplicate user \"%s\" (also on line %d)", u->name,
					       o->line);
		if (u->uid > 0 && u->uid == o->uid)
			kiln_cfg__member_error(L, "users", i, e, "uid", NULL,
					       "uid %d is also user \"%s\"'s (line %d)", u->uid,
					       strempty(o->name), o->line);
	}
	if (u->uid <= 0 || !u->name)
		return;

	/* The primary group: the user's own (named after the user, gid = uid:
	 * what sysusers creates for "u NAME UID") or one of groups[]. */
	bool own = config_setting_get_member(e, "gid") == NULL || u->gid == u->uid;
	if (own) {
		ssize_t g = find_group(c, u->name), h = find_gid(c, u->uid);
		if (g >= 0 && c->unix_groups[g].gid != u->uid)
			kiln_cfg__member_error(
				L, "users", i, e, "name",
				"give the user gid = that group's gid, or rename one of them",
				"user \"%s\"'s own group (gid %d, the uid) clashes with group "
				"\"%s\" (gid %d, line %d)",
				u->name, u->uid, u->name, c->unix_groups[g].gid,
				c->unix_groups[g].line);
		else if (h >= 0 && !streq(strempty(c->unix_groups[h].name), u->name))
			kiln_cfg__member_error(
				L, "users", i, e, "uid",
				"set gid = the group's gid to make it the user's primary group, "
				"or pick another uid",
				"user \"%s\"'s own group would take gid %d, which is group "
				"\"%s\"'s "
				"(line %d)",
				u->name, u->uid, strempty(c->unix_groups[h].name),
				c->unix_groups[h].line);
		u->gid = u->uid;
	} else if (find_gid(c, u->gid) < 0) {
		kiln_cfg__member_error(L, "users", i, e, "gid",
				       "add the group to groups, or leave gid out for a group of "
				       "the user's own",
				       "gid %d is not a group of groups[] nor the user's uid",
				       u->gid);
	}
	for (size_t k = 0; u->groups && u->groups[k]; k++) {
		char p[64];
		snprintf(p, sizeof(p), "users[%zu].groups", i);
		config_setting_t *arr = config_setting_get_member(e, "groups");
		if (find_group(c, u->groups[k]) < 0) {
			_cleanup_free_ char *hint = NULL;
			char **names = calloc(c->n_unix_groups + 1, sizeof(char *));
			if (names) {
				for (size_t g = 0; g < c->n_unix_groups; g++)
					names[g] = c->unix_groups[g].name ?: (char *) "";
				hint = kiln_cfg__hint_from(u->groups[k], names);
				free(names);
			}
			kiln_cfg__elem_error(
				L, arr, p, k,
				hint
					?: "add it to groups = ( { name = ...; gid = ...; "
					   "} )",
				"unknown group \"%s\"", u->groups[k]);
		}
		for (size_t j = 0; j < k; j++)
			if (streq(u->groups[j], u->groups[k]))
				kiln_cfg__elem_error(L, arr, p, k, NULL, "\"%s\" is listed twice",
						     u->groups[k]);
	}
	if (u->comment) {
		const char *bad = strpbrk(u->comment, ":\"\\");
		if (bad)
			kiln_cfg__member_error(L, "users", i, e, "comment", NULL,
					       "'%c' cannot be in a GECOS field (\"%s\")", *bad,
					       u->comment);
	}
	if (!u->home) {
		if (asprintf(&u->home, "/home/%s", u->name) < 0) {
			u->home = NULL;
			L->oom = 1;
		}
	}
}

/* A mount point systemd can name a unit after: absolute, no "//", no
 * "." or ".." component, no trailing '/'. */
static bool normalized_path(const char *p)
{
	if (p[0] != '/' || p[1] == 0)
		return false;
	for (const char *s = p; *s;) {
		s++; /* past '/' */
		size_t n = strcspn(s, "/");
		if (n == 0 || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.'))
			return false;
		s += n;
	}
	return true;
}

static void check_mounts(loader *L)
{
	kiln_cfg *c = L->cfg;
	for (size_t i = 0; i < c->n_mounts; i++) {
		const kiln_cfg_mount *m = &c->mounts[i];
		config_setting_t *e = L->mount_set[i];
		if (!e)
			continue;
		if (m->where && streq(m->where, "/"))
			kiln_cfg__member_error(L, "mounts", i, e, "where",
					       "mount the share below /, such as \"/home\"",
					       "the root directory cannot be a shared mount");
		else if (m->where && !normalized_path(m->where))
			kiln_cfg__member_error(L, "mounts", i, e, "where",
					       "write it without a trailing '/', \"//\", \".\" or "
					       "\"..\"",
					       "\"%s\" is not a normalized path", m->where);
		else if (m->where)
			for (size_t k = 0; system_dirs[k]; k++) {
				size_t l = strlen(system_dirs[k]);
				if (strncmp(m->where, system_dirs[k], l) == 0 &&
				    (m->where[l] == 0 || m->where[l] == '/')) {
					kiln_cfg__member_error(
						L, "mounts", i, e, "where",
						"mount shared data somewhere of its own (/home, "
						"/scratch, /srv/...)",
						"\"%s\" is (inside) %s, which the node's system "
						"needs",
						m->where, system_dirs[k]);
					break;
				}
			}
		if (m->what && (!m->what[0] || strpbrk(m->what, " \t\"'\\")))
			kiln_cfg__member_error(L, "mounts", i, e, "what",
					       "write the source without spaces or quotes",
					       "\"%s\" cannot be a unit's What=", m->what);
		char tp[48];
		snprintf(tp, sizeof(tp), "mounts[%zu].type", i);
		kiln_cfg__check_word(L, kiln_cfg__member_line(e, "type"), tp, m->type, "._-");
		if (m->options && (!m->options[0] || strpbrk(m->options, " \t\"'\\")))
			kiln_cfg__member_error(L, "mounts", i, e, "options",
					       "options are comma separated, without spaces",
					       "\"%s\" cannot be a unit's Options=", m->options);
		if (m->timeout_usec < 100 * KILN_USEC_PER_MSEC ||
		    m->timeout_usec > 3600 * KILN_USEC_PER_SEC) {
			char x[32];
			kiln_cfg__member_error(L, "mounts", i, e, "timeout", "use 100ms..1h",
					       "%s is out of range",
					       kiln_format_duration(x, sizeof(x), m->timeout_usec));
		}
		for (size_t j = 0; j < i; j++)
			if (m->where && c->mounts[j].where && streq(m->where, c->mounts[j].where))
				kiln_cfg__member_error(L, "mounts", i, e, "where", NULL,
						       "\"%s\" is mounted twice (also on line %d)",
						       m->where, c->mounts[j].line);
	}
}

/* AllowGroups= of the partitions holding inference nodes. */
static void check_inference_partitions(loader *L)
{
	kiln_cfg *c = L->cfg;
	char **ag = c->inference.allow_groups;
	int line = kiln_cfg__root_line(L, "inference.allow_groups");
	bool all = false;
	for (size_t i = 0; ag && ag[i]; i++) {
		if (streq(ag[i], "ALL"))
			all = true;
		else if (!kiln_cfg__valid_account_name(ag[i]))
			kiln_cfg__add_error(L, line, "inference.allow_groups", NAME_HINT,
					    "invalid group name \"%s\"", ag[i]);
	}
	if (all && ag[1])
		kiln_cfg__add_error(L, line, "inference.allow_groups",
				    "write [ \"ALL\" ] alone, or list the groups",
				    "\"ALL\" with other groups");
	for (size_t pi = 0; pi < c->slurm.n_partitions; pi++) {
		const kiln_cfg_partition *p = &c->slurm.partitions[pi];
		size_t infer = 0;
		const char *first = NULL, *other = NULL;
		for (size_t k = 0; k < p->n_members; k++) {
			const kiln_cfg_node *n = kiln_cfg_find_node(c, p->members[k]);
			if (n && n->inference) {
				infer++;
				first = first ?: n->name;
			} else if (n)
				other = other ?: n->name;
		}
		if (!infer)
			continue;
		if (all) {
			kiln_cfg__add_warning(
				L, line, "inference.allow_groups",
				"remove [ \"ALL\" ] to keep the partition to root",
				"partition \"%s\" is open to every user although kiln-inferd uses "
				"the GPUs of %s: Slurm can hand them to a job",
				p->name, first);
			continue;
		}
		if (p->extra && strcasestr(p->extra, "AllowGroups="))
			kiln_cfg__member_error(
				L, "slurm.partitions", pi, L->part_set[pi], "extra",
				"set inference.allow_groups instead",
				"partition \"%s\" holds inference node %s: kiln sets "
				"its AllowGroups= from inference.allow_groups",
				p->name, first);
		if (other)
			kiln_cfg__add_warning(
				L, p->line, "slurm.partitions",
				"put the inference nodes in a partition of their own",
				"partition \"%s\" mixes inference nodes (%s) with others (%s): all "
				"of "
				"it is closed to users outside inference.allow_groups",
				p->name, first, other);
	}
}

void kiln_cfg__check_users(loader *L)
{
	check_groups(L);
	for (size_t i = 0; i < L->cfg->n_users && !L->oom; i++)
		check_user(L, i);
	check_mounts(L);
	check_inference_partitions(L);
	if (!L->cfg->inference.allow_groups || !L->cfg->inference.allow_groups[0]) {
		/* the default, [ "root" ] (schema.c): an empty array means it too */
		char **v = calloc(2, sizeof(char *));
		if (v)
			v[0] = strdup("root");
		if (!v || !v[0]) {
			free(v);
			L->oom = 1;
			return;
		}
		strv_free(L->cfg->inference.allow_groups);
		L->cfg->inference.allow_groups = v;
	}
}
