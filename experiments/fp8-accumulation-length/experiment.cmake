# What `qattn reproduce --list` shows (experiments/CMakeLists.txt).
set(experiment_claim "FP8 attention's error grows with the key count under one tensor-core accumulator; two-level \
bounds it")
set(experiment_source "SageAttention2 Sec. 3.4; FlashAttention-3 FP8")
set(experiment_takes_fast ON)

# How CTest checks this experiment (experiments/CMakeLists.txt): the sanitizer build runs --fast (L = 1K and 4K).
set(experiment_fast sanitize)
