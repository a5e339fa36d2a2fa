# tests/lint/: checks of the tree itself that `make lint` runs and `make
# test` repeats: the folder layering (mk/check-includes.py).
TEST_SCRIPTS += tests/lint/test-check-includes.sh
