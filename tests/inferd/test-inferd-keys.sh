#!/bin/bash
# test-inferd-keys.sh — kiln-inferd's API keys (the tiny260K fixture, curl, jq):
#   --api-keys-file / inference.api_keys_file: no Authorization header and a
#   wrong key get 401 in OpenAI's shape (invalid_request_error,
#   invalid_api_key) without echoing the key; every key of the file works
#   ("Bearer" in any case); /health is always open, /metrics unless
#   --metrics-auth / inference.metrics_auth; a file every user may read,
#   one its group or every user may write, and one owned by another user
#   are refused at start (exit 2, naming the fix); one without a key and a
#   key with a space too (exit 1).
# Prints TAP.
set -u
. "$(dirname "$0")/../lib/tap.sh"
. "$(dirname "$0")/inferd-env.sh"
inferd_suite keys curl jq
MODEL=$(readlink -f "$MODEL")

start() { inferd_start "$@"; }
stop() { inferd_stop; }
# req PATH [CURL-ARGS...]: the HTTP status; the body in $W/body
req() { local p=$1; shift; curl -s -o "$W/body" -w '%{http_code}' "$@" "$URL$p"; }
BODY='{"model":"m","prompt":[1],"max_tokens":3}'
# code_is N: the last req's status was N; else the status, body and log as comments.
code_is() { [ "$code" = "$1" ] || { echo "# status $code, body:"; sed 's/^/#   /' "$W/body" "$W/log"; false; }; }
is401() { jq -e '.error.type == "invalid_request_error" and .error.code == "invalid_api_key" and .error.param == null' "$W/body" >/dev/null; }

printf '# kiln-inferd keys\n\n  sk-first-key  \nsk-second-key\n# sk-commented-out\n' >"$W/keys"
chmod 600 "$W/keys"
ok "--api-keys-file: the server starts" start -m "$MODEL" --name m --api-keys-file "$W/keys"
ok "  ... logging how many keys" grep -q "API keys: 2 from $W/keys" "$W/log"
code=$(req /v1/completions -d "$BODY")
ok "no Authorization header: 401" test "$code" = 401
ok "  ... in OpenAI's shape (invalid_request_error, invalid_api_key)" is401
ok "  ... saying how to send one" jq -e '.error.message | test("Authorization: Bearer KEY")' "$W/body"
code=$(req /v1/completions -d "$BODY" -H "Authorization: Bearer sk-wrong-key")
ok "a wrong key: 401" test "$code" = 401
ok "  ... in OpenAI's shape, not echoing the key" bash -c "jq -e '.error.code == \"invalid_api_key\"' '$W/body' >/dev/null && ! grep -q sk-wrong-key '$W/body'"
code=$(req /v1/completions -d "$BODY" -H "Authorization: Bearer sk-first-key2")
ok "a right key with a byte more: 401" test "$code" = 401
code=$(req /v1/completions -d "$BODY" -H "Authorization: Bearer sk-first-ke")
ok "a right key with a byte less: 401" test "$code" = 401
code=$(req /v1/completions -d "$BODY" -H "Authorization: Basic c2stZmlyc3Qta2V5")
ok "another scheme (Basic): 401" test "$code" = 401
code=$(req /v1/completions -d "$BODY" -H "Authorization: Bearer sk-commented-out")
ok "a commented-out key: 401" test "$code" = 401
code=$(req /v1/completions -d "$BODY" -H "Authorization: Bearer sk-first-key")
ok "the first key (spaces around it in the file): 200" bash -c "[ $code = 200 ] && jq -e '.choices[0].token_ids | length == 3' '$W/body' >/dev/null"
code=$(req /v1/completions -d "$BODY" -H "Authorization: bearer sk-second-key")
ok "the second key, 'bearer' in lower case: 200" test "$code" = 200
code=$(req /v1/chat/completions -d '{"model":"m","messages":[{"role":"user","content":"hi"}]}')
ok "chat without a key: 401" test "$code" = 401
code=$(req /v1/models)
ok "/v1/models without a key: 401" test "$code" = 401
code=$(req /v1/models -H "Authorization: Bearer sk-second-key")
ok "/v1/models with a key: 200" test "$code" = 200
code=$(req /v1/models/m)
ok "/v1/models/m without a key: 401" test "$code" = 401
code=$(req /health)
ok "/health is open" test "$code" = 200
code=$(req /metrics)
ok "/metrics is open by default" test "$code" = 200
stop
ok "--metrics-auth: the server starts" start -m "$MODEL" --name m --api-keys-file "$W/keys" --metrics-auth
code=$(req /metrics)
ok "  ... /metrics without a key: 401" bash -c "[ $code = 401 ] && jq -e '.error.code == \"invalid_api_key\"' '$W/body' >/dev/null"
code=$(req /metrics -H "Authorization: Bearer sk-first-key")
ok "  ... with a key: 200" test "$code" = 200
code=$(req /health)
ok "  ... /health still open" test "$code" = 200
stop
ok "without --api-keys-file no key is needed" start -m "$MODEL" --name m
code=$(req /v1/completions -d "$BODY")
ok "  ... a request without a header: 200" code_is 200
stop

# ---- refused at start (under timeout: a server that accepted the file
# would serve until killed)
chmod 644 "$W/keys"
ok "a keys file every user may read: exit 2" rc_is 2 timeout 10 "$BIN" -m "$MODEL" --api-keys-file "$W/keys"
ok "  ... saying so and what to do" grep -q "$W/keys is readable by every user (mode 0644), and the keys are secrets that decide who gets in: chown root: $W/keys; chmod 600 $W/keys" "$W/err"
chmod 620 "$W/keys"
ok "a keys file its group may write: exit 2" rc_is 2 timeout 10 "$BIN" -m "$MODEL" --api-keys-file "$W/keys"
ok "  ... saying so and what to do" grep -q "$W/keys is writable by its group (mode 0620).*chmod 600 $W/keys" "$W/err"
chmod 602 "$W/keys"
ok "a keys file every user may write: exit 2" rc_is 2 timeout 10 "$BIN" -m "$MODEL" --api-keys-file "$W/keys"
ok "  ... saying so" grep -q "$W/keys is writable by every user (mode 0602)" "$W/err"
chmod 640 "$W/keys"
cp "$W/keys" "$W/foreign"; chmod 600 "$W/foreign"
if [ "$(id -u)" = 0 ] && chown nobody "$W/foreign" 2>/dev/null; then
	ok "a keys file owned by another user (nobody): exit 2" rc_is 2 timeout 10 "$BIN" -m "$MODEL" --api-keys-file "$W/foreign"
	ok "  ... naming the owner and what to do" grep -q "$W/foreign is owned by nobody (uid $(id -u nobody)), not by root or root (the user kiln-inferd runs as), so that user could change the keys: chown root: $W/foreign; chmod 600 $W/foreign" "$W/err"
else
	skip "a keys file owned by another user: needs root (chown nobody)"
	skip "  ... naming the owner"
fi
printf '# nothing\n\n' >"$W/empty"; chmod 600 "$W/empty"
ok "a keys file without a key: exit 1" rc_is 1 "$BIN" -m "$MODEL" --api-keys-file "$W/empty"
ok "  ... saying so" grep -q "holds no key" "$W/err"
printf 'sk-a sk-b\n' >"$W/spaced"; chmod 600 "$W/spaced"
ok "two keys on a line: exit 1, naming the line" bash -c "rc=0; '$BIN' -m '$MODEL' --api-keys-file '$W/spaced' 2>'$W/err' || rc=\$?; [ \$rc = 1 ] && grep -q '$W/spaced:1: a key with a space' '$W/err'"
ok "a missing keys file: exit 1" rc_is 1 "$BIN" -m "$MODEL" --api-keys-file "$W/nope"

# ---- from the cluster file
cat >"$W/c.cfg" <<EOF
cluster = { name = "demo"; };
network = { subnet = "10.77.0.0/24"; };
head = { hostname = "head"; address = "10.77.0.1"; };
node_groups = ( { name = "cpu"; hosts = "node01"; addresses = [ "10.77.0.11" ]; macs = [ "52:54:00:77:00:11" ]; } );
inference = { enabled = true; model = "$MODEL"; name = "m"; api_keys_file = "$W/keys"; metrics_auth = true; };
EOF
ok "kiln check accepts the file (the keys file exists: no warning about it)" bash -c "'$B/bin/kiln' check -c '$W/c.cfg' 2>'$W/err' && ! grep -q 'api_keys_file: warning' '$W/err'"
sed "s|api_keys_file = \"$W/keys\"|api_keys_file = \"$W/nokeys\"|" "$W/c.cfg" >"$W/nokeys.cfg"
ok "a keys file missing on this host: a kiln check warning naming the key" bash -c "'$B/bin/kiln' check -c '$W/nokeys.cfg' 2>'$W/err' && grep -q 'inference.api_keys_file: warning: $W/nokeys does not exist' '$W/err'"
ok "inference.api_keys_file and metrics_auth from the cluster file" start -c "$W/c.cfg" --node node01
code=$(req /v1/completions -d "$BODY")
ok "  ... no key: 401" test "$code" = 401
code=$(req /metrics)
ok "  ... /metrics without a key: 401" test "$code" = 401
code=$(req /v1/completions -d "$BODY" -H "Authorization: Bearer sk-second-key")
ok "  ... a key: 200" test "$code" = 200
stop
tap_done
