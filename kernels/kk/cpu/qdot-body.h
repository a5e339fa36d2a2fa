/* kernels/kk/cpu/qdot-body.h — one x86 variant of the int8 dot tiles, included
 * by qdot.c once per instruction set, inside a `#pragma GCC target` region,
 * with:
 *   QV(name)  the variant's suffix on every function (name##_avx2 ...)
 *   QV_DOT32  static inline __m256i f(__m256i w_abs, __m256i x_signed):
 *             8 lanes of int32, each the sum of 4 products u8 * s8
 *             (vpdpbusd, or maddubs + madd)
 *   QV_DOT32A the same added to an int32 accumulator (first argument)
 * The caller gives w as |w| and x as sign(x, w), so the products are those
 * of w and x (llama.cpp's trick: u8 x s8 instructions, signed operands).
 * The body undefines these (and QV_VNNI, QV_PNX) at its end. */

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

/* One int8 block b of the tile into acc. */
static inline __attribute__((always_inline)) void
QV(step_i8)(__m256 (*acc)[2], const kk__qact *a, int64_t r0, const int NX, const void *const *w,
	    const float *const *ws, const int NW, int64_t b, int64_t pf, const bool UNIT)
{
	__m256i wa[2], wv[2];
#pragma GCC unroll 2
	for (int c = 0; c < NW; c++) {
		const int8_t *p = (const int8_t *) w[c] + b * KK_QBLOCK;
		/* The same place some pairs of rows on (pf bytes: about 12 KiB
		 * ahead): rows are short streams the hardware prefetcher starts
		 * late, and a DRAM read takes that long to arrive.  A 32000 x 768
		 * int8 GEMV: 17 GB/s without, 38 with. */
		_mm_prefetch((const char *) (p + pf), _MM_HINT_T0);
		wv[c] = _mm256_loadu_si256((const __m256i *) p);
		wa[c] = _mm256_sign_epi8(wv[c], wv[c]);
	}
#pragma GCC unroll 4
	for (int r = 0; r < NX; r++) {
		const int8_t *xq = a->q + (r0 + r) * a->ldq + b * KK_QBLOCK;
		__m256i xv = _mm256_loadu_si256((const __m256i *) xq);
		/* The block's scale in all lanes, from memory: no multiply or
		 * broadcast per pair for unit (per-channel) weight scales. */
		__m256 xd = _mm256_loadu_ps(a->dx + ((r0 + r) * a->nb + b) * 8);
#pragma GCC unroll 2
		for (int c = 0; c < NW; c++) {
			__m256i p = QV_DOT32(wa[c], _mm256_sign_epi8(xv, wv[c]));
			acc[r][c] = _mm256_fmadd_ps(
				_mm256_cvtepi32_ps(p),
				UNIT ? xd : _mm256_mul_ps(xd, _mm256_broadcast_ss(&ws[c][b])),
				acc[r][c]);
		}
	}
}

/* Int4 blocks b and b + 1 of the tile into acc: one 32-byte load gives
 * both blocks' bytes; its low nibbles meet the activation pair's first 32
 * bytes, its high nibbles the second 32 (kk__qact's int4 order), summed
 * into one vector whose lanes 0-3 are block b's and 4-7 block b+1's, then
 * scaled by [d_b ws_b x4, d_b+1 ws_b+1 x4]. */
static inline __attribute__((always_inline)) void
QV(step_q4x2)(__m256 (*acc)[2], const kk__qact *a, int64_t r0, const int NX, const void *const *w,
	      const float *const *ws, const int NW, int64_t b, int64_t pf)
{
	const __m256i m4 = _mm256_set1_epi8(15);
	__m256i lo[2], hi[2];
	__m256 sw[2];
#pragma GCC unroll 2
	for (int c = 0; c < NW; c++) {
		const uint8_t *p = (const uint8_t *) w[c] + b * (KK_QBLOCK / 2);
		_mm_prefetch((const char *) (p + pf), _MM_HINT_T0); /* as step_i8 */
		__m256i v = _mm256_loadu_si256((const __m256i *) p);
		lo[c] = _mm256_and_si256(v, m4);
		hi[c] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
		sw[c] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_set1_ps(ws[c][b])),
					     _mm_set1_ps(ws[c][b + 1]), 1);
	}
#pragma GCC unroll 4
	for (int r = 0; r < NX; r++) {
		const int8_t *xq = a->q + (r0 + r) * a->ldq + b * KK_QBLOCK;
		__m256i x0 = _mm256_loadu_si256((const __m256i *) xq);
		__m256i x1 = _mm256_loadu_si256((const __m256i *) (xq + KK_QBLOCK));
		__m256i corr = _mm256_loadu_si256(
			(const __m256i *) (a->corr + ((r0 + r) * a->nb + b) * 8));
		__m256 dx = _mm256_loadu_ps(a->dx + ((r0 + r) * a->nb + b) * 4);
#pragma GCC unroll 2
		for (int c = 0; c < NW; c++) {
			__m256i p = QV_DOT32A(QV_DOT32A(corr, lo[c], x0), hi[c], x1);
			acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dx, sw[c]),
						    acc[r][c]);
		}
	}
}

/* A lone last int4 block b (an odd count): its 16 bytes unpacked to
 * [low nibbles | high nibbles], against its [even | odd] activations. */
static inline __attribute__((always_inline)) void
QV(step_q4)(__m256 (*acc)[2], const kk__qact *a, int64_t r0, const int NX, const void *const *w,
	    const float *const *ws, const int NW, int64_t b)
{
	__m256i wa[2];
#pragma GCC unroll 2
	for (int c = 0; c < NW; c++)
		wa[c] = QV(q4_block)((const uint8_t *) w[c] + b * (KK_QBLOCK / 2));
#pragma GCC unroll 4
	for (int r = 0; r < NX; r++) {
		const int8_t *xq = a->q + (r0 + r) * a->ldq + b * KK_QBLOCK;
		__m256i xv = _mm256_loadu_si256((const __m256i *) xq);
		float xd = a->d[(r0 + r) * a->nb + b];
		__m256i corr = _mm256_loadu_si256(
			(const __m256i *) (a->corr + ((r0 + r) * a->nb + b) * 8));
#pragma GCC unroll 2
		for (int c = 0; c < NW; c++) {
			__m256i p = QV_DOT32A(corr, wa[c], xv);
			acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
						    _mm256_set1_ps(xd * ws[c][b]), acc[r][c]);
		}
	}
}

/* The tile: NX activation rows (1..4) against NW weight rows (1..2), one
 * 8-lane float accumulator per pair (two, alternating, when there is one
 * activation row: the GEMV, whose multiply-add latency would otherwise
 * hold each row up); each sees the same operations whatever the tile's
 * shape, so s[r * 2 + c] does not depend on which rows shared a tile (nor
 * on the thread split). */
static inline __attribute__((always_inline)) void
QV(tile)(float *s, const kk__qact *a, int64_t r0, const int NX, const void *const *w,
	 const float *const *ws, const int NW, int64_t k, const bool Q4, const bool UNIT)
{
	const int64_t nbf = k / KK_QBLOCK;
	const int64_t step = Q4 ? 2 : 1;	   /* blocks per step */
	const int64_t pair = 2 * (Q4 ? k / 2 : k); /* bytes of two weight rows */
	const int64_t pf = pair * MAX((int64_t) 1, (int64_t) 12288 / pair);
	__m256 acc[4][2], acc1[4][2];
	int64_t b = 0;
	for (int r = 0; r < NX; r++)
		for (int c = 0; c < NW; c++)
			acc[r][c] = acc1[r][c] = _mm256_setzero_ps();
#define QV_STEP(A, B)                                                      \
	do {                                                               \
		if (Q4)                                                    \
			QV(step_q4x2)(A, a, r0, NX, w, ws, NW, B, pf);     \
		else                                                       \
			QV(step_i8)(A, a, r0, NX, w, ws, NW, B, pf, UNIT); \
	} while (0)
	if (NX == 1) /* never NW: that depends on the thread split */
		for (; b + 2 * step <= nbf; b += 2 * step) {
			QV_STEP(acc, b);
			QV_STEP(acc1, b + step);
		}
	for (; b + step <= nbf; b += step)
		QV_STEP(acc, b);
#undef QV_STEP
	if (Q4 && b < nbf)
		QV(step_q4)(acc, a, r0, NX, w, ws, NW, b);
	for (int r = 0; r < NX; r++)
		for (int c = 0; c < NW; c++)
			s[r * 2 + c] =
				QV(hsum8)(_mm256_add_ps(acc[r][c], acc1[r][c])) +
				(Q4 ? 0.0f : kk__qtail(a, r0 + r, (const int8_t *) w[c], ws[c], k));
}

static inline __attribute__((always_inline)) void
QV(tile_i8_u)(float s[8], const kk__qact *a, int64_t r0, int nx, const void *const *w,
	      const float *const *ws, int nw, int64_t k, const bool UNIT)
{
	switch (nx * 2 + nw - 1) {
	case 2:
		QV(tile)(s, a, r0, 1, w, ws, 1, k, false, UNIT);
		break;
	case 3:
		QV(tile)(s, a, r0, 1, w, ws, 2, k, false, UNIT);
		break;
	case 4:
		QV(tile)(s, a, r0, 2, w, ws, 1, k, false, UNIT);
		break;
	case 5:
		QV(tile)(s, a, r0, 2, w, ws, 2, k, false, UNIT);
		break;
	case 6:
		QV(tile)(s, a, r0, 3, w, ws, 1, k, false, UNIT);
		break;
	case 7:
		QV(tile)(s, a, r0, 3, w, ws, 2, k, false, UNIT);
		break;
	case 8:
		QV(tile)(s, a, r0, 4, w, ws, 1, k, false, UNIT);
		break;
	default:
		QV(tile)(s, a, r0, 4, w, ws, 2, k, false, UNIT);
		break;
	}
}

/* Per-channel int8 (unit block scales) and per-block scales, each with
 * its own loop. */
static void QV(tile_i8)(float s[8], const kk__qact *a, int64_t r0, int nx, const void *const *w,
			const float *const *ws, int nw, int64_t k)
{
	if (ws[0])
		QV(tile_i8_u)(s, a, r0, nx, w, ws, nw, k, false);
	else
		QV(tile_i8_u)(s, a, r0, nx, w, ws, nw, k, true);
}

static void QV(tile_q4)(float s[8], const kk__qact *a, int64_t r0, int nx, const void *const *w,
			const float *const *ws, int nw, int64_t k)
{
	switch (nx * 2 + nw - 1) {
	case 2:
		QV(tile)(s, a, r0, 1, w, ws, 1, k, true, false);
		break;
	case 3:
		QV(tile)(s, a, r0, 1, w, ws, 2, k, true, false);
		break;
	case 4:
		QV(tile)(s, a, r0, 2, w, ws, 1, k, true, false);
		break;
	case 5:
		QV(tile)(s, a, r0, 2, w, ws, 2, k, true, false);
		break;
	case 6:
		QV(tile)(s, a, r0, 3, w, ws, 1, k, true, false);
		break;
	case 7:
		QV(tile)(s, a, r0, 3, w, ws, 2, k, true, false);
		break;
	case 8:
		QV(tile)(s, a, r0, 4, w, ws, 1, k, true, false);
		break;
	default:
		QV(tile)(s, a, r0, 4, w, ws, 2, k, true, false);
		break;
	}
}

/* ---- packed groups (KK_QPACK rows in the lanes) ------------------------- */

/* The scales of a group's 8 rows for one scale group, as 8 floats. */
static inline __attribute__((always_inline)) __m256 QV(pscales)(const void *ws, const int SDT,
								int64_t s)
{
	if (SDT == KK_QS_F16)
		return _mm256_cvtph_ps(
			_mm_loadu_si128((const __m128i *) ((const uint16_t *) ws + s * KK_QPACK)));
	return _mm256_loadu_ps((const float *) ws + s * KK_QPACK);
}

/* NX activation rows (1..4) against one packed group of 8 rows: lane i of
 * every vector is row i.  A block's 8 chunks (32 bytes: 4 codes of each
 * row) meet 4 codes of the activation block each, broadcast to all lanes;
 * the integer sum of the block lands in lane i for row i, so one
 * conversion and one multiply-add per block and activation row cover 8
 * outputs, and the scales come in as one vector.  The weight codes are
 * unsigned (int8 + 128, int4 + 8): vnni's u8 x s8 vpdpbusd takes them as
 * they are, starting from -offset * (the activation block's code sum, xs);
 * avx2's vpmaddubsw would saturate on int8 + 128, so it takes int8 back to
 * signed with llama.cpp's |w| / sign(x, w) pair instead. */
static inline __attribute__((always_inline)) void
QV(ptile)(float s[KK_QPTILE_MAX * 8], const kk__qact *a, int64_t r0, const int NX, const uint8_t *w,
	  const void *ws, const int SDT, int sshift, int64_t nb, const bool Q4)
{
	const __m256i m4 = _mm256_set1_epi8(15);
	const int64_t bb = Q4 ? 128 : 256;
	__m256 acc[KK_QPTILE_MAX];
	const int8_t *xqr[KK_QPTILE_MAX];
	const float *xdr[KK_QPTILE_MAX];
	const int32_t *xsr[KK_QPTILE_MAX];
	for (int r = 0; r < NX; r++) {
		acc[r] = _mm256_setzero_ps();
		xqr[r] = a->q + (r0 + r) * a->ldq;
		xdr[r] = a->d + (r0 + r) * a->nb;
		xsr[r] = a->xs + (r0 + r) * a->nb;
	}
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *p = w + b * bb;
		__m256i wv[8];
		/* The groups are one stream; its lines KK_QPF bytes ahead. */
		_mm_prefetch((const char *) (p + KK_QPF), _MM_HINT_T0);
		_mm_prefetch((const char *) (p + KK_QPF + 64), _MM_HINT_T0);
		if (Q4) {
#pragma GCC unroll 4
			for (int v = 0; v < 4; v++) {
				__m256i t = _mm256_loadu_si256((const __m256i *) (p + 32 * v));
				wv[v] = _mm256_and_si256(t, m4);
				/* One activation row (decode): the high nibbles
				 * stay in place (16 x the code) and their sum is
				 * shifted back once per block instead of each
				 * chunk (vpdpbusd does not saturate; avx2's
				 * vpmaddubsw would).  With more rows the shift per
				 * row and block costs more than it saves (m = 128:
				 * 345 -> 300 GFLOP/s). */
				wv[4 + v] = QV_VNNI && NX == 1
						    ? _mm256_andnot_si256(m4, t)
						    : _mm256_and_si256(_mm256_srli_epi16(t, 4), m4);
			}
		} else {
			_mm_prefetch((const char *) (p + KK_QPF + 128), _MM_HINT_T0);
			_mm_prefetch((const char *) (p + KK_QPF + 192), _MM_HINT_T0);
#pragma GCC unroll 8
			for (int v = 0; v < 8; v++) {
				wv[v] = _mm256_loadu_si256((const __m256i *) (p + 32 * v));
#if !QV_VNNI
				wv[v] = _mm256_xor_si256(wv[v], _mm256_set1_epi8((char) 0x80));
#endif
			}
		}
#if !QV_VNNI
		__m256i wa[8];
		if (!Q4)
#pragma GCC unroll 8
			for (int v = 0; v < 8; v++)
				wa[v] = _mm256_sign_epi8(wv[v], wv[v]);
#endif
		__m256 sw =
			SDT != KK_QS_NONE ? QV(pscales)(ws, SDT, b >> sshift) : _mm256_setzero_ps();
#pragma GCC unroll 8
		for (int r = 0; r < NX; r++) {
			const int8_t *xq = xqr[r] + b * KK_QBLOCK;
			__m256i s0, s1;
			/* Codes 4v .. 4v+3 in every lane: one broadcast load
			 * each (a copy through general registers was 3-4
			 * instructions a chunk). */
#define X4(v) _mm256_castps_si256(_mm256_broadcast_ss((const float *) (xq + 4 * (v))))
#if QV_VNNI
			/* Two 16-byte halves broadcast, each dword of a half
			 * spread by vpshufd: 2 loads instead of 8 (a tile's
			 * loads, not its dots, were the limit). */
			const __m256i xl =
				_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *) xq));
			const __m256i xh = _mm256_broadcastsi128_si256(
				_mm_loadu_si128((const __m128i *) (xq + 16)));
			s0 = _mm256_castps_si256(_mm256_broadcast_ss((const float *) &xsr[r][b]));
			s1 = _mm256_setzero_si256();
			if (Q4 && NX == 1) { /* s1: the high nibbles alone, 16 x theirs */
				s0 = QV_DOT32A(s0, wv[0], _mm256_shuffle_epi32(xl, 0x00));
				s1 = QV_DOT32A(s1, wv[4], _mm256_shuffle_epi32(xh, 0x00));
				s0 = QV_DOT32A(s0, wv[1], _mm256_shuffle_epi32(xl, 0x55));
				s1 = QV_DOT32A(s1, wv[5], _mm256_shuffle_epi32(xh, 0x55));
				s0 = QV_DOT32A(s0, wv[2], _mm256_shuffle_epi32(xl, 0xaa));
				s1 = QV_DOT32A(s1, wv[6], _mm256_shuffle_epi32(xh, 0xaa));
				s0 = QV_DOT32A(s0, wv[3], _mm256_shuffle_epi32(xl, 0xff));
				s1 = QV_DOT32A(s1, wv[7], _mm256_shuffle_epi32(xh, 0xff));
				s1 = _mm256_srai_epi32(s1, 4);
			} else {
				s0 = QV_DOT32A(s0, wv[0], _mm256_shuffle_epi32(xl, 0x00));
				s1 = QV_DOT32A(s1, wv[1], _mm256_shuffle_epi32(xl, 0x55));
				s0 = QV_DOT32A(s0, wv[2], _mm256_shuffle_epi32(xl, 0xaa));
				s1 = QV_DOT32A(s1, wv[3], _mm256_shuffle_epi32(xl, 0xff));
				s0 = QV_DOT32A(s0, wv[4], _mm256_shuffle_epi32(xh, 0x00));
				s1 = QV_DOT32A(s1, wv[5], _mm256_shuffle_epi32(xh, 0x55));
				s0 = QV_DOT32A(s0, wv[6], _mm256_shuffle_epi32(xh, 0xaa));
				s1 = QV_DOT32A(s1, wv[7], _mm256_shuffle_epi32(xh, 0xff));
			}
#else
			if (Q4) {
				s0 = _mm256_castps_si256(
					_mm256_broadcast_ss((const float *) &xsr[r][b]));
				s1 = _mm256_setzero_si256();
#pragma GCC unroll 4
				for (int v = 0; v < 8; v += 2) {
					s0 = QV_DOT32A(s0, wv[v], X4(v));
					s1 = QV_DOT32A(s1, wv[v + 1], X4(v + 1));
				}
			} else {
				s0 = s1 = _mm256_setzero_si256();
#pragma GCC unroll 4
				for (int v = 0; v < 8; v += 2) {
					s0 = QV_DOT32A(s0, wa[v], _mm256_sign_epi8(X4(v), wv[v]));
					s1 = QV_DOT32A(s1, wa[v + 1],
						       _mm256_sign_epi8(X4(v + 1), wv[v + 1]));
				}
			}
#endif
#undef X4
			__m256 xd = _mm256_set1_ps(xdr[r][b]);
			acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)),
						 SDT != KK_QS_NONE ? _mm256_mul_ps(sw, xd) : xd,
						 acc[r]);
		}
	}
	for (int r = 0; r < NX; r++)
		_mm256_storeu_ps(s + r * 8, acc[r]);
}

static inline __attribute__((always_inline)) void
QV(ptile_n)(float s[KK_QPTILE_MAX * 8], const kk__qact *a, int64_t r0, int nx, const uint8_t *w,
	    const void *ws, const int SDT, int sshift, int64_t nb, const bool Q4)
{
	/* Up to QV_PNX rows: vnni's 32 vector registers hold 8 rows'
	 * accumulators beside the 8 weight chunks, avx2's 16 hold 4. */
	switch (nx) {
	case 1:
		QV(ptile)(s, a, r0, 1, w, ws, SDT, sshift, nb, Q4);
		break;
	case 2:
		QV(ptile)(s, a, r0, 2, w, ws, SDT, sshift, nb, Q4);
		break;
	case 3:
		QV(ptile)(s, a, r0, 3, w, ws, SDT, sshift, nb, Q4);
		break;
#if QV_PNX > 4
	case 4:
		QV(ptile)(s, a, r0, 4, w, ws, SDT, sshift, nb, Q4);
		break;
	case 5:
		QV(ptile)(s, a, r0, 5, w, ws, SDT, sshift, nb, Q4);
		break;
	case 6:
		QV(ptile)(s, a, r0, 6, w, ws, SDT, sshift, nb, Q4);
		break;
	case 7:
		QV(ptile)(s, a, r0, 7, w, ws, SDT, sshift, nb, Q4);
		break;
	default:
		QV(ptile)(s, a, r0, 8, w, ws, SDT, sshift, nb, Q4);
		break;
#else
	default:
		QV(ptile)(s, a, r0, 4, w, ws, SDT, sshift, nb, Q4);
		break;
#endif
	}
}

static void QV(ptile_i8)(float s[KK_QPTILE_MAX * 8], const kk__qact *a, int64_t r0, int nx,
			 const uint8_t *w, const void *ws, int sdt, int sshift, int64_t nb)
{
	if (sdt == KK_QS_F16)
		QV(ptile_n)(s, a, r0, nx, w, ws, KK_QS_F16, sshift, nb, false);
	else if (sdt == KK_QS_F32)
		QV(ptile_n)(s, a, r0, nx, w, ws, KK_QS_F32, sshift, nb, false);
	else
		QV(ptile_n)(s, a, r0, nx, w, ws, KK_QS_NONE, sshift, nb, false);
}

static void QV(ptile_q4)(float s[KK_QPTILE_MAX * 8], const kk__qact *a, int64_t r0, int nx,
			 const uint8_t *w, const void *ws, int sdt, int sshift, int64_t nb)
{
	if (sdt == KK_QS_F16)
		QV(ptile_n)(s, a, r0, nx, w, ws, KK_QS_F16, sshift, nb, true);
	else
		QV(ptile_n)(s, a, r0, nx, w, ws, KK_QS_F32, sshift, nb, true);
}

/* kk__qact_quantize_p, 32 elements a step: the same codes, scales and
 * sums (max|x| and x * (127 / max) are exact or one f32 rounding either
 * way; vcvtps2dq rounds to nearest even, as rintf). */
static void QV(qact_p)(kk__qact *a, int64_t r, const float *x)
{
	int8_t *q = a->q + r * a->ldq;
	float *d = a->d + r * a->nb;
	int32_t *xs = a->xs + r * a->nb;
	const __m256 sgn = _mm256_set1_ps(-0.0f);
	const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
	for (int64_t b = 0; b < a->nb; b++) {
		const float *xb = x + b * KK_QBLOCK;
		__m256 v[4];
		for (int i = 0; i < 4; i++)
			v[i] = _mm256_loadu_ps(xb + 8 * i);
		__m256 mx = _mm256_max_ps(
			_mm256_max_ps(_mm256_andnot_ps(sgn, v[0]), _mm256_andnot_ps(sgn, v[1])),
			_mm256_max_ps(_mm256_andnot_ps(sgn, v[2]), _mm256_andnot_ps(sgn, v[3])));
		__m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
		m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
		m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
		float amax = _mm_cvtss_f32(m4), inv = amax > 0 ? 127.0f / amax : 0.0f;
		d[b] = amax / 127.0f;
		__m256 vi = _mm256_set1_ps(inv);
		__m256i c[4];
		for (int i = 0; i < 4; i++)
			c[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], vi));
		__m256i s = _mm256_add_epi32(_mm256_add_epi32(c[0], c[1]),
					     _mm256_add_epi32(c[2], c[3]));
		__m128i s4 =
			_mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
		s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
		s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
		xs[b] = -a->xoff * _mm_cvtsi128_si32(s4);
		__m256i p = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]),
					       _mm256_packs_epi32(c[2], c[3]));
		_mm256_storeu_si256((__m256i *) (q + b * KK_QBLOCK),
				    _mm256_permutevar8x32_epi32(p, order));
	}
}

#undef QV_PNX
#undef QV_VNNI
#undef QV
#undef QV_DOT32
#undef QV_DOT32A
