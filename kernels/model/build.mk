# kernels/model/: libkmodel.a, the Llama model on kk (kernels/include/kmodel.h):
# config and llama2.c reader, paged KV cache, batched forward step.
# Programs linking it list "kmodel kk common" and pass $(KK_LDLIBS).
KMODEL_SRCS := kernels/model/config.c kernels/model/kvcache.c kernels/model/model.c
$(eval $(call kiln_lib,kmodel,$(KMODEL_SRCS)))
