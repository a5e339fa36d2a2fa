# tests/peer: kiln against llama.cpp (llama-cpp-python) on the same GGUF
# files, in the same run (make bench; tests/peer/bench-peer.sh).
$(eval $(call kiln_tool,peer-kiln,tests/peer/peer-kiln.c,kmodel kmf kk common,$(KMF_LDLIBS) $(KK_LDLIBS)))
BENCH_SCRIPTS += tests/peer/bench-peer.sh
