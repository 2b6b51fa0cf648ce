# How CTest checks this experiment (experiments/CMakeLists.txt): the sanitizer build runs --fast (the long source at
# L = 512).
set(experiment_fast sanitize)
