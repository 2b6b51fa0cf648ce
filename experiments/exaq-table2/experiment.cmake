# What `qattn reproduce --list` shows (experiments/CMakeLists.txt).
set(experiment_claim "EXAQ's sigma clip far above NAIVE quantisation at 2 and 3 bits")
set(experiment_source "EXAQ Table 2")
set(experiment_takes_fast ON)

# How CTest checks this experiment (experiments/CMakeLists.txt): the sanitizer build runs --fast (shorter synthetic
# heads).
set(experiment_fast sanitize)
