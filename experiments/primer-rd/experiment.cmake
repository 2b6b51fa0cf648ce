# How CTest checks this experiment (experiments/CMakeLists.txt): the sanitizer build runs --fast (512 tokens).
set(experiment_fast sanitize)
