# kernels/tokenizer/: libktok, tokenizers (GGUF metadata, HF tokenizer.json,
# llama2.c tokenizer.bin), BPE encode/decode, streaming decode, chat
# templates.  Programs linking ktok also link kmf kk common and pass
# $(KTOK_LDLIBS) plus $(KK_LDLIBS).
KTOK_SRCS := kernels/tokenizer/ktok.c kernels/tokenizer/pretok.c kernels/tokenizer/unicode.c \
	kernels/tokenizer/load.c kernels/tokenizer/chat.c
KTOK_LDLIBS := $(KMF_LDLIBS)
$(eval $(call kiln_lib,ktok,$(KTOK_SRCS)))
