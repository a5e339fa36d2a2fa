/* slurm.c — keeps the node's Slurm state in line with its health.
 *
 * A thread of its own, because a call to slurmctld can block for the
 * controller's MessageTimeout (10 s by default) and the main loop must keep
 * polling GPUs and feeding the watchdog meanwhile.  The main loop says what
 * it wants (hd_slurm_want); this thread reads the node's state and reason
 * from slurmctld and acts:
 *  - unhealthy and not drained: drain with the "kiln: ..." reason;
 *  - drained by kiln with an older reason: update the reason;
 *  - healthy long enough (resume_ok) and the drain reason is kiln's own:
 *    resume.  A node an admin drained (any other reason) is never resumed.
 * While slurmctld cannot be reached it retries with exponential backoff
 * (HD_SLURM_BACKOFF_MIN .. _MAX), so a drain lands soon after the controller
 * is back.  It also re-checks every HD_SLURM_RECHECK, so an admin's
 * `scontrol update state=resume` on a sick node is undone.  Every call to
 * Slurm goes through libkiln-slurm (kiln/slurm.h). */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "healthd.h"
#include "kiln/log.h"
#include "kiln/parse.h"
#include "kiln/slurm.h"

#define HD_SLURM_BACKOFF_MIN (500 * KILN_USEC_PER_MSEC)
#define HD_SLURM_BACKOFF_MAX (8 * KILN_USEC_PER_SEC)
#define HD_SLURM_RECHECK     (5 * KILN_USEC_PER_SEC)
#define HD_KILN_PREFIX	     "kiln:"

struct hd_slurm {
	char node[KILN_HOSTNAME_MAX + 1];
	pthread_mutex_t lock;
	pthread_cond_t cond;
	pthread_t thread;
	bool stop, changed, want_drain, resume_ok;
	char reason[HD_SLURM_REASON_MAX];
	int reachable;
	bool admin_noted;
};

/* One round.  Returns 0, or -EHOSTUNREACH when slurmctld did not answer. */
static int reconcile(hd_slurm *s, bool want_drain, const char *want_reason, bool resume_ok)
{
	kiln_slurm_nodes *nodes = NULL;
	kiln_error e;
	kiln_error_reset(&e, NULL);
	const char *node = s->node;
	if (kiln_slurm_nodes_load(node, &nodes, &e) < 0) {
		log_debug("Slurm: %s", e.msg);
		return -EHOSTUNREACH;
	}
	const kiln_slurm_node *ni = kiln_slurm_nodes_find(nodes, node);
	if (!ni) {
		kiln_slurm_nodes_free(nodes);
		if (!s->admin_noted)
			log_warning("Slurm does not know node %s: not draining or resuming it",
				    node);
		s->admin_noted = true;
		return 0;
	}
	bool drained = kiln_slurm_state_drained(ni->state);
	char cur[HD_SLURM_REASON_MAX] = "";
	if (ni->reason)
		snprintf(cur, sizeof(cur), "%s", ni->reason);
	kiln_slurm_nodes_free(nodes);
	bool ours = startswith(cur, HD_KILN_PREFIX) != NULL;

	if (want_drain) {
		if (drained && !ours) {
			if (!s->admin_noted)
				log_notice("Node %s is already drained by an admin (\"%s\"); "
					   "leaving it as is",
					   node, cur);
			s->admin_noted = true;
			return 0;
		}
		if (drained && streq(cur, want_reason))
			return 0;
		if (kiln_slurm_node_drain(node, want_reason, &e) < 0) {
			log_warning("Failed to drain %s in Slurm: %s; will retry", node, e.msg);
			return -EHOSTUNREACH;
		}
		log_notice("Drained %s in Slurm: %s", node, want_reason);
		return 0;
	}
	s->admin_noted = false;
	if (resume_ok && drained && ours) {
		if (kiln_slurm_node_resume(node, &e) < 0) {
			log_warning("Failed to resume %s in Slurm: %s; will retry", node, e.msg);
			return -EHOSTUNREACH;
		}
		log_notice("Resumed %s in Slurm: every GPU healthy (was: %s)", node, cur);
	}
	return 0;
}

static void *slurm_main(void *p)
{
	hd_slurm *s = p;
	uint64_t backoff = HD_SLURM_BACKOFF_MIN, next = 0;
	bool outage_logged = false;
	pthread_mutex_lock(&s->lock);
	while (!s->stop) {
		uint64_t now = kiln_now_usec();
		if (!s->changed && now < next) {
			struct timespec ts = { .tv_sec = next / KILN_USEC_PER_SEC,
					       .tv_nsec = (next % KILN_USEC_PER_SEC) * 1000 };
			pthread_cond_timedwait(&s->cond, &s->lock, &ts);
			continue;
		}
		s->changed = false;
		bool want_drain = s->want_drain, resume_ok = s->resume_ok;
		char reason[HD_SLURM_REASON_MAX];
		memcpy(reason, s->reason, sizeof(reason));
		pthread_mutex_unlock(&s->lock);

		int r = reconcile(s, want_drain, reason, resume_ok);

		pthread_mutex_lock(&s->lock);
		if (r == -EHOSTUNREACH) {
			if (!outage_logged)
				log_warning(
					"Slurm controller not reachable; retrying with backoff");
			outage_logged = true;
			s->reachable = 0;
			next = kiln_now_usec() + backoff;
			backoff = MIN(backoff * 2, HD_SLURM_BACKOFF_MAX);
		} else {
			if (outage_logged)
				log_notice("Slurm controller reachable again");
			outage_logged = false;
			s->reachable = 1;
			backoff = HD_SLURM_BACKOFF_MIN;
			next = kiln_now_usec() + HD_SLURM_RECHECK;
		}
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

int hd_slurm_start(const char *node, hd_slurm **ret, kiln_error *err)
{
	assert_return(node && ret, -EINVAL);
	int r = kiln_slurm_init(err);
	if (r < 0)
		return r;
	hd_slurm *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	snprintf(s->node, sizeof(s->node), "%s", node);
	s->reachable = -1;
	pthread_mutex_init(&s->lock, NULL);
	kiln_cond_init_monotonic(&s->cond);
	r = pthread_create(&s->thread, NULL, slurm_main, s);
	if (r != 0) {
		free(s);
		return -r;
	}
	*ret = s;
	return 0;
}

void hd_slurm_stop(hd_slurm *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->lock);
	s->stop = true;
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
	/* A call to slurmctld in flight ends within MessageTimeout; do not
	 * hold up shutdown for it. */
	pthread_detach(s->thread);
}

void hd_slurm_want(hd_slurm *s, bool drain, const char *reason, bool resume_ok)
{
	pthread_mutex_lock(&s->lock);
	if (drain != s->want_drain || resume_ok != s->resume_ok ||
	    !streq(reason ?: "", s->reason)) {
		s->want_drain = drain;
		s->resume_ok = resume_ok;
		snprintf(s->reason, sizeof(s->reason), "%s", reason ?: "");
		s->changed = true;
		pthread_cond_broadcast(&s->cond);
	}
	pthread_mutex_unlock(&s->lock);
}

int hd_slurm_reachable(hd_slurm *s)
{
	pthread_mutex_lock(&s->lock);
	int r = s->reachable;
	pthread_mutex_unlock(&s->lock);
	return r;
}
