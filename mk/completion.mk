# Shell completion for every program in $(B)/bin, generated from the
# programs' own option tables (`PROG --dump-options`, kiln/prog.h) by
# mk/gen-completion.sh: $(B)/share/bash-completion/completions/PROG.
# Part of `all`; `make install` puts it in
# $(PREFIX)/share/bash-completion/completions, where bash-completion finds it.
# Included after every build.mk, so ALL_BINS is complete here.
COMPLETION_DIR := $(B)/share/bash-completion/completions
COMPLETION_STAMP := $(B)/share/.completion-stamp
COMPLETION_PROGS = $(filter $(B)/bin/%,$(ALL_BINS))

$(COMPLETION_STAMP): mk/gen-completion.sh $(COMPLETION_PROGS)
	mk/gen-completion.sh $(B)/share $(COMPLETION_PROGS)
	@touch $@

EXTRA_ALL += $(COMPLETION_STAMP)
completion: $(COMPLETION_STAMP)
.PHONY: completion
