# What `qattn reproduce --list` shows (experiments/CMakeLists.txt).
set(experiment_claim "NVFP4 attention (SageAttention3) against FP8 kernels; MXFP4 scaling of Q and K loses to NVFP4's \
(AMD: CosSim 0.969 against 0.997 for FP8 at 75,600 tokens)")
set(experiment_source "SageAttention3 (arXiv 2505.11594); ROCm/aiter#3495")
set(experiment_takes_fast ON)

# How CTest checks this experiment (experiments/CMakeLists.txt): the sanitizer build runs --fast (the long source at
# L = 512).
set(experiment_fast sanitize)
