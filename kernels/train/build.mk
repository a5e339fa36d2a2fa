# kernels/train/: libkmtrain.a, training the Llama model on kk
# (kernels/include/kmtrain.h): the training model with its backward pass and
# AdamW, token shards and the sampler, checkpoints.  The sources sit beside
# the model they train (kernels/model/train*.c, sharing model-internal.h).
# Programs linking it list "kmtrain kmodel kmf kk common" and pass
# $(KMF_LDLIBS) $(KK_LDLIBS).
KMTRAIN_SRCS := kernels/model/train.c kernels/model/train_data.c kernels/model/train_ckpt.c
$(eval $(call kiln_lib,kmtrain,$(KMTRAIN_SRCS)))
