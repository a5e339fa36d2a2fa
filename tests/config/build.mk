# tests/config/: libkiln-config unit tests (cmocka) and the `kiln` CLI suite
# (bad files with exact expected errors, golden renders, dnsmasq --test).
$(eval $(call kiln_test,test-config,tests/config/test-config.c,config common,-lconfig))
# kiln/sign.h: keys, signatures and every way one is wrong
$(eval $(call kiln_test,test-sign,tests/config/test-sign.c,config common,-lsodium))
TEST_SCRIPTS += tests/config/test-kiln-cli.sh
# kiln keygen, sign, verify and check --node-paths
TEST_SCRIPTS += tests/config/test-kiln-sign.sh
TEST_SCRIPTS += tests/config/test-accounting.sh
