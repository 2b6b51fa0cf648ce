# What `qattn reproduce --list` shows (experiments/CMakeLists.txt).
set(experiment_claim "clipping and 8-bit normalisation errors grow with L (128 to 16K)")
set(experiment_source "IntAttention, EXAQ, TurboAttention")
set(experiment_takes_fast ON)

# How CTest checks this experiment (experiments/CMakeLists.txt): the sanitizer build runs --fast (8 rows, three
# lengths).
set(experiment_fast sanitize)
