# What `qattn reproduce --list` shows (experiments/CMakeLists.txt).
set(experiment_claim "FA4's FP8 P with max_offset 8 and rescale_threshold 4 saturates E4M3 (P~ up to 2^12 > 448); \
decode CosSim 0.9987 at 127 keys, 0.863 at 128; fixed by max_offset + threshold <= log2 448")
set(experiment_source "Dao-AILab/flash-attention#2577")

# How CTest checks this experiment (experiments/CMakeLists.txt): every build runs the full experiment (small).
