# How CTest checks this experiment (experiments/CMakeLists.txt): its report against expected.txt in every
# native and sanitizer build (statistics of the dumped logits: fast everywhere).
