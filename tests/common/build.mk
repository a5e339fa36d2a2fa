$(eval $(call kiln_test,test-common,tests/common/test-common.c,common,))
