# tests/fuzz/: every libFuzzer target of kiln, its seed corpus and its
# suite (make test-full runs each for KILN_FUZZ_SECONDS, default 60; make
# NAME builds one).  mk/rules.mk's kiln_fuzz compiles each target's sources
# in one clang command with the sanitizers (the gcc objects of the libraries
# cannot be reused).  This file comes after the libraries' build.mk files
# (the Makefile includes them in sorted order), so their *_SRCS are set.

# libFuzzer target for the JSON glue (tests/fuzz/fuzz-json.c), by
# mk/rules.mk's kiln_fuzz; its suite runs in make test-full.
$(eval $(call kiln_fuzz,fuzz-json,tests/fuzz/fuzz-json.c common/json.c common/error.c common/parse.c,$(KILN_FUZZ_STRICT) -Icommon/include,-ljansson,common/include/kiln/json.h common/include/kiln/error.h common/include/kiln/macro.h common/include/kiln/parse.h))
TEST_FULL_SCRIPTS += tests/fuzz/fuzz-json.sh

# libFuzzer target for parse + validate + render (tests/fuzz/fuzz-config.c),
# by mk/rules.mk's kiln_fuzz; its suite runs in make test-full.
FUZZ_CONFIG_SRCS := tests/fuzz/fuzz-config.c $(CONFIG_SRCS) common/parse.c common/strbuf.c common/hostlist.c common/log.c common/error.c
$(eval $(call kiln_fuzz,fuzz-config,$(FUZZ_CONFIG_SRCS),$(KILN_FUZZ_STRICT) -Icommon/include -Iconfig/lib/include,-lconfig -lsodium,config/lib/include/kiln/config.h config/lib/config-internal.h $(wildcard common/include/kiln/*.h)))
TEST_FULL_SCRIPTS += tests/fuzz/fuzz-config.sh

# libFuzzer targets (mk/rules.mk's kiln_fuzz): the protocol parser alone,
# and the whole server (request handling, waiters, limits) over loopback
# sockets; `make fuzz-store` builds both.
KILN_STORE_FUZZ_CFLAGS := -Icommon/include -Islurm/store/include -Islurm/store
$(eval $(call kiln_fuzz,fuzz-store,tests/fuzz/fuzz-store.c slurm/store/store-proto.c,$(KILN_STORE_FUZZ_CFLAGS),,slurm/store/store-proto.h))
$(eval $(call kiln_fuzz,fuzz-store-server,tests/fuzz/fuzz-store-server.c $(KILN_STORE_SRCS) common/log.c common/parse.c common/net.c,$(KILN_STORE_FUZZ_CFLAGS),-lpthread,slurm/store/store-proto.h slurm/store/store-map.h slurm/store/include/kiln/store.h))
fuzz-store: fuzz-store-server
TEST_FULL_SCRIPTS += tests/fuzz/fuzz-store.sh

# libFuzzer target for the request layer (tests/fuzz/fuzz-openai.c), by
# mk/rules.mk's kiln_fuzz; its suite runs in make test-full.
FUZZ_OPENAI_SRCS := tests/fuzz/fuzz-openai.c services/inferd/openai.c common/json.c common/parse.c \
	common/strbuf.c common/error.c $(KTOK_SRCS) $(KMF_SRCS) kernels/kk/kk_dtype.c
$(eval $(call kiln_fuzz,fuzz-openai,$(FUZZ_OPENAI_SRCS),$(KILN_FUZZ_STRICT) -Icommon/include -Ikernels/kk/include -Ikernels/modelfile/include -Ikernels/tokenizer/include -Ikernels/model/include -Iservices/engine/include,$(KMF_LDLIBS) -lm,services/inferd/inferd.h kernels/tokenizer/include/ktok.h $(wildcard common/include/kiln/*.h)))
TEST_FULL_SCRIPTS += tests/fuzz/fuzz-openai.sh

# libFuzzer target for the readers (mk/rules.mk's kiln_fuzz); its suite
# runs in make test-full.
FUZZ_KMF_SRCS := tests/fuzz/fuzz-modelfile.c $(KMF_SRCS) kernels/kk/kk_dtype.c common/error.c common/strbuf.c
$(eval $(call kiln_fuzz,fuzz-modelfile,$(FUZZ_KMF_SRCS),$(KILN_FUZZ_STRICT) -Icommon/include -Ikernels/kk/include -Ikernels/modelfile/include,$(KMF_LDLIBS) -lm,kernels/modelfile/include/kmf.h kernels/modelfile/kmf_internal.h $(wildcard common/include/kiln/*.h)))
TEST_FULL_SCRIPTS += tests/fuzz/fuzz-modelfile.sh

# libFuzzer target for the loaders + encoder (mk/rules.mk's kiln_fuzz); its
# suite runs in make test-full.
FUZZ_KTOK_SRCS := tests/fuzz/fuzz-tokenizer.c $(KTOK_SRCS) $(KMF_SRCS) kernels/kk/kk_dtype.c \
	common/strbuf.c common/error.c
$(eval $(call kiln_fuzz,fuzz-tokenizer,$(FUZZ_KTOK_SRCS),$(KILN_FUZZ_STRICT) -Icommon/include -Ikernels/kk/include -Ikernels/modelfile/include -Ikernels/tokenizer/include,$(KMF_LDLIBS) -lm,kernels/tokenizer/include/ktok.h kernels/modelfile/include/kmf.h kernels/tokenizer/ktok_internal.h $(wildcard common/include/kiln/*.h)))
TEST_FULL_SCRIPTS += tests/fuzz/fuzz-tokenizer.sh

# libFuzzer target for the signature and key parsers and verify
# (tests/fuzz/fuzz-sign.c): kiln-node-init verifies a signature fetched over
# plain HTTP; its suite runs in make test-full.
$(eval $(call kiln_fuzz,fuzz-sign,tests/fuzz/fuzz-sign.c config/lib/sign.c common/strbuf.c common/error.c,$(KILN_FUZZ_STRICT) -Icommon/include -Iconfig/lib/include,-lsodium,config/lib/include/kiln/sign.h common/include/kiln/strbuf.h common/include/kiln/macro.h common/include/kiln/error.h))
TEST_FULL_SCRIPTS += tests/fuzz/fuzz-sign.sh
# libFuzzer target for kiln serve's request parsing (paths, Range, URLs:
# config/cli/serve-request.c), by mk/rules.mk's kiln_fuzz; its suite runs in
# make test-full.
$(eval $(call kiln_fuzz,fuzz-serve,tests/fuzz/fuzz-serve.c config/cli/serve-request.c,$(KILN_FUZZ_STRICT) -Icommon/include -Iconfig/cli,,config/cli/serve.h common/include/kiln/macro.h))
TEST_FULL_SCRIPTS += tests/fuzz/fuzz-serve.sh
