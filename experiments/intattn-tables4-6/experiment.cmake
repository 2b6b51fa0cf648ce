# What `qattn reproduce --list` shows (experiments/CMakeLists.txt).
set(experiment_claim "IndexSoftmax keeps FP16's accuracy, above EXAQ INT3 and INT2 (softmax replaced alone)")
set(experiment_source "IntAttention Tables 4-6")
set(experiment_takes_fast ON)

# How CTest checks this experiment (experiments/CMakeLists.txt): the sanitizer build runs --fast (shorter synthetic
# heads).
set(experiment_fast sanitize)
