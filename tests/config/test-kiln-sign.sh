#!/bin/bash
# test-kiln-sign.sh — `kiln keygen`, `kiln sign`, `kiln verify` and `kiln
# check --node-paths` end to end, printing TAP: the key files and their
# modes, no overwrite without --force, the signing key from the cluster
# file's image.signing_key, a good signature (exit 0), and exit 2 naming the
# file for a tampered file, an unsigned one, one signed by another key, a
# truncated or garbage signature, a secret key others may read; and code
# paths a user other than root can change refused (the issue's exploit: a
# library written by nobody).
set -u
# shellcheck source=tests/lib/suite.sh
. "$(dirname "$0")/../lib/suite.sh"
# shellcheck source=tests/lib/tap.sh
. "$top/tests/lib/tap.sh"
W=$(mktemp -d /tmp/kiln-sign-test.XXXXXX)
chmod 755 "$W"
trap 'rm -rf "$W"' EXIT
export KILN_LOG_PREFIX=0
unset KILN_CONFIG

# run NAME CMD...: exit status in $rc, stdout/stderr in $W/NAME.{out,err}
run() { local name=$1; shift; "$@" >"$W/$name.out" 2>"$W/$name.err"; rc=$?; }
said() { grep -qF -- "$2" "$W/$1.err"; }

# ---- keygen -------------------------------------------------------------------
run keygen "$KILN" keygen --key "$W/head.key"
ok "keygen --key FILE: exit 0" test "$rc" = 0
ok "  ... secret key 0600, public key 0644 next to it (head.key -> head.pub)" \
	test "$(stat -c %a "$W/head.key")/$(stat -c %a "$W/head.pub" 2>/dev/null)" = 600/644
ok "  ... one line each: kiln-secret-key / kiln-public-key v1 ed25519 KEYID BASE64" \
	bash -c "grep -qE '^kiln-secret-key v1 ed25519 [0-9a-f]{16} [A-Za-z0-9+/]{43}=$' '$W/head.key' &&
		grep -qE '^kiln-public-key v1 ed25519 [0-9a-f]{16} [A-Za-z0-9+/]{43}=$' '$W/head.pub'"
id=$(cut -d' ' -f4 "$W/head.pub")
ok "  ... both name the same key id ($id), and keygen says it" \
	bash -c "[ \"\$(cut -d' ' -f4 '$W/head.key')\" = '$id' ] && grep -q 'key $id' '$W/keygen.out'"
cp "$W/head.key" "$W/head.key.orig"
run again "$KILN" keygen --key "$W/head.key"
ok "keygen over an existing key: exit 2, key unchanged, says --force" \
	bash -c "[ $rc = 2 ] && cmp -s '$W/head.key' '$W/head.key.orig' && grep -q -- '--force' '$W/again.err'"
rm -f "$W/lone.key" && : >"$W/lone.pub"
run lonepub "$KILN" keygen --key "$W/lone.key"
ok "keygen where only the .pub exists: exit 2 too (images carry it)" test "$rc" = 2
run force "$KILN" keygen --key "$W/other.key"
run force2 "$KILN" keygen --key "$W/other.key" --force
ok "keygen --force replaces the key" \
	bash -c "[ $rc = 0 ] && [ \"\$(cut -d' ' -f4 '$W/other.pub')\" != '$id' ]"
run nodir "$KILN" keygen --key "$W/no/such/dir/head.key"
ok "keygen into a missing directory: exit 1, names the file" \
	bash -c "[ $rc = 1 ] && grep -q '$W/no/such/dir/head.key' '$W/nodir.err'"

# ---- sign ---------------------------------------------------------------------
sed "s|signing_key = \"/etc/kiln/head.key\"|signing_key = \"$W/head.key\"|" config/examples/dgx-pod.cfg >"$W/cluster.cfg"
grep -q "signing_key = \"$W/head.key\"" "$W/cluster.cfg" || diag "signing_key not set in the test file"
run sign "$KILN" -c "$W/cluster.cfg" sign
ok "sign (the cluster file, its image.signing_key): exit 0, prints FILE.sig" \
	bash -c "[ $rc = 0 ] && [ \"\$(cat '$W/sign.out')\" = '$W/cluster.cfg.sig' ]"
ok "  ... cluster.cfg.sig is one line: kiln-signature v1 ed25519 $id BASE64 (64 bytes), 0644" \
	bash -c "grep -qE '^kiln-signature v1 ed25519 $id [A-Za-z0-9+/]{86}==$' '$W/cluster.cfg.sig' &&
		[ \$(wc -l <'$W/cluster.cfg.sig') = 1 ] && [ \$(stat -c %a '$W/cluster.cfg.sig') = 644 ]"
ok "  ... no temporary file left" bash -c "! ls '$W' | grep -q kiln-tmp"
run signfile "$KILN" sign "$W/cluster.cfg"
ok "sign FILE (no -c: the key setting from FILE itself): exit 0" test "$rc" = 0
printf 'not a cluster file\n' >"$W/plain.txt"
run signplain env KILN_CONFIG="$W/cluster.cfg" "$KILN" sign "$W/plain.txt"
ok "sign a FILE that is no cluster file: the key from \$KILN_CONFIG's image.signing_key" \
	bash -c "[ $rc = 0 ] && '$KILN' -q verify --key '$W/head.pub' '$W/plain.txt'"
cp "$W/cluster.cfg" "$W/copy.cfg"
run signkey "$KILN" sign --key "$W/other.key" "$W/copy.cfg"
ok "sign --key FILE: signs with that key" bash -c "[ $rc = 0 ] && grep -q \"\$(cut -d' ' -f4 '$W/other.pub')\" '$W/copy.cfg.sig'"
run signnokey "$KILN" sign --key "$W/missing.key" "$W/copy.cfg"
ok "sign with a missing key: exit 2, says kiln keygen" \
	bash -c "[ $rc = 2 ] && grep -q 'missing.key' '$W/signnokey.err' && grep -q 'kiln keygen' '$W/signnokey.err'"
cp "$W/head.key" "$W/loose.key" && chmod 0644 "$W/loose.key"
run signloose "$KILN" sign --key "$W/loose.key" "$W/copy.cfg"
ok "sign with a secret key others may read (0644): exit 2, says chmod 600" \
	bash -c "[ $rc = 2 ] && grep -q 'chmod 600' '$W/signloose.err'"
printf 'kiln-secret-key v1 ed25519 0123456789abcdef AAAA\n' >"$W/junk.key" && chmod 600 "$W/junk.key"
run signjunk "$KILN" sign --key "$W/junk.key" "$W/copy.cfg"
ok "sign with a malformed secret key: exit 2" test "$rc" = 2

# ---- verify -------------------------------------------------------------------
"$KILN" -q -c "$W/cluster.cfg" sign >/dev/null 2>&1
run good "$KILN" verify --key "$W/head.pub" "$W/cluster.cfg"
ok "verify a good signature: exit 0, names the key" \
	bash -c "[ $rc = 0 ] && grep -q 'good signature by key $id' '$W/good.err'"
run goodsig "$KILN" verify --key "$W/head.pub" "$W/cluster.cfg" "$W/cluster.cfg.sig"
ok "verify FILE SIG: exit 0" test "$rc" = 0

cp "$W/cluster.cfg" "$W/t.cfg" && cp "$W/cluster.cfg.sig" "$W/t.cfg.sig"
sed -i 's/10.40.0.1/10.40.0.66/' "$W/t.cfg" # the controller's address, as an attacker would
run tampered "$KILN" verify --key "$W/head.pub" "$W/t.cfg"
ok "tampered file (head address changed): exit 2, names the file, says altered" \
	bash -c "[ $rc = 2 ] && grep -q '$W/t.cfg: bad signature' '$W/tampered.err' && grep -q 'altered' '$W/tampered.err'"
cp "$W/cluster.cfg" "$W/flip.cfg" && cp "$W/cluster.cfg.sig" "$W/flip.cfg.sig"
printf '\x01' | dd of="$W/flip.cfg" bs=1 seek=100 conv=notrunc status=none
run flip "$KILN" verify --key "$W/head.pub" "$W/flip.cfg"
ok "one byte changed: exit 2" test "$rc" = 2

cp "$W/cluster.cfg" "$W/u.cfg"
run unsigned "$KILN" verify --key "$W/head.pub" "$W/u.cfg"
ok "unsigned (no FILE.sig): exit 2, says not signed and how to sign" \
	bash -c "[ $rc = 2 ] && grep -q '$W/u.cfg is not signed' '$W/unsigned.err' && grep -q 'kiln sign' '$W/unsigned.err'"

cp "$W/cluster.cfg" "$W/o.cfg" && "$KILN" -q sign --key "$W/other.key" "$W/o.cfg" >/dev/null
run otherkey "$KILN" verify --key "$W/head.pub" "$W/o.cfg"
ok "signed by another key: exit 2, names both key ids" \
	bash -c "[ $rc = 2 ] && grep -q \"signed by key \$(cut -d' ' -f4 '$W/other.pub'), not by the trusted key $id\" '$W/otherkey.err'"

cp "$W/cluster.cfg" "$W/tr.cfg" && head -c 60 "$W/cluster.cfg.sig" >"$W/tr.cfg.sig"
run trunc "$KILN" verify --key "$W/head.pub" "$W/tr.cfg"
ok "truncated signature: exit 2, not a kiln signature" \
	bash -c "[ $rc = 2 ] && grep -q 'bad signature' '$W/trunc.err'"
cp "$W/cluster.cfg" "$W/g.cfg" && head -c 300 /dev/urandom >"$W/g.cfg.sig"
run garbage "$KILN" verify --key "$W/head.pub" "$W/g.cfg"
ok "garbage signature file: exit 2" test "$rc" = 2
cp "$W/cluster.cfg" "$W/big.cfg" && head -c 100000 /dev/zero | tr '\0' A >"$W/big.cfg.sig"
run big "$KILN" verify --key "$W/head.pub" "$W/big.cfg"
ok "a 100 kB signature file: exit 2 (not read whole)" test "$rc" = 2
: >"$W/e.cfg.sig" && cp "$W/cluster.cfg" "$W/e.cfg"
run empty "$KILN" verify --key "$W/head.pub" "$W/e.cfg"
ok "an empty signature file: exit 2" test "$rc" = 2
# a signature of another file (replayed)
cp "$W/copy.cfg" "$W/r.cfg" && printf '# other\n' >>"$W/r.cfg" && cp "$W/cluster.cfg.sig" "$W/r.cfg.sig"
run replay "$KILN" verify --key "$W/head.pub" "$W/r.cfg"
ok "another file's signature: exit 2" test "$rc" = 2

run nopub "$KILN" verify --key "$W/nope.pub" "$W/cluster.cfg"
ok "verify with a missing public key: exit 2, names it" \
	bash -c "[ $rc = 2 ] && grep -q 'nope.pub' '$W/nopub.err'"
run seckey "$KILN" verify --key "$W/head.key" "$W/cluster.cfg"
ok "verify --key with the secret key file: exit 2 (not a public key)" test "$rc" = 2
run nokeyopt "$KILN" verify "$W/cluster.cfg"
ok "verify without --key: usage error, exit 2" \
	bash -c "[ $rc = 2 ] && grep -q -- '--key' '$W/nokeyopt.err'"
run nofile "$KILN" verify --key "$W/head.pub" "$W/none.cfg"
ok "verify a missing FILE: exit 1" test "$rc" = 1

# ---- check --node-paths: code root runs must be root's alone ---------------------
mkdir -p "$W/node/lib" && chmod 755 "$W/node" "$W/node/lib"
cp "$B/lib/fake-nvml/libnvidia-ml.so.1" "$W/node/lib/" 2>/dev/null || : >"$W/node/lib/libnvidia-ml.so.1"
paths_cfg() { # FILE NVML_LIB [slurm extra line]
	sed -e "s|^health = {|health = { nvml_library = \"$2\";|" \
		-e "s|^slurm = {|slurm = {${3:+ extra = [ \"$3\" ];}|" config/examples/demo.cfg >"$1"
}
paths_cfg "$W/p-good.cfg" "$W/node/lib/libnvidia-ml.so.1"
if [ "$(id -u)" = 0 ] && id nobody >/dev/null 2>&1; then
	run pgood "$KILN" -c "$W/p-good.cfg" check --node-paths
	ok "check --node-paths: a root-owned library in root-only directories: exit 0" test "$rc" = 0
	ok "  ... missing Prolog/Epilog paths (not on this machine) pass with a note" \
		bash -c "grep -q 'health.prolog = .*not on this node' '$W/pgood.err' || ! grep -q prolog '$W/pgood.err'"
	chown nobody "$W/node/lib/libnvidia-ml.so.1"
	run pnobody "$KILN" -c "$W/p-good.cfg" check --node-paths
	ok "a library owned by nobody (the issue's exploit): exit 2" test "$rc" = 2
	ok "  ... names the file, the key, the owner and the fix" \
		bash -c "grep -q 'health.nvml_library = \"$W/node/lib/libnvidia-ml.so.1\": refused' '$W/pnobody.err' &&
			grep -q 'owned by nobody' '$W/pnobody.err' && grep -q 'chown root' '$W/pnobody.err'"
	run pplain "$KILN" -c "$W/p-good.cfg" check
	ok "  ... plain check (on the head) does not look at the node's files: exit 0" test "$rc" = 0
	chown root "$W/node/lib/libnvidia-ml.so.1" && chmod 0777 "$W/node/lib"
	run pww "$KILN" -c "$W/p-good.cfg" check --node-paths
	ok "a world-writable directory above the library: exit 2, names the directory" \
		bash -c "[ $rc = 2 ] && grep -q 'directory $W/node/lib is writable by every user' '$W/pww.err'"
	chmod 0755 "$W/node/lib"
	mkdir -p "$W/node/scripts" && printf '#!/bin/sh\n' >"$W/node/scripts/prolog" && chmod 0775 "$W/node/scripts/prolog"
	paths_cfg "$W/p-extra.cfg" "$W/node/lib/libnvidia-ml.so.1" "Prolog=$W/node/scripts/prolog"
	run pextra "$KILN" -c "$W/p-extra.cfg" check --node-paths
	ok "a group-writable Prolog= in slurm.extra: exit 2, names slurm.extra[0]" \
		bash -c "[ $rc = 2 ] && grep -q 'slurm.extra\[0\] = \"$W/node/scripts/prolog\": refused' '$W/pextra.err'"
	# --root: the node's tree below a directory; its absolute links resolve inside it
	R=$W/root && mkdir -p "$R/usr/lib" "$R/opt" && chmod -R 755 "$R"
	: >"$R/opt/libnvidia-ml.so.1" && chown nobody "$R/opt/libnvidia-ml.so.1"
	ln -s /opt/libnvidia-ml.so.1 "$R/usr/lib/libnvidia-ml.so.1"
	paths_cfg "$W/p-root.cfg" /usr/lib/libnvidia-ml.so.1
	run proot "$KILN" -c "$W/p-root.cfg" check --node-paths --root "$R"
	ok "--root DIR: a link in the node's tree to a file owned by nobody: exit 2" \
		bash -c "[ $rc = 2 ] && grep -q '/opt/libnvidia-ml.so.1 is owned by nobody' '$W/proot.err'"
	chown root "$R/opt/libnvidia-ml.so.1"
	run proot2 "$KILN" -c "$W/p-root.cfg" check --node-paths --root "$R"
	ok "  ... made root's: exit 0" test "$rc" = 0
else
	skip "check --node-paths refusals: need root and the user nobody (chown)"
fi
run prootonly "$KILN" -c "$W/p-good.cfg" check --root /
ok "--root without --node-paths: usage error" test "$rc" = 2
tap_done
