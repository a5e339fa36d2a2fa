# Build helpers shared by every build.mk.
#
#   $(eval $(call kiln_lib,NAME,SRCS))                    -> $(B)/lib/libNAME.a
#   $(eval $(call kiln_bin,NAME,SRCS,KILNLIBS,LDLIBS))    -> $(B)/bin/NAME (installed)
#   $(eval $(call kiln_test,NAME,SRCS,KILNLIBS,LDLIBS))   -> $(B)/tests/NAME (run by make test)
#   $(eval $(call kiln_tool,NAME,SRCS,KILNLIBS,LDLIBS))   -> $(B)/tests/NAME (helper, not run)
#   $(eval $(call kiln_shlib,PATH,SRCS,KILNLIBS,LDLIBS))  -> $(B)/PATH (a shared object)
#
# KILNLIBS are short names (common, config, kk ...) of libraries made by
# kiln_lib, most dependent first.  SRCS may mix .c and .cu (CUDA, only when
# CUDA=1).  Per-object flags: `$(B)/obj/dir/file.o: EXTRA_CFLAGS += -DX`.
# Test binaries are expected to print TAP (cmocka does with
# CMOCKA_MESSAGE_OUTPUT=TAP, which tests/run-tests.sh sets).

NVCC_FLAGS ?= -O3 -std=c++17 -Xcompiler -fPIC -Xcompiler -Wall \
	-gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
	-Icommon/include -Ikernels/kk/include
CUDA_LDLIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart

kiln_objs = $(patsubst %.c,$(B)/obj/%.o,$(patsubst %.cu,$(B)/obj/%.cu.o,$(1)))
kiln_libfiles = $(foreach l,$(1),$(B)/lib/lib$(l).a)

$(B)/obj/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(KILN_CFLAGS) $(EXTRA_CFLAGS) -MMD -MP -c $< -o $@

$(B)/obj/%.cu.o: %.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVCC_FLAGS) -DKILN_VERSION=\"$(VERSION)\" $(EXTRA_NVFLAGS) -MMD -MP -c $< -o $@

define kiln_lib
$(B)/lib/lib$(1).a: $(call kiln_objs,$(2))
	@mkdir -p $$(@D)
	rm -f $$@ && $$(AR) rcs $$@ $$^
ALL_LIBS += $(B)/lib/lib$(1).a
-include $(patsubst %.o,%.d,$(call kiln_objs,$(2)))
endef

define kiln_link
$(3): $(call kiln_objs,$(1)) $(call kiln_libfiles,$(2))
	@mkdir -p $$(@D)
	$$(CC) $$(KILN_LDFLAGS) -o $$@ $(call kiln_objs,$(1)) $(call kiln_libfiles,$(2)) $(4) -lm -lpthread
-include $(patsubst %.o,%.d,$(call kiln_objs,$(1)))
endef

define kiln_bin
$(call kiln_link,$(2),$(3),$(B)/bin/$(1),$(4))
ALL_BINS += $(B)/bin/$(1)
INSTALL_BINS += $(B)/bin/$(1)
endef

define kiln_test
$(call kiln_link,$(2),$(3),$(B)/tests/$(1),$(4) -lcmocka)
ALL_TESTS += $(B)/tests/$(1)
endef

define kiln_tool
$(call kiln_link,$(2),$(3),$(B)/tests/$(1),$(4))
ALL_BINS += $(B)/tests/$(1)
endef

define kiln_shlib
$(B)/$(1): $(call kiln_objs,$(2)) $(call kiln_libfiles,$(3))
	@mkdir -p $$(@D)
	$$(CC) $$(KILN_LDFLAGS) -shared -o $$@ $(call kiln_objs,$(2)) $(call kiln_libfiles,$(3)) $(4)
ALL_LIBS += $(B)/$(1)
-include $(patsubst %.o,%.d,$(call kiln_objs,$(2)))
endef

# libFuzzer targets (clang only): every object is built from source in the
# one command, because the sanitizers and coverage need all of it
# instrumented (kiln_lib's gcc objects cannot be reused).  Part of `all` when
# clang exists; `make NAME` builds one (and says so when clang is missing);
# their suites (make test-full) SKIP when the target was not built.
#   $(eval $(call kiln_fuzz,NAME,SRCS,CFLAGS,LDLIBS,HEADERS))  -> $(B)/tests/NAME
# CFLAGS are the -I and extra flags (KILN_FUZZ_STRICT: stop at the first
# UBSan report), HEADERS what the target depends on beyond SRCS.
ifeq ($(origin KILN_CLANG),undefined)
KILN_CLANG := $(shell command -v clang-14 || command -v clang)
endif
KILN_FUZZ_CFLAGS := -g -O1 -std=gnu11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined
KILN_FUZZ_STRICT := -fno-sanitize-recover=undefined

define kiln_fuzz
$(B)/tests/$(1): $(2) $(5)
	@mkdir -p $$(@D)
	@if [ -z "$$(KILN_CLANG)" ]; then echo "$(1): clang not found, skipping" >&2; exit 1; fi
	$$(KILN_CLANG) $$(KILN_FUZZ_CFLAGS) $(3) $(2) $(4) -o $$@
ifneq ($$(KILN_CLANG),)
EXTRA_ALL += $(B)/tests/$(1)
endif
$(1): $(B)/tests/$(1)
.PHONY: $(1)
endef
