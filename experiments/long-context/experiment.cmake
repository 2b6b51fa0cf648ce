# How CTest checks this experiment (experiments/CMakeLists.txt): the sanitizer build runs --fast (8 rows, three
# lengths).
set(experiment_fast sanitize)
