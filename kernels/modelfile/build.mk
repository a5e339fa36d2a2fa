# kernels/modelfile/: libkmf, model and checkpoint files (safetensors, GGUF,
# llama2.c) read with mmap and converted to kk layouts; crash-safe
# safetensors writer.  Programs linking kmf also link kk and pass
# $(KMF_LDLIBS) (jansson) plus $(KK_LDLIBS).
KMF_SRCS := kernels/modelfile/kmf.c kernels/modelfile/safetensors.c kernels/modelfile/gguf.c \
	kernels/modelfile/llama2c.c kernels/modelfile/convert.c kernels/modelfile/writer.c
KMF_LDLIBS := -ljansson
$(eval $(call kiln_lib,kmf,$(KMF_SRCS)))
