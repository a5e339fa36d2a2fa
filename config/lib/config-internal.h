/* config-internal.h — what the files of libkiln-config share but callers do
 * not see.
 *
 * Loading a cluster file is one pass over libconfig's tree (load.c, with
 * values.c turning each setting into a typed field) and then the checks one
 * key alone cannot make, one file per concern: check-network.c (cluster
 * identity, subnet, head), check-nodes.c (node groups, hostlists, addresses,
 * MACs, duplicates), check-partitions.c, check-services.c (slurm, health,
 * launcher, inference and image sections), check-topology.c (the switch
 * tree), check-accounting.c (accounting, logging, time), with the name rules they share
 * in names.c.  derive.c then fills the defaults written "(...)" in the
 * schema, which depend on other keys.  Every pass reports through
 * kiln_cfg__add_error() into the loader's error list (errors.c). */
#pragma once

#include <libconfig.h>
#include <stdarg.h>
#include <sys/types.h>

#include "kiln/config.h"

/* Which struct a schema key's offset is relative to. */
enum {
	BASE_NONE,   /* containers and keys stored by hand (addresses, macs) */
	BASE_ROOT,   /* kiln_cfg */
	BASE_GROUP,  /* kiln_cfg_group */
	BASE_PART,   /* kiln_cfg_partition */
	BASE_XID,    /* kiln_cfg_xid */
	BASE_SWITCH, /* kiln_cfg_switch */
	BASE_MODEL,  /* kiln_cfg_model */
	BASE_USER,   /* kiln_cfg_user */
	BASE_UGROUP, /* kiln_cfg_unix_group */
	BASE_MOUNT,  /* kiln_cfg_mount */
};

/* The schema key after k (the first when k is NULL) stored relative to base,
 * or NULL: for (k = NULL; (k = kiln_cfg__next_key(BASE_ROOT, k));) ... */
const kiln_cfg_key *kiln_cfg__next_key(int base, const kiln_cfg_key *k);

/* ---- the loader: one load's state, shared by every pass ---------------- */

typedef struct loader {
	kiln_cfg *cfg;
	kiln_cfg_errors *errs;
	const char *file;
	int oom;
	config_setting_t **group_set; /* node_groups[i] */
	config_setting_t **addr_set;  /* node_groups[i].addresses */
	config_setting_t **mac_set;   /* node_groups[i].macs */
	config_setting_t **part_set;  /* slurm.partitions[i] */
	config_setting_t **xid_set;
	config_setting_t **model_set; /* inference.models[i] */
	config_t *lc;
	bool nodes_incomplete; /* some group's hosts are unknown: skip "unknown node" errors */
	int last_line;	       /* where a missing top-level section is reported: the end */
	size_t *name_idx;  /* node indexes sorted by name (then index): kiln_cfg__node_index() */
	char **node_names; /* every node's name, borrowed (NULL-terminated): "did you mean" */
	config_setting_t **switch_set; /* topology.switches[i] */
	config_setting_t **user_set;   /* users[i] */
	config_setting_t **ugroup_set; /* groups[i] */
	config_setting_t **mount_set;  /* mounts[i] */
} loader;

/* ---- errors.c: the error list ----------------------------------------- */

/* Appends "FILE:LINE: path: message; hint" to L's list (sets L->oom when it
 * cannot; counts it as dropped beyond KILN_CFG_ERRORS_MAX). */
void kiln_cfg__add_error(loader *L, int line, const char *path, const char *hint, const char *fmt,
			 ...) _printf_(5, 6);
void kiln_cfg__add_errorv(loader *L, int line, const char *path, const char *hint, const char *fmt,
			  va_list ap) _printf_(5, 0);
/* The error for a top-level key, at its line: root_error(L, "a.b", ...). */
void kiln_cfg__root_error(loader *L, const char *path, const char *hint, const char *fmt, ...)
	_printf_(4, 5);
/* The error for key of list element list[i] ("node_groups[2].hosts"), at
 * key's line inside the element (the element's line when key is unset). */
void kiln_cfg__member_error(loader *L, const char *list, size_t i, config_setting_t *elem,
			    const char *key, const char *hint, const char *fmt, ...) _printf_(7, 8);
/* The error for element i of array arr at path ("...macs[2]"), at its line. */
void kiln_cfg__elem_error(loader *L, config_setting_t *arr, const char *path, size_t i,
			  const char *hint, const char *fmt, ...) _printf_(6, 7);
/* A warning: listed like an error, prefixed "warning: ", but the file
 * still loads (kiln check --strict makes it fail). */
void kiln_cfg__add_warning(loader *L, int line, const char *path, const char *hint, const char *fmt,
			   ...) _printf_(5, 6);
/* Removes the warnings from index from on (a file with errors shows only
 * its errors: warnings about a file that does not load are noise). */
void kiln_cfg__errors_drop_warnings(kiln_cfg_errors *e, size_t from);
/* The errors (not warnings) in e from index from on, dropped ones included. */
size_t kiln_cfg__errors_count(const kiln_cfg_errors *e, size_t from);
bool kiln_cfg__errors_full(loader *L);
/* Errors come from several passes; puts those from index from on in file
 * order (stable). */
void kiln_cfg__errors_sort(kiln_cfg_errors *e, size_t from);

/* Lines of libconfig settings, 0 when unknown. */
static inline int kiln_cfg__setting_line(const config_setting_t *s)
{
	return s ? (int) config_setting_source_line(s) : 0;
}
/* parent.name's line, else parent's. */
int kiln_cfg__member_line(config_setting_t *parent, const char *name);
/* arr[i]'s line, else arr's. */
int kiln_cfg__elem_line(config_setting_t *arr, size_t i);
/* The line of a setting by its full path ("health.interval"), 0 when unset. */
int kiln_cfg__root_line(loader *L, const char *path);

/* ---- values.c: one setting -> its typed field ----------------------- */

const kiln_cfg_key *kiln_cfg__find_key(const char *pattern);
/* Where a key's value lives inside obj (NULL for BASE_NONE). */
void *kiln_cfg__field(const kiln_cfg_key *k, void *obj);
/* Sets every key of base in obj to its schema default (-ENOMEM only). */
int kiln_cfg__apply_defaults(int base, void *obj);
/* "an integer", "a duration (...)": what a key's type is written as. */
const char *kiln_cfg__expected_text(kiln_cfg_type t);
/* "a group", "an array": what libconfig read. */
const char *kiln_cfg__lc_type_text(int t);
/* An array of strings for a key of type (STRV, IPV4_LIST, ADDRESSES, MACS):
 * reports anything else as the wrong type.  0, -EINVAL (reported) or
 * -ENOMEM (L->oom set). */
int kiln_cfg__read_string_array(loader *L, config_setting_t *s, const char *disp,
				kiln_cfg_type type, char ***ret);
/* Parses setting s for key k into its field in obj, reporting at disp. */
void kiln_cfg__parse_value(loader *L, const kiln_cfg_key *k, config_setting_t *s, const char *disp,
			   void *obj);

/* ---- names.c: what names and unquoted words may look like ------------ */

#define KILN_CFG_NAME_HINT "use 1 to 63 lowercase letters, digits, '-' and '_'"
#define KILN_CFG_HOST_NAME_HINT \
	"use 1 to 63 lowercase letters, digits and '-', not starting or ending with '-'"
/* Cluster, group and partition names. */
bool kiln_cfg__valid_name(const char *s);
/* One lowercase RFC 1123 label. */
bool kiln_cfg__valid_host_name(const char *s);
/* An RFC 1123 domain. */
bool kiln_cfg__valid_domain(const char *s);
bool kiln_cfg__has_bad_char(const char *v, const char *extra);
/* Reports a word that is empty or has characters other than letters,
 * digits and extra (v may be NULL: unset). */
void kiln_cfg__check_word(loader *L, int line, const char *path, const char *v, const char *extra);
/* check_word() for a string key of the root: check_root_word(L, "slurm.user", "._-"). */
void kiln_cfg__check_root_word(loader *L, const char *path, const char *extra);
/* "did you mean 'X'?" for the candidate nearest to name, or NULL. */
char *kiln_cfg__hint_from(const char *name, char *const *cands);

/* ---- the checks, in the order load.c runs them -------------------------
 * Those returning int stop the rest on < 0 (out of memory: L->oom is set;
 * too many nodes: reported). */

/* check-network.c */
void kiln_cfg__check_cluster_name(loader *L);
void kiln_cfg__check_network_words(loader *L); /* cluster.domain, network.boot_interface */
void kiln_cfg__check_network(loader *L);       /* head and gateway addresses, head.hostname */
/* An address that must be a usable host address of network.subnet. */
void kiln_cfg__check_address(loader *L, uint32_t a, int line, const char *path);
bool kiln_cfg__usable_address(const kiln_cfg *c, uint32_t a);

/* check-services.c */
void kiln_cfg__check_durations(loader *L);
void kiln_cfg__check_service_words(loader *L); /* slurm plugin names, listen addresses */
void kiln_cfg__check_image(loader *L);
void kiln_cfg__check_health(loader *L); /* health.* and launcher.* across keys */
void kiln_cfg__check_inference(loader *L);

/* check-nodes.c */
void kiln_cfg__check_group_words(loader *L);
int kiln_cfg__check_nodes(loader *L); /* expand groups into cfg->nodes, find duplicates */
/* The first node called name, or -1 (after kiln_cfg__check_nodes()). */
ssize_t kiln_cfg__node_index(loader *L, const char *name);
/* kiln_cfg__node_index(), reporting an unknown name ("unknown WHAT \"name\"",
 * with a "did you mean") unless some nodes are unknown or the list is full. */
ssize_t kiln_cfg__listed_node(loader *L, const char *name, int line, const char *path,
			      const char *what);
/* Expands a hostlist, reporting why it cannot be (-EINVAL, -E2BIG, -ENOMEM). */
int kiln_cfg__expand_hostlist(loader *L, int line, const char *path, const char *s, char ***ret,
			      size_t *ret_n);

/* check-partitions.c */
int kiln_cfg__check_partitions(loader *L);

/* check-topology.c: topology.switches (names, members, one tree) */
void kiln_cfg__check_topology(loader *L);
/* check-accounting.c: the password file, dbd_host's default */
void kiln_cfg__check_accounting(loader *L);
void kiln_cfg__check_logging(loader *L); /* logging.url, time.servers */

/* check-users.c: users[], groups[], mounts[] and inference.allow_groups
 * (names, ids, clashes, paths); fills each user's derived gid and home. */
void kiln_cfg__check_users(loader *L);
/* A POSIX login or group name as useradd takes it: [a-z_][a-z0-9_-]*, at
 * most 32. */
bool kiln_cfg__valid_account_name(const char *s);

/* derive.c: defaults that depend on other keys, once the file is good. */
void kiln_cfg__derive(loader *L);
