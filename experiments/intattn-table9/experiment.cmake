# What `qattn reproduce --list` shows (experiments/CMakeLists.txt).
set(experiment_claim "IndexSoftmax produces no NaN/Inf events (0 of 0 in Table 9's stress test)")
set(experiment_source "IntAttention Table 9")
set(experiment_takes_fast ON)

# How CTest checks this experiment (experiments/CMakeLists.txt): the sanitizer build runs --fast (shorter rows and
# sequences).
set(experiment_fast sanitize)
