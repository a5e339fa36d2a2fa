/* manager.h — kiln-healthd's daemon state, shared by the program's files.
 *
 * Private to the kiln-healthd program (not libhealthd): main.c is the
 * skeleton (options -> cluster file -> manager -> READY=1 -> sd-event loop)
 * and owns polling, publishing and HTTP; daemon-xid.c the XID events and
 * the XID state file's policy; daemon-active.c the rounds of active checks
 * on their thread.  All of them work on one manager. */
#pragma once

#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <systemd/sd-event.h>

#include "healthd.h"
#include "kiln/http.h"

/* XIDs arriving between two wake-ups of the main loop.  A storm beyond this
 * drops the excess (the XID thread must not block on the main loop); the
 * number dropped is logged at the next wake-up. */
#define HD_XID_QUEUE 256

typedef struct manager {
	hd_settings s;
	kiln_cfg *cfg;
	char host[KILN_HOSTNAME_MAX + 1];
	hd_nvml *nvml;
	char nvml_error[256];
	bool nvml_init_hung;
	bool mounts_warned;   /* the mount table could not be read: said once */
	hd_mounts_state mounts_state; /* statfs() probes in flight (mounts.c) */
	pthread_mutex_t lock; /* node, metrics */
	hd_node node;
	char *metrics;
	char last_reasons[HD_GPUS_MAX + 1][512];
	hd_state last_state[HD_GPUS_MAX + 1];
	kiln_http_server *http;
	hd_slurm *slurm;
	int wake[2];
	struct {
		int gpu, xid;
	} xq[HD_XID_QUEUE];
	unsigned xh, xt;
	unsigned xid_dropped;
	/* the event loop: signals, the wake pipe, the poll and active timers;
	 * it pings the watchdog itself (sd_event_set_watchdog) */
	sd_event *event;
	sd_event_source *poll_timer, *active_timer;
	/* the watchdog interval (0: none), and the last ping poll_all() sent
	 * while it kept the loop from running */
	uint64_t watchdog_usec, last_watchdog;
	/* active checks run in their own thread: they take gemm_seconds per GPU */
	pthread_t active_thread;
	atomic_bool active_running, active_done;
	bool active_due; /* the schedule says run; starts when none runs and NVML is up */
	char last_status[300];
	/* XIDs that drain, mirrored in the XID state file; the main thread only */
	hd_xid_state xs;
	struct stat xs_seen; /* the file as last read or written (st_ino 0: none) */
	bool xs_checked;
	bool oneshot; /* --check or --active: no daemon around */
} manager;

/* main.c */
/* The XID state file: --xid-state, $KILN_HEALTHD_XID_STATE or
 * HD_XID_STATE_PATH. */
const char *xid_state_path(void);
/* After any change: evaluate, log, re-render metrics, tell Slurm and
 * systemd.  Called with m->lock held. */
void publish(manager *m);
int open_nvml(manager *m);

/* daemon-xid.c */
/* Re-reads the XID state file when it changed on disk; m->lock held. */
void xid_state_sync(manager *m);
/* After the first poll: says which entries match no GPU now. */
void xid_state_unmatched(manager *m);
/* kiln-healthd --clear-xid which: returns the exit status. */
int run_clear_xid(const char *which);
/* The XID thread's callback (hd_xid_cb): queues, wakes the main loop. */
void on_xid(int gpu, int xid, void *data);
/* The main loop's side: applies the queued XIDs. */
void handle_xids(manager *m);

/* daemon-active.c */
/* kiln-healthd --active: returns the exit status. */
int run_active(manager *m);
void active_maybe(manager *m);
void active_reap(manager *m);
int on_active_timer(sd_event_source *s, uint64_t usec, void *userdata);
