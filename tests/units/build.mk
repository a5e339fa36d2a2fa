# tests/units: the systemd units and the daemons' ports (issue 31).
# test-unit-security scores every shipped unit with systemd-analyze
# security --offline (seconds); test-daemon-ports plays the port squatter
# (a user binding kiln-inferd's or kiln-healthd's port first) against the
# daemons started by hand and socket-activated (root: setpriv to nobody).
TEST_SCRIPTS += tests/units/test-unit-security.sh tests/units/test-daemon-ports.sh
