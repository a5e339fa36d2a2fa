# tests/model: the km_ suite (checked against the float64 reference in
# ref.c on the stories260K fixture) and the tokens/s benchmark.
$(eval $(call kiln_test,test-model,tests/model/test-model.c tests/model/ref.c,kmodel kk common,$(KK_LDLIBS)))
$(eval $(call kiln_tool,bench-model,tests/model/bench-model.c tests/model/ref.c,kmodel kk common,$(KK_LDLIBS)))
BENCH_SCRIPTS += tests/model/bench-model.sh
