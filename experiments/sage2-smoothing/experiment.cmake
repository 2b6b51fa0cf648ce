# What `qattn reproduce --list` shows (experiments/CMakeLists.txt).
set(experiment_claim "smoothing K gives entries of mean 0 and variance (N-1)/N sigma^2, a per-token absmax nearer 0 \
and so a smaller quantisation error")
set(experiment_source "SageAttention2 App. A.5, Eqs. 3-7")
set(experiment_takes_fast ON)

# How CTest checks this experiment (experiments/CMakeLists.txt): the sanitizer build runs --fast (the synthetic K
# heads at L = 128; Part 1 and USE-Lite are the same).
set(experiment_fast sanitize)
