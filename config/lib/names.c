/* names.c — what names and unquoted words in the cluster file may look like.
 *
 * Cluster, group, partition and host names, DNS domains, and the words
 * written unquoted into slurm.conf and dnsmasq.conf (plugin names, users,
 * addresses): the rules every check shares, and the "did you mean" hint
 * for a name that is not one of the known ones. */
#include <assert.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config-internal.h"
#include "kiln/parse.h"

#define DNS_NAME_MAX  253 /* RFC 1035, without the final dot */
#define DNS_LABEL_MAX 63
#define NAME_MAX_LEN  63 /* cluster, group and partition names */

char *kiln_cfg__hint_from(const char *name, char *const *cands)
{
	const char *best = NULL;
	size_t bd = SIZE_MAX;
	for (char *const *c = cands; c && *c; c++) {
		size_t d = kiln_levenshtein(name, *c);
		if (d < bd) {
			bd = d;
			best = *c;
		}
	}
	char *h = NULL;
	if (best && bd <= MAX((size_t) 2, strlen(name) / 3) &&
	    asprintf(&h, "did you mean '%s'?", best) < 0)
		return NULL;
	return h;
}

bool kiln_cfg__valid_name(const char *s)
{
	if (!s[0] || strlen(s) > NAME_MAX_LEN)
		return false;
	for (const char *p = s; *p; p++)
		if (!(islower((unsigned char) *p) || isdigit((unsigned char) *p) || *p == '-' ||
		      *p == '_'))
			return false;
	return true;
}

/* The first character of v that is neither a letter, a digit nor in extra,
 * or NULL. */
static const char *bad_char(const char *v, const char *extra)
{
	for (const char *p = v; *p; p++)
		if (!isalnum((unsigned char) *p) && !strchr(extra, *p))
			return p;
	return NULL;
}

/* Words that land unquoted in slurm.conf or dnsmasq.conf: letters, digits
 * and the few punctuation characters the format allows (extra). */
void kiln_cfg__check_word(loader *L, int line, const char *path, const char *v, const char *extra)
{
	if (!v)
		return;
	const char *p = bad_char(v, extra);
	if (p)
		kiln_cfg__add_error(L, line, path, NULL, "invalid character '%c' in \"%s\"", *p, v);
	else if (!v[0])
		kiln_cfg__add_error(L, line, path, NULL, "must not be empty");
}

bool kiln_cfg__has_bad_char(const char *v, const char *extra)
{
	return bad_char(v, extra) != NULL;
}

/* An RFC 1123 domain: it lands in dnsmasq.conf, /etc/hosts and every
 * node's FQDN, and dnsmasq --test does not check it. */
bool kiln_cfg__valid_domain(const char *s)
{
	size_t len = strlen(s);
	if (len == 0 || len > DNS_NAME_MAX)
		return false;
	for (const char *l = s;;) {
		size_t n = strcspn(l, ".");
		if (n == 0 || n > DNS_LABEL_MAX || l[0] == '-' || l[n - 1] == '-')
			return false;
		if (!l[n])
			return true;
		l += n + 1;
	}
}

/* A host name: one RFC 1123 label, lowercase.  Slurm node names become DNS
 * names (NAME.DOMAIN in dnsmasq and /etc/hosts), and Slurm compares them
 * case-sensitively while DNS does not, so only lowercase is accepted. */
bool kiln_cfg__valid_host_name(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n > DNS_LABEL_MAX || s[0] == '-' || s[n - 1] == '-')
		return false;
	for (const char *p = s; *p; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-'))
			return false;
	return true;
}

/* check_word() for a string key of the root, found by its path. */
void kiln_cfg__check_root_word(loader *L, const char *path, const char *extra)
{
	const kiln_cfg_key *k = kiln_cfg__find_key(path);
	assert(k && k->base == BASE_ROOT && k->type == KILN_CFG_STRING);
	kiln_cfg__check_word(L, kiln_cfg__root_line(L, path), path,
			     *(char **) kiln_cfg__field(k, L->cfg), extra);
}
