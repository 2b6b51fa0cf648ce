# How CTest checks this experiment (experiments/CMakeLists.txt): its report against expected.txt in every
# native and sanitizer build (it reads the dump once and sorts rows: fast everywhere).
