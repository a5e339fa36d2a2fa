#!/bin/bash
# test-accounting.sh — slurmdbd accounting from the cluster file: kiln check,
# `kiln render slurmdbd.conf` (the password read from its file, mode 0600,
# clear errors for a missing or bad password file), the AccountingStorage
# lines of slurm.conf, and Debian's slurmctld loading them (it reaches for
# slurmdbd at the rendered host and port; no MariaDB needed).  Prints TAP.
set -uo pipefail
# shellcheck source=tests/lib/suite.sh
. "$(dirname "$0")/../lib/suite.sh"
# shellcheck source=tests/lib/tap.sh
. "$top/tests/lib/tap.sh"
W=$(mktemp -d /tmp/kiln-accounting.XXXXXX)
ctld=''
trap '[ -n "$ctld" ] && kill "$ctld" 2>/dev/null; rm -rf "$W"' EXIT

printf 's3cret-pw\n' >"$W/pass"
chmod 600 "$W/pass"
dbd_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
{
	cat config/examples/demo.cfg
	printf 'accounting = { storage_host = "db"; storage_password_file = "%s"; dbd_host = "127.0.0.1"; dbd_port = %s; };\n' \
		"$W/pass" "$dbd_port"
} >"$W/acct.cfg"

ok "kiln check: accounting with a password file is valid" "$KILN" -q -c "$W/acct.cfg" check
ok "  ... no warning for a mode-0600 password file" bash -c "'$KILN' -c '$W/acct.cfg' check 2>&1 >/dev/null | grep -c . | grep -qx 0"
chmod 644 "$W/pass"
"$KILN" -c "$W/acct.cfg" check >/dev/null 2>"$W/err"
rc=$?
ok "a password file others can read: exit 0 with a warning naming the mode and the fix" \
	bash -c "[ $rc = 0 ] && grep -q 'accounting.storage_password_file: warning: $W/pass is readable by others (mode 0644) and holds the database password; chmod 600 it' '$W/err'"
ok "  ... --strict: exit 2" bash -c "'$KILN' -c '$W/acct.cfg' check --strict 2>/dev/null; [ \$? = 2 ]"
chmod 600 "$W/pass"
"$KILN" -c "$W/acct.cfg" render slurmdbd.conf -o "$W/slurmdbd.conf"
ok "render slurmdbd.conf -o: exit 0" test $? = 0
ok "  ... mode 0600 (it holds the password)" test "$(stat -c %a "$W/slurmdbd.conf")" = 600
ok "  ... StoragePass from the password file, its newline dropped" grep -qx 'StoragePass=s3cret-pw' "$W/slurmdbd.conf"
ok "  ... StorageHost, StorageUser, StorageLoc, DbdHost, DbdPort" bash -c \
	"grep -qx StorageHost=db '$W/slurmdbd.conf' && grep -qx StorageUser=slurm '$W/slurmdbd.conf' && grep -qx StorageLoc=slurm_acct_db '$W/slurmdbd.conf' && grep -qx DbdHost=127.0.0.1 '$W/slurmdbd.conf' && grep -qx DbdPort=$dbd_port '$W/slurmdbd.conf'"
"$KILN" -c "$W/acct.cfg" render slurm.conf -o "$W/slurm.conf"
ok "slurm.conf: AccountingStorageType=accounting_storage/slurmdbd, Host and Port of slurmdbd" bash -c \
	"grep -qx AccountingStorageType=accounting_storage/slurmdbd '$W/slurm.conf' && grep -qx AccountingStorageHost=127.0.0.1 '$W/slurm.conf' && grep -qx AccountingStoragePort=$dbd_port '$W/slurm.conf'"
ok "render all -o: slurmdbd.conf 0600, the rest 0644" bash -c \
	"'$KILN' -q -c '$W/acct.cfg' render all -o '$W/all' && [ \$(stat -c %a '$W/all/slurmdbd.conf') = 600 ] && [ \$(stat -c %a '$W/all/slurm.conf') = 644 ]"
(umask 022 && "$KILN" -c "$W/acct.cfg" render slurmdbd.conf >"$W/stdout.conf" 2>"$W/err")
rc=$?
ok "render slurmdbd.conf > FILE: the shell's 0644 file narrowed to 0600, the password in it, no notice" bash -c \
	"[ $rc = 0 ] && [ \$(stat -c %a '$W/stdout.conf') = 600 ] && grep -qx StoragePass=s3cret-pw '$W/stdout.conf' && [ ! -s '$W/err' ]"
(umask 022 && "$KILN" -c "$W/acct.cfg" render slurm.conf >"$W/stdout-slurm.conf")
ok "render slurm.conf > FILE (no secret): left at 0644" test "$(stat -c %a "$W/stdout-slurm.conf")" = 644
script -qec "'$KILN' -c '$W/acct.cfg' render slurmdbd.conf" /dev/null >"$W/tty.out" 2>&1
ok "render slurmdbd.conf on a terminal: one line says a secret is shown" \
	grep -q 'slurmdbd.conf holds a secret; it is shown on this terminal' "$W/tty.out"
script -qec "'$KILN' -c '$W/acct.cfg' render hosts" /dev/null >"$W/tty.out" 2>&1
ok "  ... and not for a target without one" bash -c "! grep -q 'holds a secret' '$W/tty.out'"
ok "without accounting: slurmdbd.conf says accounting is off, slurm.conf has no AccountingStorageType" bash -c \
	"'$KILN' -c config/examples/demo.cfg render slurmdbd.conf | grep -q 'accounting is off' && ! '$KILN' -c config/examples/demo.cfg render slurm.conf | grep -q AccountingStorage"

rm "$W/pass"
ok "password file missing (a compute node): kiln check warns, exit 0" \
	bash -c "'$KILN' -c '$W/acct.cfg' check 2>&1 >/dev/null | grep -q 'does not exist on this host; fine on a compute node'"
"$KILN" -c "$W/acct.cfg" render slurmdbd.conf -o "$W/missing.conf" 2>"$W/err"
rc=$?
ok "password file missing: exit 1, nothing written" bash -c "[ $rc = 1 ] && [ ! -e '$W/missing.conf' ]"
ok "  ... names the file, the key and what to do" grep -q "cannot read the database password from '$W/pass' (accounting.storage_password_file): No such file or directory; create it" "$W/err"
printf 'two\nlines\n' >"$W/pass"
"$KILN" -c "$W/acct.cfg" render slurmdbd.conf >/dev/null 2>"$W/err"
rc=$?
ok "a password of two lines: exit 1, says why" bash -c "[ $rc = 1 ] && grep -q 'holds a control character' '$W/err'"
printf 's3cret-pw\n' >"$W/pass"

# ---- Debian's slurmctld loads slurm.conf with slurmdbd accounting -------------
if ! command -v slurmctld >/dev/null; then
	skip "slurmctld not installed (make deps)"
	tap_done
	exit
fi
mkdir -p "$W/ctld/state"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# where this controller runs: this host, scratch paths, no munge; the
# Accounting* lines stay as kiln rendered them
grep -viE '^(SlurmctldHost|SlurmctldPort|SlurmUser|StateSaveLocation|SlurmctldPidFile|SlurmctldLogFile|AuthType|CryptoType)=' \
	"$W/slurm.conf" >"$W/ctld/slurm.conf"
cat >>"$W/ctld/slurm.conf" <<CONF
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmctldPort=$port
SlurmUser=$(id -un)
StateSaveLocation=$W/ctld/state
SlurmctldPidFile=$W/ctld/slurmctld.pid
SlurmctldLogFile=$W/ctld/slurmctld.log
AuthType=auth/none
CredType=cred/none
CONF
cp "$W/all/gres.conf" "$W/all/cgroup.conf" "$W/ctld/"
(cd "$W/ctld" && exec env -u SLURM_CONF slurmctld -D -f "$W/ctld/slurm.conf" >"$W/ctld/out" 2>&1) &
ctld=$!
for _ in $(seq 100); do
	grep -q "persistent connection to host:127.0.0.1:$dbd_port" "$W/ctld/slurmctld.log" 2>/dev/null && break
	kill -0 "$ctld" 2>/dev/null || break
	sleep 0.1
done
ok "slurmctld parses it and reaches for slurmdbd at 127.0.0.1:$dbd_port (the rendered host and port)" \
	grep -q "persistent connection to host:127.0.0.1:$dbd_port" "$W/ctld/slurmctld.log"
ok "  ... no parse error" bash -c "! grep -qiE 'Parsing error|Unable to process configuration' '$W/ctld/slurmctld.log' '$W/ctld/out'"
kill "$ctld" 2>/dev/null
wait "$ctld" 2>/dev/null
ctld=''
mkdir -p "$W/live"
"$KILN" -c "$W/acct.cfg" apply --dry-run --slurm-dir "$W/live" --publish "$W/live/cluster.cfg" >"$W/apply.out" 2>&1
ok "kiln apply --dry-run validates it (slurmdbd itself not contacted)" \
	grep -q '^validated: slurmctld accepts the new configuration (.*slurmdbd itself not contacted)' "$W/apply.out"
tap_done
