# What `qattn reproduce --list` shows (experiments/CMakeLists.txt).
set(experiment_claim "KV-cache quantizers: error vs bits; per-channel K, Hadamard rotation and mixed precision help")
set(experiment_source "KIVI, TurboQuant, SAW-INT4, TurboAttention")
set(experiment_takes_fast ON)

# How CTest checks this experiment (experiments/CMakeLists.txt): every build runs --fast (L = 1024 synthetic
# heads); the full run (L = 4096, about 3 minutes) and its expected.txt are re-checked by hand.
set(experiment_fast always)
