# tests/deb: the Debian packages (mk/deb.mk).  test-deb-meta checks the
# packaging's metadata against `make install` in seconds (make test);
# test-deb runs make deb, installs the packages into an mmdebstrap chroot
# and purges them (minutes, root, the Debian mirror): make test-full.
TEST_SCRIPTS += tests/deb/test-deb-meta.sh
TEST_FULL_SCRIPTS += tests/deb/test-deb.sh
