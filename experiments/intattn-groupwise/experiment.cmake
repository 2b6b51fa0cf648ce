# What `qattn reproduce --list` shows (experiments/CMakeLists.txt).
set(experiment_claim "per-block scales with group-wise clipping keep the integer pipeline's accuracy")
set(experiment_source "IntAttention Sec. 3.3, Eq. 16-18")
set(experiment_takes_fast ON)

# How CTest checks this experiment (experiments/CMakeLists.txt): the sanitizer build runs --fast (L = 128 synthetic
# heads); the fused kernels (which run every k-group row with per-tensor Q and V) and the reference engine give the
# same report.
set(experiment_fast sanitize)
set(experiment_engine_reference ON)
