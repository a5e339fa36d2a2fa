/* mounts.c — the shared mounts check: is every mount of the cluster file's
 * mounts[] mounted on this node?
 *
 * kiln-node-init starts a systemd mount unit per mounts[] entry, and slurmd
 * starts whether they came up or not (it Wants= them): a node without its
 * /home would otherwise run jobs that fail on a missing file, one after the
 * other.  This check reads the node's mount table (/proc/self/mountinfo:
 * the daemon's own mount namespace, which is the node's) on every poll and
 * gives a node reason for each mount point not in it: unhealthy for a
 * required mount (the node is drained: "kiln: mount /home (head:/home nfs)
 * missing"), degraded otherwise.  When the mount is back the reason goes,
 * and the node is resumed after health.recover_after like any recovery.
 * Only the mount point is compared, not the type: NFS mounted with
 * vers=4.2 shows as nfs4, and what is mounted there is the admin's to
 * judge. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "healthd.h"

/* mountinfo escapes space, tab, newline and backslash as \ooo. */
static void unescape(char *s)
{
	char *w = s;
	for (char *r = s; *r;) {
		if (r[0] == '\\' && r[1] >= '0' && r[1] <= '3' && r[2] >= '0' && r[2] <= '7' &&
		    r[3] >= '0' && r[3] <= '7') {
			*w++ = (char) ((r[1] - '0') * 64 + (r[2] - '0') * 8 + (r[3] - '0'));
			r += 4;
		} else
			*w++ = *r++;
	}
	*w = 0;
}

/* Whether where is a mount point in the mountinfo text. */
static bool mounted(const char *text, const char *where)
{
	for (const char *line = text; line && *line;) {
		const char *nl = strchr(line, '\n');
		size_t len = nl ? (size_t) (nl - line) : strlen(line);
		/* ID PARENT MAJ:MIN ROOT MOUNTPOINT ...: the fifth field */
		const char *p = line;
		for (int f = 0; f < 4 && p < line + len; f++) {
			p = memchr(p, ' ', (size_t) (line + len - p));
			if (!p)
				break;
			p++;
		}
		if (p && p < line + len) {
			const char *e = memchr(p, ' ', (size_t) (line + len - p));
			size_t fl = e ? (size_t) (e - p) : (size_t) (line + len - p);
			char mp[4096];
			if (fl < sizeof(mp)) {
				memcpy(mp, p, fl);
				mp[fl] = 0;
				unescape(mp);
				if (streq(mp, where))
					return true;
			}
		}
		line = nl ? nl + 1 : NULL;
	}
	return false;
}

int hd_mounts_check(const hd_settings *s, hd_reasons *out)
{
	out->n = 0;
	if (s->n_mounts == 0)
		return 0;
	_cleanup_free_ char *text = NULL;
	size_t len;
	const char *path = s->mountinfo[0] ? s->mountinfo : HD_MOUNTINFO_PATH;
	int r = kiln_read_file(path, HD_MOUNTINFO_MAX, &text, &len);
	if (r < 0) {
		hd_reasons_add(out, HD_UNHEALTHY, "mount table %s unreadable (%s)", path,
			       strerror(-r));
		return r;
	}
	int missing = 0;
	for (size_t i = 0; i < s->n_mounts; i++) {
		const kiln_cfg_mount *m = &s->mounts[i];
		if (mounted(text, m->where))
			continue;
		missing++;
		hd_reasons_add(out, m->required ? HD_UNHEALTHY : HD_DEGRADED,
			       "mount %s (%s %s) missing", m->where, m->what, m->type);
	}
	return missing;
}
