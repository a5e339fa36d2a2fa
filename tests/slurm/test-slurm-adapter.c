/* test-slurm-adapter.c — libkiln-slurm (kiln/slurm.h) without a slurmctld:
 * node states as sinfo says them, hostlist expansion through libslurm, the
 * configuration search that keeps slurm_init() from exiting, the step's
 * environment, and the refusals that need no controller.  The calls that
 * talk to slurmctld run against a real one in tests/cluster. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <slurm/slurm.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/macro.h"
#include "kiln/slurm.h"

static void test_states(void **state)
{
	char b[32];
	assert_string_equal(kiln_slurm_state_string(NODE_STATE_IDLE, b, sizeof(b)), "idle");
	assert_string_equal(
		kiln_slurm_state_string(NODE_STATE_IDLE | NODE_STATE_DRAIN, b, sizeof(b)),
		"drained");
	assert_string_equal(
		kiln_slurm_state_string(NODE_STATE_MIXED | NODE_STATE_DRAIN, b, sizeof(b)),
		"draining");
	assert_string_equal(
		kiln_slurm_state_string(NODE_STATE_DOWN | NODE_STATE_DRAIN | NODE_STATE_NO_RESPOND,
					b, sizeof(b)),
		"down*");
	assert_string_equal(
		kiln_slurm_state_string(NODE_STATE_IDLE | NODE_STATE_REBOOT_ISSUED, b, sizeof(b)),
		"rebooting");
	assert_string_equal(
		kiln_slurm_state_string(NODE_STATE_ALLOCATED | NODE_STATE_REBOOT_REQUESTED, b,
					sizeof(b)),
		"reboot-pending");
	assert_string_equal(
		kiln_slurm_state_string(NODE_STATE_IDLE | NODE_STATE_COMPLETING, b, sizeof(b)),
		"completing");
	assert_true(kiln_slurm_state_ok(NODE_STATE_IDLE));
	assert_true(kiln_slurm_state_ok(NODE_STATE_MIXED));
	assert_false(kiln_slurm_state_ok(NODE_STATE_IDLE | NODE_STATE_DRAIN));
	assert_false(kiln_slurm_state_ok(NODE_STATE_IDLE | NODE_STATE_NO_RESPOND));
	assert_false(kiln_slurm_state_ok(NODE_STATE_DOWN));
	assert_true(kiln_slurm_state_drained(NODE_STATE_IDLE | NODE_STATE_DRAIN));
	assert_false(kiln_slurm_state_drained(NODE_STATE_IDLE));
	assert_true(kiln_slurm_state_down(NODE_STATE_DOWN));
	assert_true(kiln_slurm_state_down(NODE_STATE_IDLE | NODE_STATE_NO_RESPOND));
	assert_false(kiln_slurm_state_down(NODE_STATE_IDLE | NODE_STATE_DRAIN));
	assert_true(kiln_slurm_state_rebooting(NODE_STATE_IDLE | NODE_STATE_REBOOT_REQUESTED));
	assert_false(kiln_slurm_state_rebooting(NODE_STATE_IDLE | NODE_STATE_DRAIN));
}

static void test_hostlist(void **state)
{
	char **v = NULL;
	size_t n = 0;
	assert_int_equal(kiln_slurm_hostlist_expand("gpu[01-03],cpu7", &v, &n), 0);
	assert_int_equal(n, 4);
	assert_string_equal(v[0], "gpu01");
	assert_string_equal(v[2], "gpu03");
	assert_string_equal(v[3], "cpu7");
	assert_null(v[4]);
	strv_free(v);
	v = NULL;
	/* an empty list is refused and the outputs are untouched */
	assert_int_equal(kiln_slurm_hostlist_expand("", &v, &n), -EINVAL);
	assert_null(v);
	assert_int_equal(n, 4);
	/* kiln's cap on expansion (libslurm caps one range itself) */
	assert_int_equal(kiln_slurm_hostlist_expand("n[0-40000],m[0-40000]", &v, &n), -E2BIG);
	assert_null(v);
}

static void test_conf_source(void **state)
{
	char buf[320];
	kiln_error e;
	kiln_error_reset(&e, NULL);
	setenv("SLURM_CONF", "/nonexistent/kiln/slurm.conf", 1);
	assert_int_equal(kiln_slurm_conf_source(buf, sizeof(buf)), -ENOENT);
	assert_string_equal(buf, "$SLURM_CONF names /nonexistent/kiln/slurm.conf, which does "
				 "not exist");
	/* without a configuration nothing reaches slurm_init() (which would
	 * exit this test) and the error says what is missing */
	kiln_slurm_nodes *nodes = NULL;
	assert_int_equal(kiln_slurm_nodes_load(NULL, &nodes, &e), -ENOENT);
	assert_null(nodes);
	assert_int_equal(e.code, -ENOENT);
	assert_non_null(strstr(e.msg, "no Slurm configuration ($SLURM_CONF names"));
	assert_int_equal(kiln_slurm_node_drain("n1", "kiln: test", &e), -ENOENT);
	assert_int_equal(kiln_slurm_requeue("12", &e), -ENOENT);
	/* a job id is checked before anything else */
	assert_int_equal(kiln_slurm_requeue("12x", &e), -EINVAL);
	assert_string_equal(e.msg, "'12x' is not a Slurm job id");
	/* $SLURM_CONF naming a file: that is the source */
	setenv("SLURM_CONF", "/dev/null", 1);
	assert_int_equal(kiln_slurm_conf_source(buf, sizeof(buf)), 0);
	assert_string_equal(buf, "/dev/null");
	unsetenv("SLURM_CONF");
}

static void test_env(void **state)
{
	kiln_slurm_env env = { .job_id = "untouched" };
	kiln_error e;
	kiln_error_reset(&e, NULL);
	unsetenv("SLURM_JOB_ID");
	unsetenv("SLURM_JOB_NODELIST");
	unsetenv("SLURM_NODELIST");
	setenv("SLURMD_NODENAME", "n2", 1);
	assert_int_equal(kiln_slurm_env_read(&env, &e), -ENOENT);
	assert_string_equal(env.job_id, "untouched");
	assert_non_null(strstr(e.msg, "SLURM_JOB_NODELIST"));
	setenv("SLURM_JOB_ID", "42", 1);
	setenv("SLURM_NODELIST", "n[1-2]", 1); /* older name, used when the new is unset */
	assert_int_equal(kiln_slurm_env_read(&env, &e), 0);
	assert_string_equal(env.job_id, "42");
	assert_string_equal(env.nodelist, "n[1-2]");
	assert_string_equal(env.node, "n2");
	setenv("SLURM_JOB_NODELIST", "m[1-3]", 1);
	assert_int_equal(kiln_slurm_env_read(&env, &e), 0);
	assert_string_equal(env.nodelist, "m[1-3]");
}

static void test_nodes_find(void **state)
{
	kiln_slurm_node v[] = { { .name = "a" }, { .name = "b", .state = NODE_STATE_IDLE } };
	kiln_slurm_nodes nodes = { .v = v, .n = 2 };
	assert_ptr_equal(kiln_slurm_nodes_find(&nodes, "b"), &v[1]);
	assert_null(kiln_slurm_nodes_find(&nodes, "c"));
	assert_null(kiln_slurm_nodes_find(NULL, "a"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_states),	    cmocka_unit_test(test_hostlist),
		cmocka_unit_test(test_conf_source), cmocka_unit_test(test_env),
		cmocka_unit_test(test_nodes_find),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
