# kernels/model/: libkmodel.a, the Llama model on kk (kernels/model/include/kmodel.h):
# config and llama2.c reader, paged KV cache, batched forward step, the
# memory estimate (memory.c).
# Programs linking it list "kmodel kk common" and pass $(KK_LDLIBS); those
# calling km_file_* (source.c, model files through libkmf) list
# "kmodel kmf kk common" and pass $(KMF_LDLIBS) $(KK_LDLIBS).
KMODEL_SRCS := kernels/model/config.c kernels/model/kvcache.c kernels/model/model.c \
	kernels/model/source.c kernels/model/memory.c
$(eval $(call kiln_lib,kmodel,$(KMODEL_SRCS)))
