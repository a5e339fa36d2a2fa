# kiln — one non-recursive GNU Makefile.
#
# Every folder contributes a build.mk that declares its libraries, programs and
# tests with the helpers in mk/rules.mk (kiln_lib, kiln_bin, kiln_test ...).
# All outputs land under $(B) (default build/): build/bin, build/lib,
# build/tests, build/obj.  `make B=/tmp/x` builds out of tree (parallel work).
#
#   make              everything (CUDA code too whenever nvcc exists; CUDA=0 skips it)
#   make test         every test that needs no GPU; ends with "N passed, N failed, N skipped"
#   make test-full    test + long suites (fuzzers for 60 s, bigger clusters)
#   make test-gpu     the GPU suites (run on a GPU machine)
#   make bench        benchmarks (tables against a named baseline)
#   make gpu-kit      pack the build for a GPU machine without Debian's libraries (docs/gpu-kit.md)
#   make demo         bring up the example cluster and show kiln at work
#   make install DESTDIR= PREFIX=
#   make deb          Debian packages kiln, kiln-node, kiln-cuda in $(B)/deb (docs/install.md)
#   make deps         install every build and test dependency (apt/pip; idempotent)
#   make format lint clean

.DEFAULT_GOAL := all
SHELL := /bin/bash

B        ?= build
PREFIX   ?= /usr/local
# systemd's unit directory: $(PREFIX)/lib/systemd/system by default; the
# Debian package build (debian/rules) sets /lib/systemd/system
UNITDIR  ?= $(PREFIX)/lib/systemd/system
# systemd-sysusers' directory (it reads /usr/local/lib/sysusers.d too); the
# Debian build sets /usr/lib/sysusers.d
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
DESTDIR  ?=
VERSION  := 0.1.0

CC       ?= gcc
ifeq ($(origin CC),default)
CC := gcc
endif
NVCC     ?= /usr/local/cuda/bin/nvcc
CUDA_HOME ?= /usr/local/cuda
CUDA     ?= $(if $(wildcard $(NVCC)),1,0)

OPT      ?= -O2
SAN      ?=
# Every library's public headers (each library's include/ folder); which
# folder may include which is in each folder's README.md and checked by
# `make lint` (mk/check-includes.sh).
KILN_INCLUDES := -Icommon/include -Iconfig/lib/include -Ikernels/kk/include -Ikernels/modelfile/include -Ikernels/tokenizer/include -Ikernels/model/include -Ikernels/train/include -Islurm/store/include -Islurm/adapter/include -Iservices/engine/include -Iservices/healthd/include
# -Wno-missing-field-initializers: table rows name their common fields in
# order and leave the rare ones out (kiln_option's .str/.flag), as systemd's
# build allows.
KILN_CFLAGS := -std=gnu11 $(OPT) -g -Wall -Wextra -Werror -Wno-unused-parameter \
	-Wno-missing-field-initializers -Wshadow -Wformat=2 -Wstrict-prototypes -fPIC -D_GNU_SOURCE \
	-DKILN_VERSION=\"$(VERSION)\" $(SAN) \
	$(KILN_INCLUDES)
KILN_LDFLAGS := $(SAN)

ifeq ($(CUDA),1)
KILN_CFLAGS += -DKILN_HAVE_CUDA=1
endif

# Filled in by the build.mk files.
ALL_LIBS   :=
ALL_BINS   :=
ALL_TESTS  :=
TEST_SCRIPTS :=
TEST_FULL_SCRIPTS :=
TEST_GPU_SCRIPTS :=
BENCH_SCRIPTS :=
INSTALL_BINS :=
EXTRA_ALL  :=

include mk/rules.mk
-include $(sort $(wildcard */build.mk */*/build.mk */*/*/build.mk))
include mk/completion.mk
include mk/deb.mk

all: $(ALL_LIBS) $(ALL_BINS) $(ALL_TESTS) $(EXTRA_ALL)

# T= filters tests by substring: make test T=config
test: all
	@KILN_BUILD=$(B) tests/run-tests.sh --filter "$(T)" $(ALL_TESTS) $(TEST_SCRIPTS)

test-full: all
	@KILN_BUILD=$(B) KILN_TEST_FULL=1 tests/run-tests.sh --filter "$(T)" $(ALL_TESTS) $(TEST_SCRIPTS) $(TEST_FULL_SCRIPTS)

test-gpu: all
	@KILN_BUILD=$(B) KILN_TEST_GPU=1 tests/run-tests.sh --filter "$(T)" $(TEST_GPU_SCRIPTS)

bench: all
	@set -e; for s in $(BENCH_SCRIPTS); do KILN_BUILD=$(B) $$s; done

demo: all
	@KILN_BUILD=$(B) tests/demo.sh

deps:
	@bash mk/deps.sh

# What an install needs built: the programs, their shell completion and the
# runtime modules under $(B)/lib/kiln/ (not the tests: `make deb` builds only
# this).  `make programs` builds just these.
INSTALL_DEPS = $(INSTALL_BINS) $(COMPLETION_STAMP) $(filter $(B)/lib/kiln/%,$(ALL_LIBS))
programs: $(INSTALL_DEPS)

# The units name their programs under /usr/local; installed, their Exec lines
# name $(PREFIX) (/usr in the Debian packages).
install: programs
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/kiln $(DESTDIR)/etc/kiln \
		$(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSUSERSDIR) $(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/man/man8 \
		$(DESTDIR)$(PREFIX)/share/kiln/examples $(DESTDIR)$(PREFIX)/libexec/kiln \
		$(DESTDIR)$(PREFIX)/share/bash-completion/completions
	$(if $(strip $(INSTALL_BINS)),install -m 755 $(INSTALL_BINS) $(DESTDIR)$(PREFIX)/bin/)
	$(if $(filter $(B)/lib/kiln/%,$(ALL_LIBS)),install -m 644 $(filter $(B)/lib/kiln/%,$(ALL_LIBS)) $(DESTDIR)$(PREFIX)/lib/kiln/)
	for u in $(wildcard services/units/*.service services/units/*.socket); do \
		sed '/^Exec/s|/usr/local/|$(PREFIX)/|' $$u >$(DESTDIR)$(UNITDIR)/$${u##*/} && chmod 644 $(DESTDIR)$(UNITDIR)/$${u##*/} || exit 1; \
	done
	install -m 644 services/units/sysusers-kiln.conf $(DESTDIR)$(SYSUSERSDIR)/kiln.conf
	$(if $(wildcard docs/man/*.1),install -m 644 $(wildcard docs/man/*.1) $(DESTDIR)$(PREFIX)/share/man/man1/)
	$(if $(wildcard docs/man/*.8),install -m 644 $(wildcard docs/man/*.8) $(DESTDIR)$(PREFIX)/share/man/man8/)
	$(if $(wildcard slurm/scripts/*),install -m 755 $(wildcard slurm/scripts/*) $(DESTDIR)$(PREFIX)/libexec/kiln/)
	install -m 644 config/examples/*.cfg $(DESTDIR)$(PREFIX)/share/kiln/examples/
	$(if $(wildcard $(COMPLETION_DIR)/*),install -m 644 $(wildcard $(COMPLETION_DIR)/*) $(DESTDIR)$(PREFIX)/share/bash-completion/completions/)

# The cluster file's default Slurm Prolog/Epilog/HealthCheckProgram
# (config/lib/schema.c) are where this install puts the scripts; a build with
# another PREFIX rebuilds schema.o (the stamp changes only with the path).
KILN_LIBEXECDIR := $(PREFIX)/libexec/kiln
$(B)/obj/config/lib/schema.o: EXTRA_CFLAGS += -DKILN_LIBEXECDIR=\"$(KILN_LIBEXECDIR)\"
$(B)/obj/config/lib/schema.o: $(B)/.libexecdir
$(B)/.libexecdir: FORCE
	@mkdir -p $(@D); [ "$$(cat $@ 2>/dev/null)" = "$(KILN_LIBEXECDIR)" ] || echo "$(KILN_LIBEXECDIR)" >$@
FORCE:

FORMAT_SRCS = $(shell git ls-files '*.c' '*.h' '*.cu' 2>/dev/null)
format:
	clang-format -i $(FORMAT_SRCS)

# The layering: no #include crosses a folder's README.md "May include:" line.
print-includes:
	@echo $(KILN_INCLUDES)

lint:
	python3 mk/check-includes.py $(KILN_INCLUDES)
	cppcheck --quiet --error-exitcode=1 --enable=warning,portability --inline-suppr \
		--suppress=missingIncludeSystem --std=c11 -D_GNU_SOURCE \
		$(KILN_INCLUDES) \
		$(filter %.c,$(FORMAT_SRCS))

clean:
	rm -rf $(B)

.PHONY: all test test-full test-gpu bench demo deps install programs format lint print-includes clean FORCE
