/* kernels/kk/cuda/kc_plan.h — how the 16-bit paged decode (attention.cu) splits
 * each sequence's KV pages over blocks (flash-decoding).  Pure host
 * arithmetic in C, shared by the launcher and a plain C test
 * (tests/kernels/test-decode-plan.c), so the plan is checked without a GPU
 * or the emulator.
 *
 * The grid is splits x units, where a unit is one (sequence, kv-head slice)
 * pair; `slots` blocks run at once (SMs x resident blocks per SM).  The host
 * must not read the context lengths (they live on the device and change every
 * step), so the plan is made for the longest context, `pages` KV pages.
 *
 * Cost model: blocks run in waves of `slots`; every block of a wave takes as
 * long as the one with the most pages (pps, pages per split) plus a fixed
 * cost (loading q, merging its warps, writing a partial row that the combine
 * kernel reads back: about one page of K/V traffic, KC_DEC_BLOCK_COST).  The
 * plan minimizes waves x (pps + KC_DEC_BLOCK_COST) over the split counts, the
 * fewer splits on a tie.  A partly filled last wave and a short last split
 * both cost here, so the chosen plan fills the SMs in whole waves where the
 * work allows it. */
#pragma once

#define KC_DEC_MIN_PAGES  4   /* fewest KV pages (64 tokens) per split: one per warp */
#define KC_DEC_MAX_SPLITS 128 /* bounds the workspace: 128 partial rows per head */
#define KC_DEC_BLOCK_COST 1   /* a block's fixed cost, in pages of K/V */

typedef struct kc_dec_plan {
	int splits; /* blocks along the context per unit, >= 1 */
	int pps;    /* pages per split; the last split has 1..pps */
	long waves; /* ceil(splits x units / slots) */
} kc_dec_plan;

/* The plan for `pages` >= 0 pages of the longest context, `units` >= 1
 * (sequence, kv-head slice) pairs and `slots` >= 1 resident blocks.  Never 0
 * splits, never more splits than pages, at least KC_DEC_MIN_PAGES pages per
 * split when split, at most KC_DEC_MAX_SPLITS, no empty split. */
static inline kc_dec_plan kc_dec_plan_make(long pages, long units, long slots)
{
	kc_dec_plan best = { 1, pages > 0 ? (int) pages : 0, 1 };
	if (units < 1)
		units = 1;
	if (slots < 1)
		slots = 1;
	best.waves = (units + slots - 1) / slots;
	long cap = pages / KC_DEC_MIN_PAGES;
	if (cap > KC_DEC_MAX_SPLITS)
		cap = KC_DEC_MAX_SPLITS;
	long best_cost = best.waves * (pages + KC_DEC_BLOCK_COST);
	for (long n = 2; n <= cap; n++) {
		long pps = (pages + n - 1) / n;
		long splits = (pages + pps - 1) / pps; /* n may leave the last split empty */
		if (splits != n)
			continue; /* the same plan as a smaller n */
		long waves = (splits * units + slots - 1) / slots;
		long cost = waves * (pps + KC_DEC_BLOCK_COST);
		if (cost < best_cost) {
			best_cost = cost;
			best.splits = (int) splits;
			best.pps = (int) pps;
			best.waves = waves;
		}
	}
	return best;
}

/* The fraction of block-slot time that reads pages, had every sequence the
 * longest context: pages x units / (waves x slots x pps).  1 is whole waves
 * of equal splits. */
static inline double kc_dec_plan_fill(const kc_dec_plan *p, long pages, long units, long slots)
{
	if (pages <= 0 || p->pps <= 0)
		return 1.0;
	return (double) pages * (double) units / ((double) p->waves * (double) slots * p->pps);
}
