/* mounts.c — the shared mounts check: is every mount of the cluster file's
 * mounts[] mounted on this node, and does it answer?
 *
 * kiln-node-init starts a systemd mount unit per mounts[] entry, and slurmd
 * starts whether they came up or not (it Wants= them): a node without its
 * /home would otherwise run jobs that fail on a missing file, one after the
 * other.  This check reads the node's mount table (/proc/1/mountinfo:
 * PID 1's, as the daemon's own namespace hides /home behind the unit's
 * ProtectHome=) on every poll and
 * gives a node reason for each mount point not in it: unhealthy for a
 * required mount (the node is drained: "kiln: mount /home (head:/home nfs)
 * missing"), degraded otherwise.  Only the mount point is compared, not the
 * type: NFS mounted with vers=4.2 shows as nfs4.
 *
 * A mount that is there can still be dead: a hard NFS mount whose server is
 * gone (or a FUSE filesystem whose daemon is stuck) stays in the table, and
 * every process touching it hangs, uninterruptibly.  So each mounted share
 * is also probed with statfs(), in a thread of its own: a probe still
 * running after mounts[].timeout makes the mount "not responding", one that
 * fails "not accessible (error)", both treated as missing.  A hung probe
 * costs one thread, which is left to finish on its own (no new probe of
 * that mount is started meanwhile), the way nvml.c abandons a hung NVML
 * call.  When the mount is back and answers, the reason goes, and the node
 * is resumed after health.recover_after like any recovery. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statfs.h>

#include "healthd.h"

/* One statfs() in flight: shared by the prober thread and the state until
 * both let go (a hung one may outlive the state). */
struct hd_mount_probe {
	pthread_mutex_t lock;
	int refs;
	bool done;
	int error; /* 0, or the errno of statfs() */
	uint64_t started_usec;
	char where[];
};

static void probe_unref(hd_mount_probe *p)
{
	pthread_mutex_lock(&p->lock);
	bool last = --p->refs == 0;
	pthread_mutex_unlock(&p->lock);
	if (last) {
		pthread_mutex_destroy(&p->lock);
		free(p);
	}
}

static void *probe_thread(void *arg)
{
	hd_mount_probe *p = arg;
	struct statfs st;
	int e = statfs(p->where, &st) < 0 ? errno : 0;
	pthread_mutex_lock(&p->lock);
	p->error = e;
	p->done = true;
	pthread_mutex_unlock(&p->lock);
	probe_unref(p);
	return NULL;
}

/* Starts a probe of where; NULL when no thread can be made (reported by
 * the caller as not accessible). */
static hd_mount_probe *probe_start(const char *root, const char *where, uint64_t now_usec)
{
	size_t rl = strlen(root), l = strlen(where);
	hd_mount_probe *p = calloc(1, sizeof(*p) + rl + l + 1);
	if (!p)
		return NULL;
	memcpy(p->where, root, rl);
	memcpy(p->where + rl, where, l + 1);
	pthread_mutex_init(&p->lock, NULL);
	p->refs = 2;
	p->started_usec = now_usec;
	pthread_attr_t a;
	pthread_t t;
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&a, 64 * 1024); /* statfs needs little */
	int r = pthread_create(&t, &a, probe_thread, p);
	pthread_attr_destroy(&a);
	if (r != 0) {
		pthread_mutex_destroy(&p->lock);
		free(p);
		return NULL;
	}
	return p;
}

void hd_mounts_state_free(hd_mounts_state *st)
{
	for (size_t i = 0; i < HD_MOUNTS_MAX; i++)
		if (st->inflight[i]) {
			probe_unref(st->inflight[i]);
			st->inflight[i] = NULL;
		}
}

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

/* Mount i is mounted: is it answering?  Reports into out when not. */
static void probe(const hd_settings *s, const char *root, hd_mounts_state *st, size_t i,
		  uint64_t now_usec, hd_reasons *out)
{
	const kiln_cfg_mount *m = &s->mounts[i];
	hd_state sev = m->required ? HD_UNHEALTHY : HD_DEGRADED;
	hd_mount_probe *p = st->inflight[i];
	if (!p) {
		p = st->inflight[i] = probe_start(root, m->where, now_usec);
		if (!p) {
			hd_reasons_add(out, sev, "mount %s (%s %s) not checked (no thread)",
				       m->where, m->what, m->type);
			return;
		}
	}
	/* without a state to keep it (--check), wait for the probe here */
	for (uint64_t waited = 0; st->wait && waited < m->timeout_usec;
	     waited += 10 * KILN_USEC_PER_MSEC) {
		pthread_mutex_lock(&p->lock);
		bool done = p->done;
		pthread_mutex_unlock(&p->lock);
		if (done)
			break;
		struct timespec ts = { 0, 10 * 1000 * 1000 };
		nanosleep(&ts, NULL);
		now_usec = p->started_usec + waited + 10 * KILN_USEC_PER_MSEC;
	}
	pthread_mutex_lock(&p->lock);
	bool done = p->done;
	int e = p->error;
	pthread_mutex_unlock(&p->lock);
	if (done) {
		/* its answer; the next poll starts a fresh probe */
		probe_unref(p);
		st->inflight[i] = NULL;
		if ((e == EACCES || e == EPERM) && root[0] && !st->no_root) {
			/* PID 1's root is not ours to enter: probe our own view
			 * from now on rather than drain every node for it */
			st->no_root = true;
			return;
		}
		if (e)
			hd_reasons_add(out, sev, "mount %s (%s %s) not accessible (%s)", m->where,
				       m->what, m->type, strerror(e));
		return;
	}
	if (now_usec - p->started_usec >= m->timeout_usec)
		hd_reasons_add(out, sev, "mount %s (%s %s) not responding", m->where, m->what,
			       m->type);
}

int hd_mounts_check(const hd_settings *s, hd_mounts_state *st, uint64_t now_usec, hd_reasons *out)
{
	out->n = 0;
	if (s->n_mounts == 0)
		return 0;
	_cleanup_free_ char *text = NULL;
	size_t len;
	const char *path = s->mountinfo[0] ? s->mountinfo : HD_MOUNTINFO_PATH;
	const char *root = s->mountinfo[0] ? "" : HD_MOUNT_ROOT;
	int r = kiln_read_file(path, HD_MOUNTINFO_MAX, &text, &len);
	if (r < 0) {
		hd_reasons_add(out, HD_UNHEALTHY, "mount table %s unreadable (%s)", path,
			       strerror(-r));
		return r;
	}
	int missing = 0;
	for (size_t i = 0; i < s->n_mounts; i++) {
		const kiln_cfg_mount *m = &s->mounts[i];
		if (!mounted(text, m->where)) {
			missing++;
			hd_reasons_add(out, m->required ? HD_UNHEALTHY : HD_DEGRADED,
				       "mount %s (%s %s) missing", m->where, m->what, m->type);
			continue;
		}
		if (st && i < HD_MOUNTS_MAX) {
			int before = out->n;
			probe(s, st->no_root ? "" : root, st, i, now_usec, out);
			missing += out->n > before;
		}
	}
	return missing;
}

bool hd_mount_ok(const hd_reasons *r, const kiln_cfg_mount *m)
{
	char prefix[HD_REASON_MAX];
	snprintf(prefix, sizeof(prefix), "mount %s (", m->where);
	for (int i = 0; i < r->n; i++)
		if (startswith(r->v[i].text, prefix))
			return false;
	return true;
}
