# How CTest checks this experiment (experiments/CMakeLists.txt): the sanitizer build runs --fast (1K and 4K keys).
set(experiment_fast sanitize)
