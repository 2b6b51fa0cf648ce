# What `qattn reproduce --list` shows (experiments/CMakeLists.txt).
set(experiment_claim "the clipping table C*(sigma) follows from Eq. 14")
set(experiment_source "EXAQ Table 1")
set(experiment_takes_fast ON)
set(experiment_executable qattn_exp_exaq_clipping)

# This experiment is its own program (experiments/CMakeLists.txt): built next to qattn under experiments/, its
# stdout checked against expected.txt. The full run takes ~20 s natively; emulated and sanitizer builds check the
# fast variant against its own output.
set(experiment_program ON)
add_executable(qattn_exp_exaq_clipping ${CMAKE_CURRENT_LIST_DIR}/exaq_clipping.cc)
target_link_libraries(qattn_exp_exaq_clipping PRIVATE qattn)
if(QATTN_BUILD_TESTS)
  if(CMAKE_CROSSCOMPILING OR QATTN_SANITIZE)
    set(exaq_args --fast)
    set(exaq_expected expected-fast.txt)
  else()
    set(exaq_args "")
    set(exaq_expected expected.txt)
  endif()
  add_test(NAME experiment_exaq_clipping
           COMMAND ${CMAKE_COMMAND} -DPROGRAM=$<TARGET_FILE:qattn_exp_exaq_clipping> "-DEMULATOR=${CMAKE_CROSSCOMPILING_EMULATOR}"
                   "-DARGS=${exaq_args}" -DEXPECTED=${CMAKE_CURRENT_LIST_DIR}/${exaq_expected}
                   -P ${CMAKE_CURRENT_SOURCE_DIR}/check_output.cmake)
  set_tests_properties(experiment_exaq_clipping PROPERTIES TIMEOUT 900)
endif()
