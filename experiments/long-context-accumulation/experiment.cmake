# What `qattn reproduce --list` shows (experiments/CMakeLists.txt).
set(experiment_claim "FA3-FP8's one FP8 wgmma accumulator over the key loop loses a needle at long context (NIAH 91 % \
-> 13 % at 128K); promoting to float32 every N keys restores it")
set(experiment_source "vLLM blog, 2026-04-22")
set(experiment_takes_fast ON)

# How CTest checks this experiment (experiments/CMakeLists.txt): the sanitizer build runs --fast (4K and 16K keys).
set(experiment_fast sanitize)
