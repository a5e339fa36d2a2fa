$(eval $(call kiln_test,test-common,tests/common/test-common.c,common,))
# kiln/http.h, json.h, metrics.h (real sockets on 127.0.0.1, tests/lib/http-client.c;
# promtool when installed)
$(eval $(call kiln_test,test-http,tests/common/test-http.c tests/lib/http-client.c,common,$$(KILN_HTTP_LDLIBS)))
$(eval $(call kiln_test,test-json,tests/common/test-json.c,common,-ljansson))
$(eval $(call kiln_test,test-metrics,tests/common/test-metrics.c,common,))
$(eval $(call kiln_test,test-prog,tests/common/test-prog.c,common,))
# one meaning per short letter across the programs; the generated bash completion
TEST_SCRIPTS += tests/common/test-cli-options.sh
# kiln/pathtrust.h on real files (chown to nobody: as root)
$(eval $(call kiln_test,test-pathtrust,tests/common/test-pathtrust.c,common,))
