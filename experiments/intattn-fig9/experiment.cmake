# How CTest checks this experiment (experiments/CMakeLists.txt): the sanitizer build runs --fast (coarser c grid);
# the fused kernels and the reference engine give the same report.
set(experiment_fast sanitize)
set(experiment_engine_reference ON)
