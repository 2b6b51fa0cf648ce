# What `qattn reproduce --list` shows (experiments/CMakeLists.txt).
set(experiment_claim "granularity, P~/V format and smoothing orderings hold for the worst layer too")
set(experiment_source "SageAttention2 Tables 15-17")
set(experiment_takes_fast ON)

# How CTest checks this experiment (experiments/CMakeLists.txt): the sanitizer build runs --fast (L = 128 synthetic
# heads).
set(experiment_fast sanitize)
