# How CTest checks this experiment (experiments/CMakeLists.txt): the sanitizer build runs --fast (L = 128 synthetic
# heads); the fused kernels (which run every k-group row with per-tensor Q and V) and the reference engine give the
# same report.
set(experiment_fast sanitize)
set(experiment_engine_reference ON)
