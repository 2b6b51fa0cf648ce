# What `qattn reproduce --list` shows (experiments/CMakeLists.txt).
set(experiment_claim "SAS's cubic is a least-squares fit of e^-x on [0, 1]")
set(experiment_source "TurboAttention Eq. 15")
set(experiment_executable qattn_exp_sas_poly)

# This experiment is its own program (experiments/CMakeLists.txt): built next to qattn under experiments/, its
# stdout checked against expected.txt, natively and under the emulator.
set(experiment_program ON)
add_executable(qattn_exp_sas_poly ${CMAKE_CURRENT_LIST_DIR}/sas_poly.cc)
target_link_libraries(qattn_exp_sas_poly PRIVATE qattn)
if(QATTN_BUILD_TESTS)
  add_test(NAME experiment_sas_poly
           COMMAND ${CMAKE_COMMAND} -DPROGRAM=$<TARGET_FILE:qattn_exp_sas_poly> "-DEMULATOR=${CMAKE_CROSSCOMPILING_EMULATOR}"
                   -DEXPECTED=${CMAKE_CURRENT_LIST_DIR}/expected.txt
                   -P ${CMAKE_CURRENT_SOURCE_DIR}/check_output.cmake)
endif()
