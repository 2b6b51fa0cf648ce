# What `qattn reproduce --list` shows (experiments/CMakeLists.txt).
set(experiment_claim "Eq. 11's priority picks the 2-bit heads better than other selection rules")
set(experiment_source "TurboAttention Fig. 7b")
set(experiment_takes_fast ON)

# How CTest checks this experiment (experiments/CMakeLists.txt): the sanitizer build runs --fast (L = 128 synthetic
# heads).
set(experiment_fast sanitize)
