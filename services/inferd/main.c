/* main.c — kiln-inferd, an OpenAI-compatible completions and chat
 * completions server on the inference engine (kiln/engine.h), libktok and
 * kiln/http.h.
 *
 *   kiln-inferd [-c FILE] [--node NAME] [--model FILE] [options]
 *
 * This file is the daemon's life: run() takes the settings (options.c:
 * flags over the cluster file over the schema), the API keys (keys.c), the
 * models (models.c: --model repeated or inference.models, each with its own
 * backend, tokenizer, chat template and engine after a memory budget
 * check), starts the HTTP server on the routes (routes.c), speaks
 * systemd's notify protocol (READY, STATUS, WATCHDOG pings while the
 * engines' schedulers make progress) and drains on SIGTERM/SIGINT: new
 * requests get 503 + Retry-After, those in flight get
 * inference.drain_grace to finish, then the server stops (streams are
 * cancelled) and the engines cancel what is left.  The request layer is
 * openai.c, the streaming and stop-string layer stream.c (inferd.h).
 * Exit codes: 0 ok, 1 failure, 2 usage error (a tokenizer larger than the
 * model's vocabulary included).  docs/kiln-inferd.md. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <systemd/sd-daemon.h>
#include <systemd/sd-event.h>
#include <time.h>
#include <inttypes.h>
#include <unistd.h>
#include <strings.h>
#include <sys/stat.h>

#include "program.h"
#include "kiln/config.h"
#include "kiln/hostlist.h"
#include "kiln/log.h"
#include "kiln/metrics.h"
#include "kiln/parse.h"
#include "kiln/prog.h"
#include "kiln/strbuf.h"

/* SIGTERM/SIGINT reach the event loop through sd-event's signalfd, which
 * sees a signal only while no thread would take it.  The threads kiln
 * starts inherit the mask run() sets first, but OpenBLAS starts its pool in
 * a library constructor, before main(), with the signals unblocked, and the
 * kernel may hand a process-directed signal to one of those threads (the
 * default action would then kill the process, exit 143, without the
 * orderly stop).  There this handler passes it on to the main thread, where
 * it stays pending for the signalfd. */
static pthread_t main_thread;
/* While the models load, the thread that takes the stop signals then
 * (load_signal_main) instead of the main thread. */
static pthread_t load_thread;
static atomic_bool load_watch;

static void forward_signal(int sig)
{
	int saved = errno;
	(void) pthread_kill(atomic_load(&load_watch) ? load_thread : main_thread, sig);
	errno = saved;
}

static void block_stop_signals(void)
{
	static const int sigs[] = { SIGTERM, SIGINT };
	sigset_t ss;
	sigemptyset(&ss);
	main_thread = pthread_self();
	for (size_t i = 0; i < ARRAY_SIZE(sigs); i++) {
		struct sigaction sa = { .sa_handler = forward_signal }, old;
		sigaddset(&ss, sigs[i]);
		sigfillset(&sa.sa_mask);
		/* An ignored SIGINT (a background job of a script) stays ignored. */
		if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN)
			(void) sigaction(sigs[i], &sa, NULL);
	}
	pthread_sigmask(SIG_BLOCK, &ss, NULL);
}

/* ---- the drain and the watchdog ---------------------------------------- */

/* How often the drain looks whether the engines are empty. */
#define DRAIN_POLL_USEC (50 * KILN_USEC_PER_MSEC)

/* Requests running and waiting, every engine together. */
static void in_flight(int *running, int *waiting)
{
	*running = *waiting = 0;
	for (int i = 0; i < inferd_served.n; i++) {
		kiln_engine_stats st;
		kiln_engine_get_stats(inferd_served.apps[i].engine, &st);
		*running += st.running;
		*waiting += st.waiting;
	}
}

/* A time source fires once (SD_EVENT_ONESHOT): again in usec. */
static int rearm(sd_event_source *s, uint64_t usec)
{
	int r = sd_event_source_set_time_relative(s, usec);
	return r < 0 ? r : sd_event_source_set_enabled(s, SD_EVENT_ONESHOT);
}

static int on_drain_poll(sd_event_source *s, uint64_t usec, void *u)
{
	daemon_state *d = u;
	int running, waiting;
	in_flight(&running, &waiting);
	sd_event *ev = sd_event_source_get_event(s);
	if (running + waiting == 0) {
		log_info("Drained: every request in flight finished");
		return sd_event_exit(ev, 0);
	}
	if (kiln_now_usec() >= d->drain_deadline) {
		log_info("Drain grace over: cancelling %d running and %d waiting requests", running,
			 waiting);
		return sd_event_exit(ev, 0);
	}
	return rearm(s, DRAIN_POLL_USEC);
}

/* The first SIGTERM/SIGINT starts the drain (no new requests, those in
 * flight get inferd_arg.drain_grace_usec); a second one, or a grace of 0, stops at
 * once (the rest is cancelled). */
static int on_signal(sd_event_source *s, const struct signalfd_siginfo *si, void *u)
{
	daemon_state *d = u;
	sd_event *ev = sd_event_source_get_event(s);
	const char *sig = strsignal((int) si->ssi_signo);
	if (d->drain_deadline) {
		log_info("Got %s again, stopping now: cancelling what is left", sig);
		return sd_event_exit(ev, 0);
	}
	atomic_store(&inferd_draining, true);
	int running, waiting;
	in_flight(&running, &waiting);
	char grace[32];
	kiln_format_duration(grace, sizeof(grace), inferd_arg.drain_grace_usec);
	log_info("Got %s, stopping: draining %d running and %d waiting requests (new ones "
		 "get "
		 "503), up to %s",
		 sig, running, waiting, grace);
	(void) sd_notifyf(0, "STOPPING=1\nSTATUS=Draining: %d requests in flight, up to %s",
			  running + waiting, grace);
	d->drain_deadline = kiln_now_usec() + inferd_arg.drain_grace_usec;
	if (inferd_arg.drain_grace_usec == 0)
		return sd_event_exit(ev, 0);
	int r = sd_event_add_time_relative(ev, NULL, CLOCK_MONOTONIC, 0, 0, on_drain_poll, d);
	if (r < 0) {
		log_error_errno(r, "Failed to start the drain timer: %m; stopping now");
		return sd_event_exit(ev, 0);
	}
	return 0;
}

/* WATCHDOG=1 only while every engine's scheduler turns (inferd_on_engine_tick, at
 * least every watchdog/4 when idle): one scheduler wedged in a step, or a
 * main loop that no longer runs this timer, gets no pings and systemd
 * restarts the service. */
static int on_watchdog(sd_event_source *s, uint64_t usec, void *u)
{
	daemon_state *d = u;
	uint64_t now = kiln_now_usec(), since = 0;
	const char *who = NULL;
	for (int i = 0; i < inferd_served.n; i++) {
		uint64_t t = now - atomic_load(&inferd_served.apps[i].last_tick);
		if (t >= since) {
			since = t;
			who = inferd_served.apps[i].model.name;
		}
	}
	if (since < d->watchdog_usec / 2) {
		(void) sd_notify(0, "WATCHDOG=1");
		if (d->watchdog_missed)
			log_info("The engines' schedulers turn again: watchdog pings resume");
		d->watchdog_missed = false;
	} else if (!d->watchdog_missed) {
		char t[32];
		kiln_format_duration(t, sizeof(t), since);
		log_warning("The engine of %s has not turned for %s: no watchdog ping "
			    "(systemd restarts kiln-inferd at WatchdogSec)",
			    who, t);
		d->watchdog_missed = true;
	}
	return rearm(s, d->watchdog_usec / 4);
}

/* Set by each engine's scheduler thread each turn of its loop (the
 * on_tick hook, userdata its inferd_app); read by the watchdog timer on
 * the main thread. */
void inferd_on_engine_tick(void *userdata)
{
	inferd_app *a = userdata;
	atomic_store(&a->last_tick, kiln_now_usec());
}

/* ---- a stop while the models load ------------------------------------------ */

/* SIGTERM/SIGINT stay blocked for the event loop's signalfd, which only
 * runs once the models are in; a load takes minutes on a big model, and
 * `systemctl stop` must not wait for it (nor for TimeoutStopSec and a
 * SIGKILL).  This thread takes them while the models load: nothing is in
 * flight yet, so stopping is exiting.  Cancelled once the load is done
 * (sigwaitinfo is a cancellation point); later signals reach the signalfd. */
static void *load_signal_main(void *u)
{
	sigset_t ss;
	sigemptyset(&ss);
	sigaddset(&ss, SIGTERM);
	sigaddset(&ss, SIGINT);
	for (;;) {
		siginfo_t si;
		int sig = sigwaitinfo(&ss, &si);
		if (sig < 0)
			continue;
		log_info("Got %s while loading the models: stopping (nothing was served yet)",
			 strsignal(sig));
		_exit(KILN_EXIT_OK);
	}
	return NULL;
}

/* ---- the port ------------------------------------------------------------ */

/* The HTTP server on the socket systemd passed (kiln-inferd.socket, bound
 * at boot before any user can run anything) or, started by hand, on
 * --listen:--port bound here.  A taken port is fatal at once, before any
 * model is loaded, naming who holds it.  0 or an exit status. */
static int listen_port(kiln_http_server **ret)
{
	int fd = kiln_http_activation_fd();
	if (fd < 0) {
		log_error("kiln-inferd was socket-activated with more than one socket, or one that "
			  "is not a listening TCP socket: kiln-inferd.socket needs exactly one "
			  "ListenStream=ADDRESS:PORT");
		return KILN_EXIT_USAGE;
	}
	bool fd_passed = fd > 0;
	if (fd_passed)
		log_info("Serving on the socket systemd passed (kiln-inferd.socket); --listen and "
			 "--port are not used");
	else {
		fd = kiln_http_listen(inferd_arg.listen, (uint16_t) inferd_arg.port);
		if (fd == -EADDRINUSE) {
			char who[160];
			(void) kiln_http_port_holder((uint16_t) inferd_arg.port, who, sizeof(who));
			log_error("Port %d (%s) is already in use, held by %s; kiln-inferd does not "
				  "share its port (clients would send their API keys to whoever "
				  "holds it) and stops before loading any model.  Stop that "
				  "process (ss -ltnp 'sport = :%d' shows it), or set "
				  "inference.port; on a node, kiln-inferd.socket binds the port at "
				  "boot, before any user can",
				  inferd_arg.port, inferd_arg.listen, who, inferd_arg.port);
			return KILN_EXIT_FAILURE;
		}
		if (fd < 0) {
			log_error_errno(fd, "Failed to listen on %s:%d: %m", inferd_arg.listen,
					inferd_arg.port);
			return KILN_EXIT_FAILURE;
		}
	}
	kiln_http_config hc = { .threads = (unsigned) inferd_arg.threads,
				.max_connections = (unsigned) inferd_arg.max_conns,
				.max_connections_per_client = (unsigned) inferd_arg.per_client,
				.idle_timeout_s = (unsigned) inferd_arg.idle_timeout,
				.max_body_bytes = (size_t) inferd_arg.max_body,
				.stream_shutdown_bytes = inferd_sse_shutdown,
				.access_log = inferd_on_access,
				.routes = inferd_routes,
				.n_routes = inferd_n_routes };
	int r = kiln_http_server_start_fd(&hc, fd, ret);
	if (r < 0) {
		log_error_errno(r, "Failed to start the HTTP server on %s:%d: %m", inferd_arg.listen,
				inferd_arg.port);
		return KILN_EXIT_FAILURE;
	}
	unsigned bound = kiln_http_server_port(*ret);
	if (fd_passed && inferd_arg.port && bound != (unsigned) inferd_arg.port)
		log_warning("kiln-inferd.socket listens on port %u but inference.port is %d: "
			    "clients following the cluster file miss this server; render the "
			    "socket's drop-in (kiln render kiln-inferd.socket.conf -o "
			    "/etc/systemd/system/kiln-inferd.socket.d/kiln.conf), daemon-reload and "
			    "restart kiln-inferd.socket",
			    bound, inferd_arg.port);
	log_info("Listening on port %u; loading the models (requests get 503 loading until "
		 "then)",
		 bound);
	return 0;
}

static int run(int argc, char **argv)
{
	/* Before any thread of ours starts: they inherit the mask. */
	block_stop_signals();
	_cleanup_(kiln_cfg_freep) kiln_cfg *cfg = NULL;
	int r = inferd_settings_from_cfg(&cfg);
	if (r != 0)
		return r;
	daemon_state d = {};
	_cleanup_(sd_event_unrefp) sd_event *ev = NULL;
	r = sd_event_default(&ev);
	if (r < 0)
		return log_error_errno(r, "Failed to allocate the event loop: %m");
	if ((r = sd_event_add_signal(ev, NULL, SIGTERM, on_signal, &d)) < 0 ||
	    (r = sd_event_add_signal(ev, NULL, SIGINT, on_signal, &d)) < 0)
		return log_error_errno(r, "Failed to watch SIGTERM/SIGINT: %m");
	/* WatchdogSec= of the unit: pinged by on_watchdog() while the engines
	 * turn, not by sd-event's unconditional pings. */
	if (sd_watchdog_enabled(false, &d.watchdog_usec) <= 0)
		d.watchdog_usec = 0;

	if (inferd_arg.api_keys && (r = inferd_keys_load(inferd_arg.api_keys)) != 0) {
		inferd_keys_free();
		return r;
	}

	/* The port first, the models after: loading a big model takes
	 * minutes, and a port left free that long is one any user on the node
	 * can bind and then collect the clients' keys on.  Until the models
	 * are in, every route answers 503 "loading" (inferd_loaded). */
	kiln_http_server *srv = NULL;
	r = listen_port(&srv);
	if (r != 0) {
		inferd_keys_free();
		return r;
	}
	(void) sd_notify(0, "STATUS=Loading the models (the port answers 503 loading)");
	bool watching = pthread_create(&load_thread, NULL, load_signal_main, NULL) == 0;
	atomic_store(&load_watch, watching);
	r = inferd_models_load(&d);
	if (watching) {
		atomic_store(&load_watch, false);
		pthread_cancel(load_thread);
		pthread_join(load_thread, NULL);
	}
	if (r != 0) {
		kiln_http_server_free(srv);
		inferd_keys_free();
		inferd_models_free();
		return r;
	}
	atomic_store(&inferd_loaded, true);
	_cleanup_strbuf_ kiln_strbuf what;
	kiln_strbuf_init(&what);
	inferd_models_describe(&what, kiln_http_server_port(srv));
	log_info("Serving %s", what.s);
	if (d.watchdog_usec) {
		r = sd_event_add_time_relative(ev, NULL, CLOCK_MONOTONIC, 0, 0, on_watchdog, &d);
		if (r < 0) {
			kiln_http_server_free(srv);
			inferd_models_free();
			inferd_keys_free();
			return log_error_errno(r, "Failed to start the watchdog timer: %m");
		}
	}
	(void) sd_notifyf(0, "READY=1\nSTATUS=Serving %s", what.s);

	r = sd_event_loop(ev);
	if (r < 0)
		log_error_errno(r, "Event loop failed: %m");
	/* The server first: its streams are cancelled and no new request
	 * reaches an engine; then each engine cancels what is left (every
	 * job's finish callback closes its stream and frees it); then the
	 * engines, the tokenizers, the backends. */
	kiln_http_server_free(srv);
	for (int i = 0; i < inferd_served.n; i++)
		kiln_engine_shutdown(inferd_served.apps[i].engine, KILN_ENGINE_CANCEL);
	inferd_models_free();
	inferd_keys_free();
	return r < 0 ? r : KILN_EXIT_OK;
}

KILN_DEFINE_MAIN(inferd_prog, inferd_parse_argv, run)
