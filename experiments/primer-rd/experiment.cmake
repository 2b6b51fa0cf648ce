# What `qattn reproduce --list` shows (experiments/CMakeLists.txt).
set(experiment_claim "rate-distortion of a Gaussian source: D(2) = 0.0625, R(0.1) = 1.66 bits; quantizers lie above")
set(experiment_source "quantization primer (rate-distortion)")
set(experiment_takes_fast ON)

# How CTest checks this experiment (experiments/CMakeLists.txt): the sanitizer build runs --fast (512 tokens).
set(experiment_fast sanitize)
