/* hostlist.c — expand and compress Slurm-style host lists.
 *
 * "gpu[01-03,07],r[1-2]n[1-2]" <-> gpu01 gpu02 gpu03 gpu07 r1n1 r1n2 r2n1 r2n2.
 * The cluster file names nodes this way and Slurm's configs want the same
 * syntax back, so both directions live here.  Expansion counts the names
 * before making any, so a hostile range fails fast with -E2BIG. */
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/hostlist.h"
#include "kiln/macro.h"
#include "kiln/strbuf.h"

/* 9 digits keep every bound below 10^9, far from int overflow. */
#define RANGE_DIGITS_MAX 9

struct range {
	uint32_t lo, hi;
	int width; /* digits of the lower bound: zero padding to keep */
};

struct segment {
	const char *lit; /* literal text (not NUL-terminated) or NULL for a bracket group */
	size_t lit_len;
	struct range *ranges;
	size_t n_ranges;
	uint64_t count; /* names this segment yields */
};

static bool name_char(char c)
{
	return isalnum((unsigned char) c) || c == '-' || c == '_' || c == '.';
}

static int fail_at(size_t *ret_errpos, size_t pos)
{
	if (ret_errpos)
		*ret_errpos = pos;
	return -EINVAL;
}

static int parse_number(const char *s, size_t *i, uint32_t *ret, int *ret_width)
{
	size_t start = *i;
	uint32_t v = 0;
	while (isdigit((unsigned char) s[*i])) {
		if (*i - start >= RANGE_DIGITS_MAX) {
			*i = start; /* report the start of the number */
			return -EINVAL;
		}
		v = v * 10 + (uint32_t) (s[*i] - '0');
		(*i)++;
	}
	if (*i == start)
		return -EINVAL;
	*ret = v;
	*ret_width = (int) (*i - start);
	return 0;
}

/* Parses one bracket group starting after '['; *i ends after ']'. */
static int parse_group(const char *s, size_t *i, struct segment *seg, size_t *ret_errpos)
{
	for (;;) {
		struct range r;
		int wlo, whi;
		if (parse_number(s, i, &r.lo, &wlo) < 0)
			return fail_at(ret_errpos, *i);
		r.hi = r.lo;
		r.width = wlo;
		if (s[*i] == '-') {
			(*i)++;
			size_t at = *i;
			if (parse_number(s, i, &r.hi, &whi) < 0)
				return fail_at(ret_errpos, *i);
			if (r.hi < r.lo)
				return fail_at(ret_errpos, at);
		}
		struct range *nr = realloc(seg->ranges, (seg->n_ranges + 1) * sizeof(*nr));
		if (!nr)
			return -ENOMEM;
		seg->ranges = nr;
		seg->ranges[seg->n_ranges++] = r;
		seg->count += (uint64_t) r.hi - r.lo + 1;
		if (seg->count > KILN_HOSTLIST_MAX)
			return -E2BIG;
		if (s[*i] == ',') {
			(*i)++;
			continue;
		}
		if (s[*i] == ']') {
			(*i)++;
			return 0;
		}
		return fail_at(ret_errpos, *i);
	}
}

/* The names made so far; grows by doubling so that expanding the largest
 * allowed list stays linear. */
struct namevec {
	char **v;
	size_t n, cap;
};

static int namevec_add(struct namevec *nv, const char *name)
{
	if (nv->n + 2 > nv->cap) {
		size_t cap = MAX(nv->cap * 2, (size_t) 16);
		char **v = realloc(nv->v, cap * sizeof(char *));
		if (!v)
			return -ENOMEM;
		nv->v = v;
		nv->cap = cap;
	}
	if (!(nv->v[nv->n] = strdup(name)))
		return -ENOMEM;
	nv->v[++nv->n] = NULL;
	return 0;
}

static void segments_free(struct segment *segs, size_t n)
{
	for (size_t k = 0; k < n; k++)
		free(segs[k].ranges);
	free(segs);
}

/* Emits every name of segs[k..] prefixed by buf[0..len). */
static int emit(struct segment *segs, size_t n, size_t k, char *buf, size_t len, struct namevec *v)
{
	if (k == n) {
		if (len > KILN_HOSTNAME_MAX)
			return -EINVAL;
		buf[len] = 0;
		return namevec_add(v, buf);
	}
	struct segment *seg = &segs[k];
	if (seg->lit) {
		if (len + seg->lit_len > KILN_HOSTNAME_MAX)
			return -EINVAL;
		memcpy(buf + len, seg->lit, seg->lit_len);
		return emit(segs, n, k + 1, buf, len + seg->lit_len, v);
	}
	for (size_t j = 0; j < seg->n_ranges; j++)
		for (uint64_t x = seg->ranges[j].lo; x <= seg->ranges[j].hi; x++) {
			char num[16];
			int w = snprintf(num, sizeof(num), "%0*u", seg->ranges[j].width,
					 (unsigned) x);
			if (len + (size_t) w > KILN_HOSTNAME_MAX)
				return -EINVAL;
			memcpy(buf + len, num, (size_t) w);
			int r = emit(segs, n, k + 1, buf, len + (size_t) w, v);
			if (r < 0)
				return r;
		}
	return 0;
}

/* Expands one comma-free (outside brackets) element s[start..end). */
static int expand_item(const char *s, size_t start, size_t end, struct namevec *v,
		       size_t *ret_errpos)
{
	struct segment *segs = NULL;
	size_t n = 0;
	uint64_t total = 1;
	int r = 0;
	size_t i = start;
	if (start == end)
		return fail_at(ret_errpos, start);
	while (i < end) {
		struct segment *ns = realloc(segs, (n + 1) * sizeof(*ns));
		if (!ns) {
			r = -ENOMEM;
			goto out;
		}
		segs = ns;
		struct segment *seg = &segs[n++];
		memset(seg, 0, sizeof(*seg));
		if (s[i] == '[') {
			i++;
			r = parse_group(s, &i, seg, ret_errpos);
			if (r < 0)
				goto out;
		} else {
			seg->lit = s + i;
			while (i < end && s[i] != '[') {
				if (!name_char(s[i])) {
					r = fail_at(ret_errpos, i);
					goto out;
				}
				i++;
			}
			seg->lit_len = (size_t) (s + i - seg->lit);
			seg->count = 1;
		}
		total *= seg->count;
		if (total > KILN_HOSTLIST_MAX) {
			r = -E2BIG;
			goto out;
		}
	}
	if (v->n + total > KILN_HOSTLIST_MAX) {
		r = -E2BIG;
		goto out;
	}
	char buf[KILN_HOSTNAME_MAX + 16];
	r = emit(segs, n, 0, buf, 0, v);
	if (r == -EINVAL)
		fail_at(ret_errpos, start); /* a name came out too long */
out:
	segments_free(segs, n);
	return r;
}

int kiln_hostlist_expand(const char *s, char ***ret, size_t *ret_n, size_t *ret_errpos)
{
	assert_return(s && ret, -EINVAL);
	struct namevec v = { 0 };
	size_t start = 0, i = 0;
	int depth = 0, r = 0;
	if (!*s)
		return fail_at(ret_errpos, 0);
	for (;; i++) {
		char c = s[i];
		if (c == '[') {
			if (depth++) {
				r = fail_at(ret_errpos, i); /* no nesting */
				goto fail;
			}
		} else if (c == ']') {
			if (!depth--) {
				r = fail_at(ret_errpos, i);
				goto fail;
			}
		} else if ((c == ',' && depth == 0) || c == 0) {
			if (c == 0 && depth) {
				r = fail_at(ret_errpos, i);
				goto fail;
			}
			r = expand_item(s, start, i, &v, ret_errpos);
			if (r < 0)
				goto fail;
			start = i + 1;
			if (c == 0)
				break;
		}
	}
	if (ret_n)
		*ret_n = v.n;
	*ret = v.v;
	return 0;
fail:
	if (v.v)
		v.v[v.n] = NULL;
	strv_free(v.v);
	return r;
}

/* ---- compression ---- */

struct hname {
	const char *name;
	size_t plen; /* prefix length: up to the last run of digits */
	size_t dlen; /* digits length (0: no number) */
	uint32_t number;
};

static int hname_cmp(const void *a, const void *b)
{
	const struct hname *x = a, *y = b;
	/* group key: prefix, then suffix; then number; then text */
	size_t ml = MIN(x->plen, y->plen);
	int c = memcmp(x->name, y->name, ml);
	if (c)
		return c;
	if (x->plen != y->plen)
		return x->plen < y->plen ? -1 : 1;
	if ((x->dlen == 0) != (y->dlen == 0))
		return x->dlen == 0 ? -1 : 1;
	c = strcmp(x->name + x->plen + x->dlen, y->name + y->plen + y->dlen);
	if (c)
		return c;
	if (x->number != y->number)
		return x->number < y->number ? -1 : 1;
	return strcmp(x->name, y->name);
}

static bool same_group(const struct hname *x, const struct hname *y)
{
	return x->dlen && y->dlen && x->plen == y->plen && memcmp(x->name, y->name, x->plen) == 0 &&
	       streq(x->name + x->plen + x->dlen, y->name + y->plen + y->dlen);
}

/* Would "lo-hi" with lo's width print h's digits exactly? */
static bool extends_run(const struct hname *lo, const struct hname *prev, const struct hname *h)
{
	if (h->number != prev->number + 1)
		return false;
	char num[16];
	int w = snprintf(num, sizeof(num), "%0*u", (int) lo->dlen, (unsigned) h->number);
	return (size_t) w == h->dlen && memcmp(num, h->name + h->plen, h->dlen) == 0;
}

int kiln_hostlist_compress(char *const *names, size_t n, char **ret)
{
	assert_return(ret && (names || n == 0), -EINVAL);
	_cleanup_free_ struct hname *h = calloc(n ? n : 1, sizeof(*h));
	if (!h)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		const char *s = names[i];
		size_t len = strlen(s), end = len;
		/* the last run of digits */
		while (end > 0 && !isdigit((unsigned char) s[end - 1]))
			end--;
		size_t beg = end;
		while (beg > 0 && isdigit((unsigned char) s[beg - 1]))
			beg--;
		h[i].name = s;
		if (end > beg && end - beg <= RANGE_DIGITS_MAX) {
			h[i].plen = beg;
			h[i].dlen = end - beg;
			h[i].number = (uint32_t) strtoul(s + beg, NULL, 10);
		} else {
			h[i].plen = len;
		}
	}
	qsort(h, n, sizeof(*h), hname_cmp);

	_cleanup_strbuf_ kiln_strbuf b;
	kiln_strbuf_init(&b);
	size_t i = 0;
	while (i < n) {
		if (i > 0 && streq(h[i].name, h[i - 1].name)) {
			i++; /* duplicate */
			continue;
		}
		if (b.len)
			kiln_strbuf_append(&b, ",");
		size_t j = i + 1; /* group is h[i..j) */
		while (j < n && (same_group(&h[i], &h[j]) || streq(h[j].name, h[j - 1].name)))
			j++;
		if (j - i == 1 || !h[i].dlen) {
			kiln_strbuf_append(&b, h[i].name);
			i = j;
			continue;
		}
		kiln_strbuf_append_n(&b, h[i].name, h[i].plen);
		kiln_strbuf_append(&b, "[");
		size_t k = i;
		bool first = true;
		while (k < j) {
			size_t lo = k, last = k;
			for (size_t m = k + 1; m < j; m++) {
				if (streq(h[m].name, h[last].name))
					continue;
				if (!extends_run(&h[lo], &h[last], &h[m]))
					break;
				last = m;
			}
			if (!first)
				kiln_strbuf_append(&b, ",");
			first = false;
			kiln_strbuf_append_n(&b, h[lo].name + h[lo].plen, h[lo].dlen);
			if (last != lo) {
				kiln_strbuf_append(&b, "-");
				kiln_strbuf_append_n(&b, h[last].name + h[last].plen, h[last].dlen);
			}
			k = last + 1;
			while (k < j && streq(h[k].name, h[last].name))
				k++;
		}
		kiln_strbuf_append(&b, "]");
		kiln_strbuf_append(&b, h[i].name + h[i].plen + h[i].dlen);
		i = j;
	}
	char *s = kiln_strbuf_steal(&b);
	if (!s)
		return -ENOMEM;
	*ret = s;
	return 0;
}
