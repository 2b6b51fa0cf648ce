# What `qattn reproduce --list` shows (experiments/CMakeLists.txt).
set(experiment_claim "Every attention method and KV quantizer swapped into USE-Lite: does the attention-level \
leaderboard predict the sentence-embedding ranking?")
set(experiment_source "qattn (end to end)")
set(experiment_takes_fast ON)

# How CTest checks this experiment: not by the byte comparison of experiments/CMakeLists.txt. Its numbers come from
# NumPy's float32 matmuls, whose last bits depend on the BLAS build and CPU, so python/tests/test_use_lite.py (run by
# the python_package test of a -DQATTN_PYTHON=ON build) runs `qattn reproduce use-lite-e2e --fast` and compares the
# report with expected-fast.txt within stated tolerances.
set(experiment_program ON)
