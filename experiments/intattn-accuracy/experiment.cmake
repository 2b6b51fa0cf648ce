# How CTest checks this experiment (experiments/CMakeLists.txt): the sanitizer build runs --fast (shorter synthetic
# heads).
set(experiment_fast sanitize)
