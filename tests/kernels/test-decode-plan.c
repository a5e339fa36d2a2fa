/* tests/kernels/test-decode-plan.c — the paged decode's split plan
 * (kernels/kk/cuda/kc_plan.h) as a pure host function: its invariants over a
 * grid of shapes (never 0 splits, never more splits than pages, at least
 * KC_DEC_MIN_PAGES pages per split, no empty split) and how well it fills the
 * SMs (whole waves, no short last split) against the plan it replaced. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>

#include "kc_plan.h"

/* Where every shape that can fill the GPU must land: the worst case of the
 * grid below is 0.81 (100 pages, 16 units, 396 slots: 20 splits of 5 pages
 * in one wave of 396, or 25 of 4 in two). */
#define FILL_MIN 0.80

/* Pages of the longest context: 1 token to 128k tokens. */
static const long PAGES[] = { 0, 1, 2, 3, 4, 5, 7, 8, 12, 19, 64, 100, 256, 1000, 2048, 8192 };
/* (sequence, kv-head slice) pairs: 1 sequence of 1 kv head to 256 x 8. */
static const long UNITS[] = { 1, 2, 3, 4, 8, 16, 24, 32, 64, 128, 256, 512, 1024, 2048 };
/* Resident blocks: H100 SXM (132 SMs) at 2, 3, 4 blocks per SM, H100 PCIe
 * (114 x 3), 114 x 4, the emulator (2 SMs x 16). */
static const long SLOTS[] = { 264, 396, 528, 342, 456, 32 };

#define N(a) (sizeof(a) / sizeof((a)[0]))

/* The plan before this one: a fixed target of 528 blocks, whatever the
 * device, at least 4 pages per split (rounded up), at most 128 splits. */
static kc_dec_plan old_plan(long pages, long units, long slots)
{
	long n = (528 + units - 1) / units, cap = (pages + 3) / 4;
	cap = cap > 128 ? 128 : cap;
	n = n < cap ? n : cap;
	n = n < 1 ? 1 : n;
	long p = (pages + n - 1) / n;
	p = p < 1 ? 1 : p;
	kc_dec_plan r = { (int) ((pages + p - 1) / p), (int) p, 0 };
	r.splits = r.splits < 1 ? 1 : r.splits;
	r.waves = (r.splits * units + slots - 1) / slots;
	return r;
}

static void test_invariants(void **state)
{
	(void) state;
	for (size_t a = 0; a < N(PAGES); a++)
		for (size_t b = 0; b < N(UNITS); b++)
			for (size_t c = 0; c < N(SLOTS); c++) {
				long pages = PAGES[a], units = UNITS[b], slots = SLOTS[c];
				kc_dec_plan p = kc_dec_plan_make(pages, units, slots);
				assert_true(p.splits >= 1);
				assert_true(p.splits <= KC_DEC_MAX_SPLITS);
				assert_true(p.splits == 1 || p.splits <= pages);
				assert_true(p.splits == 1 || p.pps >= KC_DEC_MIN_PAGES);
				/* every page in a split, no split empty */
				assert_true((long) p.splits * p.pps >= pages);
				assert_true((long) (p.splits - 1) * p.pps < pages || pages == 0);
				assert_int_equal(p.waves, (p.splits * units + slots - 1) / slots);
			}
	/* Degenerate inputs still give one whole split. */
	kc_dec_plan z = kc_dec_plan_make(10, 0, 0);
	assert_int_equal(z.splits, 1);
	assert_int_equal(z.pps, 10);
}

/* Where splits x units can reach a full wave, the plan fills at least
 * FILL_MIN of the block-slot time; on average it beats the old plan. */
static void test_fill(void **state)
{
	(void) state;
	double worst = 2, sum = 0, worst_old = 2, sum_old = 0;
	int n = 0;
	for (size_t a = 0; a < N(PAGES); a++)
		for (size_t b = 0; b < N(UNITS); b++)
			for (size_t c = 0; c < N(SLOTS); c++) {
				long pages = PAGES[a], units = UNITS[b], slots = SLOTS[c];
				long cap = pages / KC_DEC_MIN_PAGES;
				cap = cap > KC_DEC_MAX_SPLITS ? KC_DEC_MAX_SPLITS : cap;
				if (pages < 64 || units * cap < slots)
					continue; /* too little work to fill the GPU */
				kc_dec_plan p = kc_dec_plan_make(pages, units, slots),
					    o = old_plan(pages, units, slots);
				double f = kc_dec_plan_fill(&p, pages, units, slots),
				       g = kc_dec_plan_fill(&o, pages, units, slots);
				if (f < FILL_MIN)
					printf("# pages %ld units %ld slots %ld: %d splits of %d "
					       "pages, %ld waves, fill %.3f\n",
					       pages, units, slots, p.splits, p.pps, p.waves, f);
				assert_true(f >= FILL_MIN);
				worst = f < worst ? f : worst;
				worst_old = g < worst_old ? g : worst_old;
				sum += f, sum_old += g, n++;
			}
	printf("# %d shapes: fill min %.3f mean %.3f (the old plan: min %.3f mean %.3f)\n", n,
	       worst, sum / n, worst_old, sum_old / n);
	assert_true(n > 300);
	assert_true(sum > sum_old);
}

/* Too little work to fill the GPU: as many splits as the page minimum
 * allows, so the blocks that exist all run at once. */
static void test_small(void **state)
{
	(void) state;
	kc_dec_plan p = kc_dec_plan_make(19, 24, 396); /* 3 x 8 kv heads, 300 tokens */
	assert_int_equal(p.splits, 4);
	assert_int_equal(p.pps, 5);
	assert_int_equal(p.waves, 1);
	p = kc_dec_plan_make(5, 1, 396); /* 77 tokens: one split */
	assert_int_equal(p.splits, 1);
	p = kc_dec_plan_make(2048, 1, 396); /* one 32k sequence, 8/1 heads */
	assert_int_equal(p.splits, KC_DEC_MAX_SPLITS);
	assert_int_equal(p.pps, 16);
	/* 32k tokens, 8 kv heads, 132 SMs x 3: one wave of equal splits. */
	p = kc_dec_plan_make(2048, 8, 396);
	assert_int_equal(p.waves, 1);
	assert_true(kc_dec_plan_fill(&p, 2048, 8, 396) > 0.98);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_invariants),
		cmocka_unit_test(test_fill),
		cmocka_unit_test(test_small),
	};
	return cmocka_run_group_tests_name("decode-plan", tests, NULL, NULL);
}
