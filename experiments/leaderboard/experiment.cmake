# What `qattn reproduce --list` shows (experiments/CMakeLists.txt).
set(experiment_claim "every registered method on the same tensors in one table")
set(experiment_source "(none of the papers)")

# How CTest checks this experiment (experiments/CMakeLists.txt): the fused kernels and the reference engine give
# the same report.
set(experiment_engine_reference ON)
