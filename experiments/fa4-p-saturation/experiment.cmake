# How CTest checks this experiment (experiments/CMakeLists.txt): every build runs the full experiment (small).
