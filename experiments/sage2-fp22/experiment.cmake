# What `qattn reproduce --list` shows (experiments/CMakeLists.txt).
set(experiment_claim "the FP8 PV accumulator: what an H100 does (A = B = 0 probe, 14-bit wgmma) and what it costs")
set(experiment_source "SageAttention2 Sec. 3.4")
set(experiment_takes_fast ON)

# How CTest checks this experiment (experiments/CMakeLists.txt): the sanitizer build runs --fast (L = 256 synthetic
# heads).
set(experiment_fast sanitize)
