# What `qattn reproduce --list` shows (experiments/CMakeLists.txt).
set(experiment_claim "robust to the block sizes (B_r, B_c); FlashQ and SAS each near lossless, their costs add")
set(experiment_source "TurboAttention Tables 3, 4")
set(experiment_takes_fast ON)

# How CTest checks this experiment (experiments/CMakeLists.txt): the sanitizer build runs --fast (L = 128 synthetic
# heads).
set(experiment_fast sanitize)
