# How CTest checks this experiment (experiments/CMakeLists.txt): the sanitizer build runs --fast (L = 1K and 4K).
set(experiment_fast sanitize)
