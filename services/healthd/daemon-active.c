/* daemon-active.c — kiln-healthd's active checks (GEMM burn, bandwidth,
 * memtest): the one-shot `--active` table, and the daemon's rounds.
 *
 * A round runs on a thread of its own (it takes gemm_seconds per GPU; the
 * main loop must keep polling and feeding the watchdog), over every idle
 * GPU one after the other through hd_active_run() (active.c, which starts
 * kiln-healthd-active); failures become unhealthy reasons kept until the
 * checks pass again.  The next round is due health.active_interval after
 * one starts (on_active_timer). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kiln/log.h"
#include "kiln/prog.h"
#include "manager.h"

int run_active(manager *m)
{
	int r = open_nvml(m), n = 0, failed = 0;
	if (r == 0 && hd_nvml_count(m->nvml, &n) < 0)
		n = 0;
	printf("%-4s %-10s %-8s %12s %12s  %s\n", "GPU", "CHECK", "RESULT", "MEASURED", "EXPECTED",
	       "DETAIL");
	for (int i = 0; i < MAX(n, 1); i++) {
		hd_sample s = {};
		if (m->nvml && n > 0)
			hd_nvml_poll(m->nvml, i, &s);
		hd_active_result res[HD_ACTIVE_CHECKS];
		char idx[16] = "-";
		if (n > 0)
			snprintf(idx, sizeof(idx), "%d", i);
		if (s.has_pids && s.n_pids > 0) {
			/* a GEMM burn next to a training job would hurt the job */
			printf("%-4s %-10s %-8s %12s %12s  %s\n", idx, "all", "skipped", "-", "-",
			       "the GPU is running a job's processes");
			continue;
		}
		hd_active_run(&m->s, n > 0 ? i : -1, s.name,
			      s.has_mem ? s.mem_total - s.mem_used : 0, res);
		for (int k = 0; k < HD_ACTIVE_CHECKS; k++) {
			const char *unit = streq(res[k].name, "gemm")	   ? "TFLOP/s"
					   : streq(res[k].name, "memtest") ? "GiB"
									   : "GB/s";
			char meas[32] = "-", exp[32] = "-";
			if (!streq(res[k].status, "skipped"))
				snprintf(meas, sizeof(meas), "%.1f %s", res[k].value, unit);
			if (res[k].expected > 0)
				snprintf(exp, sizeof(exp), "%.0f %s", res[k].expected, unit);
			printf("%-4s %-10s %-8s %12s %12s  %s\n", idx, res[k].name, res[k].status,
			       meas, exp, res[k].detail);
			failed += streq(res[k].status, "failed");
		}
	}
	return failed ? KILN_EXIT_FAILURE : KILN_EXIT_OK;
}

/* Runs the active checks on every idle GPU, one after the other, and turns
 * failures into unhealthy reasons (kept until the checks pass again). */
static void *active_main(void *p)
{
	manager *m = p;
	pthread_mutex_lock(&m->lock);
	int n = m->node.n_gpus;
	pthread_mutex_unlock(&m->lock);
	for (int i = 0; i < n; i++) {
		pthread_mutex_lock(&m->lock);
		hd_sample cs = m->node.gpus[i].cur;
		pthread_mutex_unlock(&m->lock);
		hd_active_result res[HD_ACTIVE_CHECKS];
		if (cs.n_pids > 0) {
			log_info("gpu%d: active checks skipped: the GPU is running %u process(es)",
				 i, cs.n_pids);
			continue;
		}
		if (!cs.present || cs.lost || cs.hung_call[0])
			continue;
		if (hd_active_run(&m->s, i, cs.name, cs.has_mem ? cs.mem_total - cs.mem_used : 0,
				  res) < 0)
			continue;
		hd_reasons bad = {};
		bool same = true;
		for (int k = 0; k < HD_ACTIVE_CHECKS; k++)
			same = same && streq(res[k].status, "skipped") &&
			       streq(res[k].detail, res[0].detail);
		if (same) {
			log_info("gpu%d: active checks skipped: %s", i, res[0].detail);
			continue;
		}
		for (int k = 0; k < HD_ACTIVE_CHECKS; k++) {
			bool failed = streq(res[k].status, "failed");
			log_full(failed ? LOG_ERR : LOG_INFO, "gpu%d: active check %s %s: %s", i,
				 res[k].name, res[k].status, res[k].detail);
			if (failed)
				hd_reasons_add(&bad, HD_UNHEALTHY, "active check %s failed: %s",
					       res[k].name, res[k].detail);
		}
		pthread_mutex_lock(&m->lock);
		m->node.gpus[i].active = bad;
		pthread_mutex_unlock(&m->lock);
	}
	m->active_done = true;
	char c = 'a';
	(void) !write(m->wake[1], &c, 1);
	return NULL;
}

/* Starts a round of active checks when the schedule asked for one, none is
 * running and NVML is up (it may come up late); the next round is due
 * health.active_interval after this one starts. */
void active_maybe(manager *m)
{
	if (!m->active_due || m->active_running || !m->nvml)
		return;
	m->active_due = false;
	if (m->s.active_interval_usec) {
		sd_event_source_set_time(m->active_timer,
					 kiln_now_usec() + m->s.active_interval_usec);
		sd_event_source_set_enabled(m->active_timer, SD_EVENT_ONESHOT);
	}
	m->active_done = false;
	if (pthread_create(&m->active_thread, NULL, active_main, m) == 0)
		m->active_running = true;
	else
		log_warning("Failed to start the active checks thread, skipping this round");
}

/* Joins a finished round (its thread wrote to the wake pipe) and shows
 * its results. */
void active_reap(manager *m)
{
	if (!m->active_running || !m->active_done)
		return;
	pthread_join(m->active_thread, NULL);
	m->active_running = false;
	pthread_mutex_lock(&m->lock);
	publish(m);
	pthread_mutex_unlock(&m->lock);
	active_maybe(m);
}

int on_active_timer(sd_event_source *s, uint64_t usec, void *userdata)
{
	manager *m = userdata;
	m->active_due = true;
	active_maybe(m);
	return 0;
}
