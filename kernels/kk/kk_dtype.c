/* kernels/kk/kk_dtype.c — host-side bf16/f16 <-> f32 conversion.
 *
 * Used by the cpu backend to widen/narrow storage dtypes and by programs to
 * load weights and check results.  Rounding is to nearest even, NaN stays
 * NaN (quiet), overflow goes to infinity, f16 subnormals are exact. */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "kiln/macro.h"
#include "kk_convert.h"
#include "kk_internal.h"

float kk_bf16_to_f32(uint16_t h)
{
	return kk__b2f(h);
}

uint16_t kk_f32_to_bf16(float f)
{
	return kk__f2b(f);
}

float kk_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t) (h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;

	if (exp == 0x1f)
		return kk__u2f(sign | 0x7f800000u | (man << 13));
	if (exp == 0) {
		/* zero or subnormal: man * 2^-24 */
		float v = (float) man * (1.0f / 16777216.0f);
		return sign ? -v : v;
	}
	return kk__u2f(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t kk_f32_to_f16(float f)
{
	uint32_t u = kk__f2u(f);
	uint16_t sign = (uint16_t) ((u >> 16) & 0x8000);
	float a = fabsf(f);

	if (isnan(f))
		return sign | 0x7e00;
	if (a >= 65520.0f) /* rounds to infinity */
		return sign | 0x7c00;
	if (a < 6.103515625e-05f) {
		/* subnormal range: multiples of 2^-24, round half even via rintf */
		uint32_t m = (uint32_t) rintf(a * 16777216.0f);
		return sign | (uint16_t) m; /* m == 1024 yields the smallest normal */
	}
	{
		uint32_t e = ((u >> 23) & 0xff) - 112, man = u & 0x7fffff;
		uint32_t h = (e << 10) | (man >> 13);
		uint32_t rem = man & 0x1fff;
		if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
			h++;
		return sign | (uint16_t) h;
	}
}

int kk_convert_host(kk_dtype dst_dt, void *dst, kk_dtype src_dt, const void *src, size_t count)
{
	assert_return(dst && src, -EINVAL);
	assert_return(dst_dt == KK_F32 || dst_dt == KK_BF16 || dst_dt == KK_F16, -EINVAL);
	assert_return(src_dt == KK_F32 || src_dt == KK_BF16 || src_dt == KK_F16, -EINVAL);
	for (size_t i = 0; i < count; i++)
		kk__st(dst, dst_dt, i, kk__ld(src, src_dt, i));
	return 0;
}
