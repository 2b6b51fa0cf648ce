# What `qattn reproduce --list` shows (experiments/CMakeLists.txt).
set(experiment_claim "IntAttention against Quant-Only and FP16, where its error comes from, and its 4x finer table")
set(experiment_source "IntAttention Tables 1-3, Sec. 4.3, 4.5, Fig. 5")
set(experiment_takes_fast ON)

# How CTest checks this experiment (experiments/CMakeLists.txt): the sanitizer build runs --fast (shorter synthetic
# heads).
set(experiment_fast sanitize)
