/* kr-worker.c — a C training-loop stand-in for kiln-run's tests.
 *
 * Reads the torchrun-style environment kiln-run gives it, exchanges the kk
 * communicator id through the rendezvous store (rank 0 publishes it under
 * $KILN_COMM_ID_KEY, the others fetch it), then runs "training steps": each
 * step all-reduces [rank+1, step] over the kk CPU backend and checks the sum
 * against the closed form.  Rank 0 checkpoints the step count to a file
 * after every step and every rank resumes from it, so a test can count
 * steps across a lost node.  It appends one line per event to --log:
 *
 *   start round R rank r world W local l group g host H step S
 *   step S world W            (rank 0, every step)
 *   finish round R rank r world W steps S
 *
 * Usage: kiln-run-worker --steps N [--step-ms MS] [--ckpt FILE] [--log FILE] [--no-comm]
 * Exit: 0 done; 3 wrong all-reduce result; 4 bad environment; 5 store/comm error. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "kiln/macro.h"
#include "kiln/parse.h"
#include "kiln/store.h"
#include "kiln/strbuf.h"
#include "kk.h"

static volatile sig_atomic_t checkpoint_now;

static void on_usr1(int sig)
{
	(void) sig;
	checkpoint_now = 1;
}

static int env_int(const char *name, int *ret)
{
	const char *v = getenv(name);
	if (!v || kiln_parse_int(v, 0, INT32_MAX, ret) < 0) {
		fprintf(stderr, "kiln-run-worker: %s is missing or not a number\n", name);
		return -EINVAL;
	}
	return 0;
}

static void logline(const char *path, const char *fmt, ...) _printf_(2, 3);
static void logline(const char *path, const char *fmt, ...)
{
	char buf[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof(buf) - 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	n = MIN(n, (int) sizeof(buf) - 2);
	buf[n++] = '\n';
	printf("%.*s", n, buf);
	fflush(stdout);
	if (!path)
		return;
	int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0)
		return;
	if (write(fd, buf, (size_t) n) < 0)
		perror("write log");
	close(fd);
}

static int read_ckpt(const char *path)
{
	_cleanup_free_ char *s = NULL;
	int v = 0;
	if (!path || kiln_read_file(path, 64, &s, NULL) < 0)
		return 0;
	if (kiln_parse_int(s, 0, INT32_MAX, &v) < 0)
		return 0;
	return v;
}

int main(int argc, char **argv)
{
	int steps = 10, step_ms = 100, c;
	const char *ckpt = NULL, *logp = NULL;
	bool comm = true;
	static const struct option opts[] = { { "steps", required_argument, NULL, 's' },
					      { "step-ms", required_argument, NULL, 'm' },
					      { "ckpt", required_argument, NULL, 'c' },
					      { "log", required_argument, NULL, 'l' },
					      { "no-comm", no_argument, NULL, 'n' },
					      {} };
	while ((c = getopt_long(argc, argv, "", opts, NULL)) >= 0) {
		switch (c) {
		case 's':
			steps = atoi(optarg);
			break;
		case 'm':
			step_ms = atoi(optarg);
			break;
		case 'c':
			ckpt = optarg;
			break;
		case 'l':
			logp = optarg;
			break;
		case 'n':
			comm = false;
			break;
		default:
			return 4;
		}
	}
	signal(SIGUSR1, on_usr1);

	int rank, world, local, group, port, restart;
	if (env_int("RANK", &rank) < 0 || env_int("WORLD_SIZE", &world) < 0 ||
	    env_int("LOCAL_RANK", &local) < 0 || env_int("GROUP_RANK", &group) < 0 ||
	    env_int("MASTER_PORT", &port) < 0 ||
	    env_int("TORCHELASTIC_RESTART_COUNT", &restart) < 0)
		return 4;
	const char *master = getenv("MASTER_ADDR"), *key = getenv("KILN_COMM_ID_KEY");
	const char *host = getenv("KILN_HOST");
	if (!master || !key || !streq_ptr(getenv("TORCHELASTIC_USE_AGENT_STORE"), "True")) {
		fprintf(stderr, "kiln-run-worker: MASTER_ADDR, KILN_COMM_ID_KEY or "
				"TORCHELASTIC_USE_AGENT_STORE missing\n");
		return 4;
	}
	int step = read_ckpt(ckpt);
	logline(logp, "start round %d rank %d world %d local %d group %d host %s step %d",
		restart + 1, rank, world, local, group, strna(host), step);

	kk_backend *be = NULL;
	kk_stream *st = NULL;
	kk_comm *cm = NULL;
	kk_buffer *buf = NULL;
	kiln_store_client *sc = NULL;
	int r = 0, ret = 0;
	if (comm) {
		r = kiln_store_client_connect(master, (uint16_t) port, NULL, 30 * KILN_USEC_PER_SEC,
					      &sc);
		if (r < 0) {
			fprintf(stderr, "kiln-run-worker: store %s:%d: %s\n", master, port,
				strerror(-r));
			return 5;
		}
		if ((r = kk_backend_open("cpu", &be)) < 0 || (r = kk_stream_create(be, &st)) < 0 ||
		    (r = kk_buffer_alloc(be, KK_F32, 2, &buf)) < 0) {
			fprintf(stderr, "kiln-run-worker: kk: %s\n", strerror(-r));
			return 5;
		}
		char id[KK_COMM_ID_BYTES] = { 0 };
		if (rank == 0) {
			r = kk_comm_get_id(be, id, sizeof(id));
			if (r == 0)
				r = kiln_store_client_set(sc, key, id, sizeof(id));
		} else {
			void *v = NULL;
			size_t len = 0;
			r = kiln_store_client_get(sc, key, &v, &len);
			if (r == 0 && len == sizeof(id))
				memcpy(id, v, len);
			else if (r == 0)
				r = -EPROTO;
			free(v);
		}
		if (r == 0)
			r = kk_comm_init(be, rank, world, id, sizeof(id), &cm);
		if (r < 0) {
			fprintf(stderr, "kiln-run-worker: comm setup (key %s): %s\n", key,
				strerror(-r));
			return 5;
		}
	}
	for (; step < steps; step++) {
		if (comm) {
			float in[2] = { (float) (rank + 1), (float) step }, out[2];
			if ((r = kk_buffer_upload(be, st, buf, 0, in, sizeof(in))) < 0 ||
			    (r = kk_all_reduce(cm, st, buf, buf, 2, KK_SUM)) < 0 ||
			    (r = kk_buffer_download(be, st, buf, 0, out, sizeof(out))) < 0) {
				fprintf(stderr, "kiln-run-worker: all_reduce at step %d: %s\n",
					step, strerror(-r));
				ret = 5;
				break;
			}
			float want0 = (float) world * (float) (world + 1) / 2.0f;
			float want1 = (float) world * (float) step;
			if (out[0] != want0 || out[1] != want1) {
				fprintf(stderr,
					"kiln-run-worker: all_reduce gave %g,%g, want %g,%g\n",
					out[0], out[1], want0, want1);
				ret = 3;
				break;
			}
		}
		if (step_ms > 0)
			usleep((useconds_t) step_ms * 1000);
		if (rank == 0) {
			if (ckpt) {
				char s[32];
				int n = snprintf(s, sizeof(s), "%d", step + 1);
				kiln_write_file_atomic(ckpt, s, (size_t) n, 0644);
			}
			logline(logp, "step %d world %d", step, world);
		}
		if (checkpoint_now) {
			/* The agent also counts the request in the store. */
			void *v = NULL;
			size_t len;
			const char *ck = getenv("KILN_CHECKPOINT_KEY");
			if (!sc || !ck || kiln_store_client_try_get(sc, ck, &v, &len) < 0)
				v = NULL;
			logline(logp, "checkpoint-now rank %d step %d key %s", rank, step,
				v ? (char *) v : "unset");
			free(v);
			checkpoint_now = 0;
		}
	}
	if (ret == 0)
		logline(logp, "finish round %d rank %d world %d steps %d", restart + 1, rank, world,
			step);
	kk_comm_free(cm);
	kk_buffer_free(buf);
	kk_stream_free(st);
	kk_backend_free(be);
	kiln_store_client_free(sc);
	return ret;
}
