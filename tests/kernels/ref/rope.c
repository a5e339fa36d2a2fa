/* tests/kernels/ref/rope.c — float64 rotary position embedding (see
 * ref.h). */
#include <math.h>
#include <string.h>

#include "ref.h"

void ref_rope(double *y, const double *x, const int32_t *pos, int64_t tokens, int H, int D, int rot,
	      const double *inv_freq, kk_rope_mode mode)
{
	int R = rot ? rot : D;
	if (y != x)
		memcpy(y, x, (size_t) tokens * H * D * sizeof(double));
	for (int64_t t = 0; t < tokens; t++)
		for (int h = 0; h < H; h++)
			for (int i = 0; i < R / 2; i++) {
				double ang = pos[t] * inv_freq[i];
				size_t base = ((size_t) t * H + h) * D;
				size_t ia = mode == KK_ROPE_INTERLEAVED ? base + 2 * i : base + i;
				size_t ib = mode == KK_ROPE_INTERLEAVED ? ia + 1 : ia + R / 2;
				double a = x[ia], b = x[ib];
				y[ia] = a * cos(ang) - b * sin(ang);
				y[ib] = a * sin(ang) + b * cos(ang);
			}
}
