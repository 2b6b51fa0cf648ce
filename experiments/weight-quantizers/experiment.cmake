# What `qattn reproduce --list` shows (experiments/CMakeLists.txt).
set(experiment_claim "GPTQ and AWQ beat RTN on the layer output")
set(experiment_source "GPTQ, AWQ")

# How CTest checks this experiment (experiments/CMakeLists.txt): the fused kernels and the reference engine give
# the same report.
set(experiment_engine_reference ON)
