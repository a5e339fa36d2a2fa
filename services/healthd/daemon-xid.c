/* daemon-xid.c — kiln-healthd's XIDs: the events as they come and the
 * policy of the XID state file.
 *
 * The NVML event thread queues each XID (on_xid) and wakes the main loop,
 * which applies it to its GPU (handle_xids) and, when its action drains,
 * records it in the XID state file (xidstate.c's format), so that a
 * restarted daemon keeps the GPU drained until an admin resets it and runs
 * `kiln-healthd --clear-xid` (run_clear_xid).  The file is re-read when it
 * changes on disk (xid_state_sync); one that cannot be read keeps the node
 * drained. */
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kiln/log.h"
#include "kiln/prog.h"
#include "manager.h"

static bool same_file(const struct stat *a, const struct stat *b)
{
	return a->st_ino == b->st_ino && a->st_dev == b->st_dev && a->st_size == b->st_size &&
	       a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

/* Writes the XID state file (creating its directory when run outside
 * systemd's RuntimeDirectory=). */
static int xid_state_write(const char *path, const hd_xid_state *st)
{
	int r = hd_xid_state_save(path, st);
	if (r == -ENOENT) {
		_cleanup_free_ char *dir = strdup(path);
		if (!dir)
			return -ENOMEM;
		if (mkdir(dirname(dir), 0755) < 0 && errno != EEXIST)
			return -errno;
		r = hd_xid_state_save(path, st);
	}
	return r;
}

/* Re-reads the XID state file when it changed on disk (an admin's
 * --clear-xid, or a restart).  A missing file means nothing is drained by
 * XIDs.  A file that cannot be read keeps the node drained: it exists only
 * because some XID drained the node, and which GPU needs a reset is then
 * unknown.  Called from the main thread with m->lock held. */
void xid_state_sync(manager *m)
{
	const char *path = xid_state_path();
	struct stat st = {};
	if (stat(path, &st) < 0)
		st = (struct stat){};
	if (m->xs_checked && same_file(&st, &m->xs_seen))
		return;
	bool first = !m->xs_checked;
	m->xs_checked = true;
	m->xs_seen = st;
	static hd_xid_state n; /* large: off the stack */
	int line = 0, r = st.st_ino ? hd_xid_state_load(path, &n, &line) : -ENOENT;
	if (r == -ENOENT) {
		if (m->xs.n > 0)
			log_notice("XID state file %s is gone: forgetting %d XID(s)", path,
				   m->xs.n);
		m->xs.n = 0;
		m->node.xid_state_error[0] = 0;
		return;
	}
	if (r < 0) {
		char where[32] = "";
		if (r == -EBADMSG && line > 0)
			snprintf(where, sizeof(where), ":%d", line);
		char what[96] = "corrupt";
		if (r != -EBADMSG)
			snprintf(what, sizeof(what), "unreadable (%s)", strerror(-r));
		log_error("XID state file %s%s is %s: keeping the node drained (a GPU may need a "
			  "reset); after resetting the GPUs run 'kiln-healthd --clear-xid all'",
			  path, where, what);
		snprintf(m->node.xid_state_error, sizeof(m->node.xid_state_error),
			 "XID state file %s unreadable", path);
		return;
	}
	m->node.xid_state_error[0] = 0;
	if (n.n > 0)
		log_notice("XID state file %s: %d XID(s) keep GPUs drained%s", path, n.n,
			   first && !m->oneshot ? " (from before a restart)" : "");
	else if (m->xs.n > 0)
		log_notice("XID state file %s: cleared, no XID keeps a GPU drained now", path);
	m->xs = n;
}

/* After the first poll: say which entries match no GPU now. */
void xid_state_unmatched(manager *m)
{
	for (int k = 0; k < m->xs.n; k++)
		if (hd_xid_state_find_gpu(&m->xs.v[k], &m->node) < 0)
			log_notice("XID state: gpu%d %s (XID %d) is not present now, ignoring it",
				   m->xs.v[k].gpu, m->xs.v[k].uuid[0] ? m->xs.v[k].uuid : "-",
				   m->xs.v[k].xid);
}

/* kiln-healthd --clear-xid GPU|all */
int run_clear_xid(const char *which)
{
	const char *path = xid_state_path();
	static hd_xid_state st; /* large: off the stack */
	int line = 0, r = hd_xid_state_load(path, &st, &line);
	if (r == -ENOENT) {
		printf("No XID state file at %s: nothing to clear\n", path);
		return 0;
	}
	if (r < 0 && !(streq(which, "all") && r == -EBADMSG)) {
		log_error("Cannot read XID state file %s%s: %s; 'kiln-healthd --clear-xid all' "
			  "replaces a corrupt file",
			  path, line > 0 ? " (bad line)" : "",
			  r == -EBADMSG ? "corrupt" : strerror(-r));
		return KILN_EXIT_FAILURE;
	}
	if (r < 0)
		st.n = 0; /* corrupt, and "all": start over */
	int removed = r < 0 ? 0 : hd_xid_state_clear(&st, which);
	if (removed < 0) {
		log_error("Invalid --clear-xid '%s': expected a GPU index, a GPU UUID or 'all'",
			  which);
		return KILN_EXIT_USAGE;
	}
	r = xid_state_write(path, &st);
	if (r < 0) {
		log_error_errno(r, "Failed to write %s: %m", path);
		return KILN_EXIT_FAILURE;
	}
	printf("Cleared %d XID entr%s for %s in %s (%d left); kiln-healthd picks this up at its "
	       "next poll\n",
	       removed, removed == 1 ? "y" : "ies", which, path, st.n);
	return 0;
}

void on_xid(int gpu, int xid, void *data)
{
	manager *m = data;
	pthread_mutex_lock(&m->lock);
	if (m->xt - m->xh < HD_XID_QUEUE) {
		m->xq[m->xt % HD_XID_QUEUE].gpu = gpu;
		m->xq[m->xt % HD_XID_QUEUE].xid = xid;
		m->xt++;
	} else
		m->xid_dropped++;
	pthread_mutex_unlock(&m->lock);
	char c = 'x';
	(void) !write(m->wake[1], &c, 1);
}

void handle_xids(manager *m)
{
	char buf[64];
	while (read(m->wake[0], buf, sizeof(buf)) > 0)
		;
	pthread_mutex_lock(&m->lock);
	bool any = false;
	if (m->xid_dropped) {
		log_warning("%u XID events dropped: more than %d arrived between two wake-ups "
			    "(XID storm); kiln_xid_total undercounts them",
			    m->xid_dropped, HD_XID_QUEUE);
		m->xid_dropped = 0;
	}
	while (m->xh != m->xt) {
		int gpu = m->xq[m->xh % HD_XID_QUEUE].gpu, xid = m->xq[m->xh % HD_XID_QUEUE].xid;
		m->xh++;
		if (gpu < 0 || gpu >= m->node.n_gpus) {
			log_warning("XID %d on an unknown GPU, ignoring", xid);
			continue;
		}
		kiln_cfg_action a = hd_gpu_add_xid(&m->s, &m->node.gpus[gpu], xid);
		if (a >= KILN_ACTION_DRAIN &&
		    hd_xid_state_add(&m->xs, gpu, m->node.gpus[gpu].cur.uuid, xid, a,
				     (int64_t) time(NULL))) {
			const char *path = xid_state_path();
			/* an unreadable file may hold what it cannot tell: keep it */
			int r = m->node.xid_state_error[0] ? -EBADMSG
							   : xid_state_write(path, &m->xs);
			if (r == -EBADMSG)
				log_error("XID %d of gpu%d is not saved: %s is unreadable (kept as "
					  "it is); the XID holds in memory only",
					  xid, gpu, path);
			else if (r < 0)
				log_error_errno(r,
						"Failed to save XID %d of gpu%d to %s: %m; a "
						"restart of kiln-healthd would forget it",
						xid, gpu, path);
			else if (stat(path, &m->xs_seen) < 0)
				m->xs_seen = (struct stat){};
		}
		int prio = a == KILN_ACTION_IGNORE ? LOG_INFO
			   : a == KILN_ACTION_APP  ? LOG_WARNING
						   : LOG_ERR;
		log_full(prio, "gpu%d: XID %d (%s): action %s", gpu, xid, hd_xid_what(xid),
			 kiln_cfg_action_to_string(a));
		any = true;
	}
	if (any)
		publish(m);
	pthread_mutex_unlock(&m->lock);
}
