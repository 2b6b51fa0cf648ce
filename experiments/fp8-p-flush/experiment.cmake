# What `qattn reproduce --list` shows (experiments/CMakeLists.txt).
set(experiment_claim "P in (0, 1] cast to E4M3 loses the diffuse mass below the smallest subnormal from the numerator \
while the row sum (LSE) stays exact; pre-scaling P by 2^8 fixes it")
set(experiment_source "flashinfer-ai/flashinfer#5020")

# How CTest checks this experiment (experiments/CMakeLists.txt): every build runs the full experiment (small).
