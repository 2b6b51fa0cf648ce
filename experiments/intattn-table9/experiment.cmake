# How CTest checks this experiment (experiments/CMakeLists.txt): the sanitizer build runs --fast (shorter rows and
# sequences).
set(experiment_fast sanitize)
