# What `qattn reproduce --list` shows (experiments/CMakeLists.txt).
set(experiment_claim "UINT8 (x255) P beats INT8 (x127) P: CosSim 0.999081 vs 0.996612")
set(experiment_source "IntAttention Table 8")

# How CTest checks this experiment (experiments/CMakeLists.txt): the fused kernels and the reference engine give
# the same report.
set(experiment_engine_reference ON)
