# What `qattn reproduce --list` shows (experiments/CMakeLists.txt).
set(experiment_claim "FP8 with block quantisation and incoherent processing has 2.6x lower RMSE than per-tensor FP8 \
on inputs with outliers (9.1e-3 against 2.4e-2)")
set(experiment_source "FlashAttention-3 Sec. 4.3")
set(experiment_takes_fast ON)

# How CTest checks this experiment (experiments/CMakeLists.txt): the sanitizer build runs --fast (L = 512).
set(experiment_fast sanitize)
