# How CTest checks this experiment (experiments/CMakeLists.txt): the sanitizer build runs --fast (4K and 16K keys).
set(experiment_fast sanitize)
