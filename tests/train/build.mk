# tests/train: the kmt_ suites — the training model against the float64
# reference in ref-train.c (gradient check, fixture loss, AdamW, data
# parallel over forked ranks), token shards and the sampler, checkpoints —
# and the training benchmark.
KMTRAIN_LIBS := kmtrain kmodel kmf kk common
$(eval $(call kiln_test,test-train,tests/train/test-train.c tests/train/ref-train.c,$(KMTRAIN_LIBS),$(KMF_LDLIBS) $(KK_LDLIBS)))
$(eval $(call kiln_test,test-train-data,tests/train/test-train-data.c,$(KMTRAIN_LIBS),$(KMF_LDLIBS) $(KK_LDLIBS)))
$(eval $(call kiln_test,test-train-ckpt,tests/train/test-train-ckpt.c,$(KMTRAIN_LIBS),$(KMF_LDLIBS) $(KK_LDLIBS)))
$(eval $(call kiln_tool,bench-train,tests/train/bench-train.c,$(KMTRAIN_LIBS),$(KMF_LDLIBS) $(KK_LDLIBS)))
BENCH_SCRIPTS += tests/train/bench-train.sh
TEST_SCRIPTS += tests/train/test-kiln-train.sh
# The same model on the cuda backend against cpu: every test skips with the
# reason where cuda is not built in or no GPU is usable.
$(eval $(call kiln_test,test-train-cuda,tests/gpu/test-train-cuda.c,$(KMTRAIN_LIBS),$(KMF_LDLIBS) $(KK_LDLIBS)))
$(eval $(call kiln_tool,test-train-cuda-self,tests/gpu/test-train-cuda-self.c,$(KMTRAIN_LIBS),$(KMF_LDLIBS) $(KK_LDLIBS) -lcmocka))
