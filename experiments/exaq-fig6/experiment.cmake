# What `qattn reproduce --list` shows (experiments/CMakeLists.txt).
set(experiment_claim "the softmax input's standard deviation mostly lies in [0.9, 3.4] (Table 1's fit range)")
set(experiment_source "EXAQ Fig. 6")

# How CTest checks this experiment (experiments/CMakeLists.txt): its report against expected.txt in every
# native and sanitizer build (statistics of the dumped logits: fast everywhere).
