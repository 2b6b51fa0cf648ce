# What `qattn reproduce --list` shows (experiments/CMakeLists.txt).
set(experiment_claim "Blackwell's tcgen05.mma keeps 25 fraction bits per FP8 step where Hopper's wgmma keeps 13: does \
that remove the long-context accumulation loss, and is two-level accumulation still worth anything?")
set(experiment_source "MMA-Sim (arXiv 2511.10909); vLLM blog, 2026-04-22")
set(experiment_takes_fast ON)

# How CTest checks this experiment (experiments/CMakeLists.txt): the sanitizer build runs --fast (1K and 4K keys).
set(experiment_fast sanitize)
