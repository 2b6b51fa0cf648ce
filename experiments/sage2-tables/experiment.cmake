# What `qattn reproduce --list` shows (experiments/CMakeLists.txt).
set(experiment_claim "orderings of the smoothing, granularity, P/V format and smooth-V ablations")
set(experiment_source "SageAttention2 Tables 4, 6, 7, 10")
set(experiment_takes_fast ON)

# How CTest checks this experiment (experiments/CMakeLists.txt): the sanitizer build runs --fast (L = 128 synthetic
# heads).
set(experiment_fast sanitize)
