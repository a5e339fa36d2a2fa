/* tests/gpu/emu/mma-check.cpp — checks the emulated warp-level
 * matrix instructions (kc_emu_mma.h, reached through kernels/kk/cuda/kc_mma.cuh)
 * before test-emu.sh trusts them with the attention kernels.
 *
 * 1. mma.m16n8k16 (bf16 and f16): each lane builds its A, B, C registers
 *    straight from the PTX ISA's fragment formulas (written out again here),
 *    and the D fragments must equal a float64 product of random tiles.
 * 2. ldmatrix .x4 and .x4.trans: each lane's registers must hold the
 *    elements the ISA assigns to it, from a tile of distinct values.
 * 3. The way attention.cu feeds the tensor cores: A from a row-major tile and
 *    B from an [n][k] tile through ldmatrix, B from a [k][n] tile through
 *    ldmatrix.trans, then mma: must equal the float64 product.
 * Prints "# ..." lines and exits 0 when everything holds, 1 otherwise. */
#include <math.h>
#include <stdio.h>

#include "cuda_runtime.h"
#include "kc_mma.cuh"

static uint64_t rs = 0x9E3779B97F4A7C15ull;
static float frand(void)
{
	rs ^= rs << 13;
	rs ^= rs >> 7;
	rs ^= rs << 17;
	return (float) ((rs >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}
static uint16_t to_h(float f, bool bf)
{
	return bf ? kk_f32_to_bf16(f) : kk_f32_to_f16(f);
}
static float from_h(uint16_t h, bool bf)
{
	return bf ? kk_bf16_to_f32(h) : kk_f16_to_f32(h);
}

/* Test data shared with the emulated threads (blocks run one at a time). */
static uint16_t gA[16][16], gB[16][8], gBt[8][16]; /* gBt[n][k] = gB[k][n] */
static float gC[16][8], gD[16][8];
static uint32_t gR[32][4];
static bool g_bf;

static uint32_t pk(uint16_t lo, uint16_t hi)
{
	return (uint32_t) lo | (uint32_t) hi << 16;
}

static void k_mma_direct(void)
{
	int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
	uint32_t a[4] = { pk(gA[g][2 * t], gA[g][2 * t + 1]), pk(gA[g + 8][2 * t], gA[g + 8][2 * t + 1]),
			  pk(gA[g][2 * t + 8], gA[g][2 * t + 9]),
			  pk(gA[g + 8][2 * t + 8], gA[g + 8][2 * t + 9]) };
	uint32_t b[2] = { pk(gB[2 * t][g], gB[2 * t + 1][g]), pk(gB[2 * t + 8][g], gB[2 * t + 9][g]) };
	float d[4] = { gC[g][2 * t], gC[g][2 * t + 1], gC[g + 8][2 * t], gC[g + 8][2 * t + 1] };
	if (g_bf)
		kc_mma16816<true>(d, a, b);
	else
		kc_mma16816<false>(d, a, b);
	gD[g][2 * t] = d[0], gD[g][2 * t + 1] = d[1];
	gD[g + 8][2 * t] = d[2], gD[g + 8][2 * t + 1] = d[3];
}

static bool g_trans;
static void k_ldsm(void)
{
	/* Matrix m = rows 8 (m & 1).., columns 8 (m >> 1).. of gA. */
	int lane = threadIdx.x & 31, m = lane >> 3, r = lane & 7;
	const uint16_t *p = &gA[8 * (m & 1) + r][8 * (m >> 1)];
	if (g_trans)
		kc_ldsm_x4_t(gR[lane], p);
	else
		kc_ldsm_x4(gR[lane], p);
}

/* As attention.cu: A row-major [16][16]; B given as gBt[n][k] (the K tile)
 * through ldmatrix, or as gB[k][n] (the V tile) through ldmatrix.trans. */
static void k_mma_ldsm(void)
{
	int lane = threadIdx.x & 31, m = lane >> 3, r = lane & 7, g = lane >> 2, t = lane & 3;
	uint32_t a[4], bb[4], b[2];
	kc_ldsm_x4(a, &gA[8 * (m & 1) + r][8 * (m >> 1)]);
	if (!g_trans) {
		/* matrices: (n 0-7, k 0-7), (n 0-7, k 8-15); x4 repeats them. */
		kc_ldsm_x4(bb, &gBt[r][8 * (m & 1)]);
	} else {
		/* matrices: (k 0-7, n 0-7), (k 8-15, n 0-7); x4 repeats them. */
		kc_ldsm_x4_t(bb, &gB[8 * (m & 1) + r][0]);
	}
	b[0] = bb[0], b[1] = bb[1];
	float d[4] = { 0, 0, 0, 0 };
	if (g_bf)
		kc_mma16816<true>(d, a, b);
	else
		kc_mma16816<false>(d, a, b);
	gD[g][2 * t] = d[0], gD[g][2 * t + 1] = d[1];
	gD[g + 8][2 * t] = d[2], gD[g + 8][2 * t + 1] = d[3];
}

static void fill(bool bf)
{
	g_bf = bf;
	for (int i = 0; i < 16; i++)
		for (int k = 0; k < 16; k++)
			gA[i][k] = to_h(frand(), bf);
	for (int k = 0; k < 16; k++)
		for (int j = 0; j < 8; j++) {
			gB[k][j] = to_h(frand(), bf);
			gBt[j][k] = gB[k][j];
		}
	for (int i = 0; i < 16; i++)
		for (int j = 0; j < 8; j++)
			gC[i][j] = frand();
}

static int check_prod(bool with_c, const char *what)
{
	double worst = 0;
	for (int i = 0; i < 16; i++)
		for (int j = 0; j < 8; j++) {
			double s = with_c ? gC[i][j] : 0;
			for (int k = 0; k < 16; k++)
				s += (double) from_h(gA[i][k], g_bf) * from_h(gB[k][j], g_bf);
			double e = fabs(s - gD[i][j]);
			worst = e > worst || isnan(e) ? e : worst;
		}
	bool ok = worst <= 1e-5;
	printf("# %s %s: max |err| %.3g %s\n", what, g_bf ? "bf16" : "f16", worst,
	       ok ? "ok" : "FAILED");
	return ok ? 0 : 1;
}

static void launch(void (*k)(void))
{
	kc_emu_launch(kc_cfg(dim3(1), dim3(32)), k);
}

int main(void)
{
	int bad = 0;
	for (int it = 0; it < 6; it++) {
		fill(it & 1);
		launch(k_mma_direct);
		bad += check_prod(true, "mma.m16n8k16 from ISA fragments");
	}
	fill(true);
	for (int tr = 0; tr < 2; tr++) {
		g_trans = tr;
		launch(k_ldsm);
		int wrong = 0;
		for (int l = 0; l < 32; l++)
			for (int m = 0; m < 4; m++)
				for (int j = 0; j < 2; j++) {
					int row = tr ? (l % 4) * 2 + j : l / 4;
					int col = tr ? l / 4 : (l % 4) * 2 + j;
					uint16_t want = gA[8 * (m & 1) + row][8 * (m >> 1) + col];
					uint16_t got = (uint16_t) (gR[l][m] >> (16 * j));
					wrong += got != want;
				}
		printf("# ldmatrix.x4%s: %d of 256 elements misplaced %s\n", tr ? ".trans" : "",
		       wrong, wrong ? "FAILED" : "ok");
		bad += wrong != 0;
	}
	for (int it = 0; it < 4; it++) {
		fill(it & 1);
		g_trans = it >> 1;
		launch(k_mma_ldsm);
		bad += check_prod(false, g_trans ? "ldmatrix A + ldmatrix.trans B [k][n] + mma"
						 : "ldmatrix A + ldmatrix B [n][k] + mma");
	}
	return bad ? 1 : 0;
}
