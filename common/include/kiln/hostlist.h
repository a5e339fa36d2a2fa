/* kiln/hostlist.h — Slurm-style host lists: "gpu[01-16,20],head".
 *
 * Expansion keeps zero padding ("gpu[08-10]" -> gpu08 gpu09 gpu10) and
 * supports several bracket groups in one name ("r[1-2]n[1-3]", expanded
 * left to right).  Compression is the inverse: names sharing a prefix,
 * suffix and digit width fold into one bracket group with ranges.
 *
 * The expansion is capped (KILN_HOSTLIST_MAX) so that "n[0-999999999]"
 * cannot exhaust memory: larger lists fail with -E2BIG. */
#pragma once

#include <stddef.h>

/* The largest cluster we expect is a few thousand nodes; 64 Ki names bounds
 * memory at a few MB for any input. */
#define KILN_HOSTLIST_MAX 65536
/* A host name is at most 63 characters (RFC 1035 label). */
#define KILN_HOSTNAME_MAX 63

/* Expands s into a NULL-terminated vector of names (in the order written;
 * duplicates kept).  Errors: -EINVAL malformed (unbalanced brackets, empty
 * element, reversed range "n[5-1]", bad characters, name too long),
 * -E2BIG more than KILN_HOSTLIST_MAX names, -ENOMEM.  On -EINVAL, if
 * ret_errpos is not NULL it receives the byte offset of the problem. */
int kiln_hostlist_expand(const char *s, char ***ret, size_t *ret_n, size_t *ret_errpos);

/* Compresses names into the shortest "a[1-3,5],b" form.  Names are sorted
 * (prefix, then number) and duplicates dropped, so the output is
 * deterministic.  Returns 0 and a malloc'd string, or -ENOMEM. */
int kiln_hostlist_compress(char *const *names, size_t n, char **ret);
