# What `qattn reproduce --list` shows (experiments/CMakeLists.txt).
set(experiment_claim "IndexSoftmax is stable for b >= 4 and c in [5.5, 7.7], ridge near c = 6.6")
set(experiment_source "IntAttention Fig. 9")
set(experiment_takes_fast ON)

# How CTest checks this experiment (experiments/CMakeLists.txt): the sanitizer build runs --fast (coarser c grid);
# the fused kernels and the reference engine give the same report.
set(experiment_fast sanitize)
set(experiment_engine_reference ON)
