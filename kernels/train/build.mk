# kernels/train/: libkmtrain.a, training the Llama model on kk
# (kernels/train/include/kmtrain.h): the training model with its backward pass and
# AdamW, token shards and the sampler, checkpoints.  The backward pass reads
# the forward's layout, so train-internal.h includes kernels/model's
# model-internal.h (the one internal header that crosses a folder).
# Programs linking it list "kmtrain kmodel kmf kk common" and pass
# $(KMF_LDLIBS) $(KK_LDLIBS).
KMTRAIN_SRCS := kernels/train/train.c kernels/train/train_data.c kernels/train/train_ckpt.c \
	kernels/train/train_spec.c
$(eval $(call kiln_lib,kmtrain,$(KMTRAIN_SRCS)))
