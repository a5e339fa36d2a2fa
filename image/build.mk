# image/: kiln's stateless node image (docs/image.md).
#
#   make image [CLUSTER=config/examples/demo.cfg] [IMAGE_FROM=deb|install]
#                                                   -> $(B)/image/{vmlinuz,initrd.img,boot.ipxe,cluster.cfg}
#   make image-deps                                 the Debian packages image building and its boot test need
#   make test-image                                 build the test images (plain and GPU) and PXE-boot them in qemu (also in make test-full)
#
# The image build needs root (mmdebstrap) and network access to the
# cluster file's Debian mirror; nothing here runs in the default make test.

CLUSTER ?= config/examples/demo.cfg
IMAGE_OUT ?= $(B)/image

# kiln-node-init is part of every kiln install (the unit is in services/units/).
install: install-node-init
install-node-init:
	install -D -m 755 image/kiln-node-init $(DESTDIR)$(PREFIX)/sbin/kiln-node-init

# IMAGE_FROM=deb (the default): kiln goes in from its Debian packages
# (make deb, docs/install.md); IMAGE_FROM=install: from a make install tree.
IMAGE_FROM ?= deb
image: all
ifeq ($(IMAGE_FROM),deb)
	$(MAKE) --no-print-directory deb B=$(B) >/dev/null
	KILN=$(abspath $(B)/bin/kiln) image/build-image.sh $(CLUSTER) $(IMAGE_OUT) $(abspath $(B)/deb)
else
	rm -rf $(B)/image-staging
	$(MAKE) --no-print-directory install B=$(B) DESTDIR=$(abspath $(B)/image-staging) PREFIX=/usr/local >/dev/null
	KILN=$(abspath $(B)/bin/kiln) image/build-image.sh $(CLUSTER) $(IMAGE_OUT) $(abspath $(B)/image-staging)
endif

image-deps:
	@bash image/deps.sh

test-image: all
	@# the GPU image's build alone (DKMS) takes ~13 min here: more than the 900 s default per suite
	@KILN_BUILD=$(B) KILN_TEST_FULL=1 KILN_SUITE_TIMEOUT=$${KILN_SUITE_TIMEOUT:-2400} \
		tests/run-tests.sh tests/image/test-image-boot.sh tests/image/test-image-gpu.sh

.PHONY: image image-deps test-image install-node-init
