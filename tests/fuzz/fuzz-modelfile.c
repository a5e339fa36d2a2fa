/* fuzz-modelfile.c — libFuzzer target for the libkmf readers.
 *
 * Opens the input as a model file (format detected by content, as
 * kmf_open does) and, when it is accepted, walks every tensor and metadata
 * entry and converts small tensors to f32/bf16 and to kk int8/int4, so the
 * dequantizers and conversions see hostile shapes too.  Built with clang
 * -fsanitize=fuzzer,address,undefined (tests/modelfile/build.mk); run by
 * tests/fuzz/fuzz-modelfile.sh. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kmf.h"

/* Larger tensors are skipped: they only cost time, not coverage. */
#define FUZZ_MAX_ELEMS 65536

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void poke_tensor(const kmf_tensor *t)
{
	volatile uint8_t sink = 0;
	if (t->nbytes)
		sink ^= ((const uint8_t *) t->data)[0] ^ ((const uint8_t *) t->data)[t->nbytes - 1];
	(void) sink;
	if (!kmf_dtype_is_float(t->dtype) || t->nelem > FUZZ_MAX_ELEMS)
		return;
	float *f = malloc((size_t) (t->nelem ? t->nelem : 1) * sizeof(float));
	uint16_t *h = malloc((size_t) (t->nelem ? t->nelem : 1) * sizeof(uint16_t));
	if (f && h) {
		kmf_tensor_to_float(t, KK_F32, f, (size_t) t->nelem);
		kmf_tensor_to_float(t, KK_BF16, h, (size_t) t->nelem);
		if (t->ndim == 2 && t->shape[1] % 32 == 0) {
			int8_t *q = malloc((size_t) t->nelem);
			if (q) {
				kmf_tensor_to_i8(t, KK_F16, q, h);
				kmf_tensor_to_q4(t, 32, KK_F32, (uint8_t *) q, f, NULL);
				kmf_tensor_to_i8_g32(t, KK_F32, q, f, NULL);
			}
			free(q);
		}
	}
	free(f);
	free(h);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	kmf_file *f = NULL;
	kiln_error e;
	char line[1024];
	int r = kmf_open_mem(data, size, "fuzz", &f, &e);
	kiln_error_format(&e, line, sizeof(line));
	if (r < 0) {
		if (r != e.code || !e.msg[0])
			abort(); /* every refusal must say why */
		return 0;
	}
	for (size_t i = 0; i < kmf_tensor_count(f); i++) {
		const kmf_tensor *t = kmf_tensor_at(f, i);
		if (kmf_tensor_find(f, t->name) == NULL)
			abort();
		if (t->offset + t->nbytes > size)
			abort();
		poke_tensor(t);
	}
	for (size_t i = 0; i < kmf_meta_count(f); i++) {
		const kmf_meta *m = kmf_meta_at(f, i);
		volatile size_t n = strlen(m->key);
		if (m->type == KMF_V_STRING)
			n += strlen(m->str.s);
		(void) n;
	}
	kmf_close(f);
	return 0;
}
