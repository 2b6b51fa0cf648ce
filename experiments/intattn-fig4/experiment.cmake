# What `qattn reproduce --list` shows (experiments/CMakeLists.txt).
set(experiment_claim "a few high logits dominate the softmax normaliser; most contribute negligibly")
set(experiment_source "IntAttention Fig. 4")

# How CTest checks this experiment (experiments/CMakeLists.txt): its report against expected.txt in every
# native and sanitizer build (it reads the dump once and sorts rows: fast everywhere).
