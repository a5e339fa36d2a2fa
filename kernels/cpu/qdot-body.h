/* kernels/cpu/qdot-body.h — one x86 variant of the int8 dot tiles, included
 * by qdot.c once per instruction set, inside a `#pragma GCC target` region,
 * with:
 *   QV(name)  the variant's suffix on every function (name##_avx2 ...)
 *   QV_DOT32  static inline __m256i f(__m256i w_abs, __m256i x_signed):
 *             8 lanes of int32, each the sum of 4 products u8 * s8
 *             (vpdpbusd, or maddubs + madd)
 *   QV_DOT32A the same added to an int32 accumulator (first argument)
 * The caller gives w as |w| and x as sign(x, w), so the products are those
 * of w and x (llama.cpp's trick: u8 x s8 instructions, signed operands). */

/* 32 int4 weights of one block (16 bytes, element 2p in the low nibble of
 * byte p) as unsigned bytes q + 8: lanes 0..15 the low nibbles (even
 * elements), 16..31 the high ones (odd elements): the order of the
 * activation blocks quantized for q4 (kk__qact_quantize's q4 layout).  The
 * offset 8 is taken off with the activation block's lane sums (a->corr),
 * so nibbles go into the u8 x s8 product as they are. */
static inline __attribute__((always_inline)) __m256i QV(q4_block)(const uint8_t *p)
{
	__m128i t = _mm_loadu_si128((const __m128i *) p);
	__m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
	return _mm256_and_si256(v, _mm256_set1_epi8(15));
}

static inline __attribute__((always_inline)) float QV(hsum8)(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

/* One block b of the tile into acc. */
static inline __attribute__((always_inline)) void
QV(step)(__m256 (*acc)[2], const kk__qact *a, int64_t r0, const int NX, const void *const *w,
	 const float *const *ws, const int NW, int64_t b, const bool Q4)
{
	__m256i wa[2], wv[2];
#pragma GCC unroll 2
	for (int c = 0; c < NW; c++) {
		if (Q4) {
			wa[c] = QV(q4_block)((const uint8_t *) w[c] + b * (KK_QBLOCK / 2));
		} else {
			wv[c] = _mm256_loadu_si256(
				(const __m256i *) ((const int8_t *) w[c] + b * KK_QBLOCK));
			wa[c] = _mm256_sign_epi8(wv[c], wv[c]);
		}
	}
#pragma GCC unroll 4
	for (int r = 0; r < NX; r++) {
		const int8_t *xq = a->q + (r0 + r) * a->ldq + b * KK_QBLOCK;
		__m256i xv = _mm256_loadu_si256((const __m256i *) xq);
		float xd = a->d[(r0 + r) * a->nb + b];
		__m256i corr = Q4 ? _mm256_loadu_si256(
					    (const __m256i *) (a->corr + ((r0 + r) * a->nb + b) * 8))
				  : _mm256_setzero_si256();
#pragma GCC unroll 2
		for (int c = 0; c < NW; c++) {
			__m256i p = Q4 ? QV_DOT32A(corr, wa[c], xv)
				       : QV_DOT32(wa[c], _mm256_sign_epi8(xv, wv[c]));
			acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
						    _mm256_set1_ps(xd * ws[c][b]), acc[r][c]);
		}
	}
}

/* The tile: NX activation rows (1..4) against NW weight rows (1..2), one
 * 8-lane float accumulator per pair (two, for even and odd blocks, when
 * there is one activation row: the GEMV, whose multiply-add latency would
 * otherwise hold each row up);
 * each sees the same operations whatever the tile's shape, so
 * s[r * 2 + c] does not depend on which rows shared a tile (nor on the
 * thread split). */
static inline __attribute__((always_inline)) void
QV(tile)(float *s, const kk__qact *a, int64_t r0, const int NX, const void *const *w,
	 const float *const *ws, const int NW, int64_t k, const bool Q4)
{
	const int64_t nbf = k / KK_QBLOCK;
	__m256 acc[4][2], acc1[4][2];
	int64_t b = 0;
	for (int r = 0; r < NX; r++)
		for (int c = 0; c < NW; c++)
			acc[r][c] = acc1[r][c] = _mm256_setzero_ps();
	if (NX == 1) /* never NW: that depends on the thread split */
		for (; b + 2 <= nbf; b += 2) {
			QV(step)(acc, a, r0, NX, w, ws, NW, b, Q4);
			QV(step)(acc1, a, r0, NX, w, ws, NW, b + 1, Q4);
		}
	for (; b < nbf; b++)
		QV(step)(acc, a, r0, NX, w, ws, NW, b, Q4);
	for (int r = 0; r < NX; r++)
		for (int c = 0; c < NW; c++)
			s[r * 2 + c] = QV(hsum8)(_mm256_add_ps(acc[r][c], acc1[r][c])) +
				       kk__qtail(a, r0 + r, (const int8_t *) w[c], ws[c], k);
}

static void QV(tile_i8)(float s[8], const kk__qact *a, int64_t r0, int nx, const void *const *w,
			const float *const *ws, int nw, int64_t k)
{
	switch (nx * 2 + nw - 1) {
	case 2:
		QV(tile)(s, a, r0, 1, w, ws, 1, k, false);
		break;
	case 3:
		QV(tile)(s, a, r0, 1, w, ws, 2, k, false);
		break;
	case 4:
		QV(tile)(s, a, r0, 2, w, ws, 1, k, false);
		break;
	case 5:
		QV(tile)(s, a, r0, 2, w, ws, 2, k, false);
		break;
	case 6:
		QV(tile)(s, a, r0, 3, w, ws, 1, k, false);
		break;
	case 7:
		QV(tile)(s, a, r0, 3, w, ws, 2, k, false);
		break;
	case 8:
		QV(tile)(s, a, r0, 4, w, ws, 1, k, false);
		break;
	default:
		QV(tile)(s, a, r0, 4, w, ws, 2, k, false);
		break;
	}
}

static void QV(tile_q4)(float s[8], const kk__qact *a, int64_t r0, int nx, const void *const *w,
			const float *const *ws, int nw, int64_t k)
{
	switch (nx * 2 + nw - 1) {
	case 2:
		QV(tile)(s, a, r0, 1, w, ws, 1, k, true);
		break;
	case 3:
		QV(tile)(s, a, r0, 1, w, ws, 2, k, true);
		break;
	case 4:
		QV(tile)(s, a, r0, 2, w, ws, 1, k, true);
		break;
	case 5:
		QV(tile)(s, a, r0, 2, w, ws, 2, k, true);
		break;
	case 6:
		QV(tile)(s, a, r0, 3, w, ws, 1, k, true);
		break;
	case 7:
		QV(tile)(s, a, r0, 3, w, ws, 2, k, true);
		break;
	case 8:
		QV(tile)(s, a, r0, 4, w, ws, 1, k, true);
		break;
	default:
		QV(tile)(s, a, r0, 4, w, ws, 2, k, true);
		break;
	}
}
