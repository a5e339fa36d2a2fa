# Debian packages: `make deb` -> $(B)/deb/{kiln,kiln-node,kiln-cuda}_V_ARCH.deb
#
# Builds with dpkg-buildpackage (debian/, debhelper) from a clean copy of the
# source tree (git's tracked and untracked-not-ignored files) in
# $(B)/deb/src, so nothing lands in the worktree or beside it and no stale
# object of $(B) gets in.  Then lintian checks the result (fails on errors
# and warnings; each accepted tag is in a lintian-overrides file with its
# reason).  docs/install.md says how to install them.
#
# Version: $(VERSION) when HEAD is tagged v$(VERSION), else
# $(VERSION)+git<commits>.<sha>, so every commit's packages upgrade the last.
# kiln-cuda is built only when the tree has the CUDA module
# ($(B)/lib/kiln/kk-cuda.so) and nvcc exists; otherwise the pkg.kiln.nocuda
# profile builds CPU-only programs (no CUDA library linked) and no kiln-cuda.
#
#   make deb                 the packages: a rebuild of the programs only (no
#                            tests), ~30 s on 2 idle cores, ~75 s on busy ones;
#                            a CUDA build (kiln-cuda) adds nvcc's minutes
#   make deb-check           the fast metadata check (tests/deb/test-deb-meta.sh)
#   make test-deb            build, install into an mmdebstrap chroot, purge
#                            (tests/deb/test-deb.sh; in make test-full)

DEB_DIR := $(B)/deb
DEB_GIT_COUNT := $(shell git rev-list --count HEAD 2>/dev/null)
DEB_GIT_SHA := $(shell git rev-parse --short=8 HEAD 2>/dev/null)
DEB_TAGGED := $(shell git tag --points-at HEAD 2>/dev/null | grep -qx 'v$(VERSION)' && echo 1)
DEB_VERSION ?= $(VERSION)$(if $(DEB_TAGGED),,$(if $(DEB_GIT_SHA),+git$(DEB_GIT_COUNT).$(DEB_GIT_SHA)))
DEB_CUDA_MODULE := $(filter $(B)/lib/kiln/kk-cuda.so,$(ALL_LIBS))
DEB_PROFILES ?= $(if $(and $(DEB_CUDA_MODULE),$(filter 1,$(CUDA))),,pkg.kiln.nocuda)
DEB_JOBS ?= 2

deb:
	@for t in dpkg-buildpackage dh lintian; do command -v $$t >/dev/null || \
		{ echo "make deb: $$t is not installed; run 'make deps' (debhelper, devscripts, lintian)" >&2; exit 1; }; done
	rm -rf $(DEB_DIR)
	mkdir -p $(DEB_DIR)/src/kiln
	if git rev-parse --git-dir >/dev/null 2>&1; then \
		git ls-files -z -co --exclude-standard | tar --null --ignore-failed-read -T - -cf - 2>/dev/null; \
	else \
		tar --exclude=./$(B) --exclude=./.git -cf - .; \
	fi | tar -xf - -C $(DEB_DIR)/src/kiln
	mk/deb-changelog.sh $(DEB_DIR)/src/kiln/debian/changelog "$(DEB_VERSION)" "$(DEB_GIT_SHA)"
	cd $(DEB_DIR)/src/kiln && DEB_BUILD_PROFILES="$(DEB_PROFILES)" \
		dpkg-buildpackage -us -uc -j$(DEB_JOBS) $(if $(DEB_PROFILES),-P$(DEB_PROFILES)) >../build.log 2>&1 || \
		{ tail -40 ../build.log; echo "make deb: dpkg-buildpackage failed; the whole log is $(DEB_DIR)/src/build.log" >&2; exit 1; }
	mv $(DEB_DIR)/src/*.deb $(DEB_DIR)/src/*.changes $(DEB_DIR)/src/*.buildinfo $(DEB_DIR)/src/*.dsc \
		$(DEB_DIR)/src/*.tar.* $(DEB_DIR)/
	rm -rf $(DEB_DIR)/src/kiln
	lintian --fail-on error,warning --display-info $(DEB_DIR)/*.changes 2>&1 | tee $(DEB_DIR)/lintian.log; \
		exit $${PIPESTATUS[0]}
	@ls -l $(DEB_DIR)/*.deb

deb-check:
	@KILN_BUILD=$(B) tests/run-tests.sh tests/deb/test-deb-meta.sh

test-deb:
	@KILN_BUILD=$(B) KILN_TEST_FULL=1 tests/run-tests.sh tests/deb/test-deb.sh

.PHONY: deb deb-check test-deb
