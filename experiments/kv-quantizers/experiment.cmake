# How CTest checks this experiment (experiments/CMakeLists.txt): every build runs --fast (L = 1024 synthetic
# heads); the full run (L = 4096, about 3 minutes) and its expected.txt are re-checked by hand.
set(experiment_fast always)
