# How CTest checks this experiment (experiments/CMakeLists.txt): the sanitizer build runs --fast (the synthetic K
# heads at L = 128; Part 1 and USE-Lite are the same).
set(experiment_fast sanitize)
