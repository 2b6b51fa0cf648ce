# mma-probe is a CUDA program that runs only on a GPU (README.md). Where nvcc is found, the native build compiles it
# (compile only: no test runs it), so that it keeps building; the emulated and sanitizer builds leave it out.
set(experiment_program ON)
find_program(QATTN_NVCC nvcc PATHS /usr/local/cuda/bin NO_CACHE)
if(QATTN_NVCC AND NOT CMAKE_CROSSCOMPILING AND NOT QATTN_SANITIZE)
  set(mma_probe_cuda_root "")
  get_filename_component(mma_probe_cuda_bin ${QATTN_NVCC} DIRECTORY)
  add_custom_command(
    OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/mma-probe
    COMMAND ${QATTN_NVCC} -O2 -std=c++17 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_89,code=sm_89
            -gencode arch=compute_80,code=sm_80 ${CMAKE_CURRENT_LIST_DIR}/mma_probe.cu -lcublasLt
            -o ${CMAKE_CURRENT_BINARY_DIR}/mma-probe
    DEPENDS ${CMAKE_CURRENT_LIST_DIR}/mma_probe.cu
    COMMENT "nvcc: experiments/mma-probe (compile only)")
  add_custom_target(qattn_mma_probe ALL DEPENDS ${CMAKE_CURRENT_BINARY_DIR}/mma-probe)
  message(STATUS "qattn: experiments/mma-probe built with ${QATTN_NVCC} (compile only)")
else()
  message(STATUS "qattn: experiments/mma-probe not built (no nvcc, or an emulated or sanitizer build)")
endif()
