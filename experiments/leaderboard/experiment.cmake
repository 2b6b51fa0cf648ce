# How CTest checks this experiment (experiments/CMakeLists.txt): the fused kernels and the reference engine give
# the same report.
set(experiment_engine_reference ON)
