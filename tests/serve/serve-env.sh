# shellcheck shell=bash
# serve-env.sh — what the kiln serve suites share (source it after
# tests/lib/suite.sh and tests/lib/tap.sh):
#   serve_site DIR [EXTRA_IMAGE_KEYS] [EXTRA_GROUPS]
#                  a cluster file DIR/cluster.cfg whose nodes have loopback
#                  addresses (n1 127.0.0.11, n2 127.0.0.12 the inference node,
#                  n3 127.0.0.13), an image directory DIR/img, a munge key,
#                  API keys and a root password hash (root-owned, 0600), the
#                  head's signing key pair DIR/head.key + head.pub (the
#                  image's cluster.cfg is signed: kiln-node-init checks it),
#                  and a free port in $SERVE_PORT; sets $SERVE_URL
#   serve_start DIR [OPTIONS]   kiln serve in the background: $SERVE_PID,
#                  log DIR/serve.log; waits until it answers
#   serve_stop     SIGTERM, waits; returns its exit status
#   code URL [CURL ARGS]  the HTTP status of a GET
SERVE_PID=''
free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
serve_site() {
	local d=$1 extra_image=${2:-} extra=${3:-}
	mkdir -p "$d/img"
	SERVE_PORT=$(free_port)
	SERVE_URL=http://127.0.0.1:$SERVE_PORT/kiln
	head -c 4194304 /dev/urandom >"$d/img/initrd.img" && chmod 640 "$d/img/initrd.img"
	printf 'not a kernel\n' >"$d/img/vmlinuz" && chmod 644 "$d/img/vmlinuz"
	# shellcheck disable=SC2016 # a crypt(3) hash below, not an expansion
	(umask 077 && head -c 1024 /dev/urandom >"$d/munge.key" &&
		printf 'sk-test-key-one\n' >"$d/inferd-keys" &&
		printf '%s\n' '$y$j9T$abcdefghijklmnop$0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcde' >"$d/root-hash")
	cat >"$d/cluster.cfg" <<CFG
cluster = { name = "serve"; };
network = { subnet = "127.0.0.0/8"; gateway = "127.0.0.1"; };
head = { hostname = "head"; address = "127.0.0.1"; };
node_groups = (
  { name = "c"; hosts = "n[1-3]"; addresses = "127.0.0.11-127.0.0.13";
    macs = [ "52:54:00:5e:00:01", "52:54:00:5e:00:02", "52:54:00:5e:00:0a" ];
    cpus = 1; memory_mb = 1000; partitions = [ "p" ]; }
);
slurm = { partitions = ( { name = "p"; nodes = "n[1-3]"; default = true; } ); };
inference = { enabled = true; nodes = "n2"; model = "$d/model.bin"; api_keys_file = "$d/inferd-keys"; };
image = { output_dir = "$d/img"; http_url = "$SERVE_URL"; munge_key = "$d/munge.key";
          root_password_file = "$d/root-hash"; signing_key = "$d/head.key"; $extra_image };
$extra
CFG
	touch "$d/model.bin"
	cp "$d/cluster.cfg" "$d/img/cluster.cfg" && chmod 644 "$d/img/cluster.cfg"
	rm -f "$d/head.key" "$d/head.pub"
	"$KILN" -q keygen --key "$d/head.key" >/dev/null && "$KILN" -q sign --key "$d/head.key" "$d/img/cluster.cfg" >/dev/null
}
serve_start() {
	local d=$1
	shift
	"$KILN" -c "$d/cluster.cfg" serve "$@" >"$d/serve.log" 2>&1 &
	SERVE_PID=$!
	for _ in $(seq 100); do
		curl -s -o /dev/null "$SERVE_URL/boot.ipxe" && return 0
		kill -0 "$SERVE_PID" 2>/dev/null || return 1
		sleep 0.05
	done
	return 1
}
serve_stop() {
	[ -n "$SERVE_PID" ] || return 0
	kill -TERM "$SERVE_PID" 2>/dev/null
	wait "$SERVE_PID"
	local rc=$?
	SERVE_PID=''
	return $rc
}
code() {
	local u=$1
	shift
	curl -s -o /dev/null -w '%{http_code}' "$@" "$u"
}
