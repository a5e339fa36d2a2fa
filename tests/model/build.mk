# tests/model: the km_ suite (checked against the float64 reference in
# ref.c on the tiny260K fixture (tests/fixtures)) and the tokens/s benchmark.
$(eval $(call kiln_test,test-model,tests/model/test-model.c tests/model/ref.c,kmodel kmf kk common,$(KMF_LDLIBS) $(KK_LDLIBS)))
$(eval $(call kiln_tool,bench-model,tests/model/bench-model.c tests/model/ref.c,kmodel kmf kk common,$(KMF_LDLIBS) $(KK_LDLIBS)))
BENCH_SCRIPTS += tests/model/bench-model.sh
# The same model on the cuda backend: every test skips with the reason
# where cuda is not built in or no GPU is usable.
$(eval $(call kiln_test,test-model-cuda,tests/gpu/test-model-cuda.c tests/model/ref.c,kmodel kmf kk common,$(KMF_LDLIBS) $(KK_LDLIBS)))
# km_file: the tiny260K fixture rewritten as kiln/HF safetensors and GGUF (F32, F16,
# Q8_0) against the llama2.c path, a kmt_save checkpoint, refused files; scaled RoPE
# files (Llama 3.1, linear) of a random model against the float64 reference (ref.c).
$(eval $(call kiln_test,test-model-files,tests/model/test-model-files.c tests/model/ref.c,kmtrain kmodel kmf kk common,$(KMF_LDLIBS) $(KK_LDLIBS)))
