# How CTest checks this experiment (experiments/CMakeLists.txt): the sanitizer build runs --fast (L = 256 synthetic
# heads).
set(experiment_fast sanitize)
