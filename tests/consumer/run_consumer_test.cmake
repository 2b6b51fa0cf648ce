# Installs the qattn build at BUILD_DIR into WORK_DIR/prefix, then configures, builds and runs the consumer
# project SOURCE_DIR against it with find_package(qattn). Then the installed command-line program, moved to another
# prefix (WORK_DIR/moved) to show that nothing in it points back at the build or source tree, runs `qattn analyze`
# on its installed sample and `qattn plot` with its installed script, from a directory of its own (WORK_DIR/elsewhere)
# and without QATTN_SHARE_DIR / QATTN_PLOTS_DIR. Only WORK_DIR is written or removed.
file(REMOVE_RECURSE ${WORK_DIR})
function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err WORKING_DIRECTORY ${WORK_DIR})
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer test step failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
  set(step_output "${out}${err}" PARENT_SCOPE)
endfunction()
file(MAKE_DIRECTORY ${WORK_DIR})
step(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
step(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
step(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
step(${WORK_DIR}/build/consumer)
# The worked example of qattn/testing.h (examples/own-index-softmax): a user's kernel property-tested against the
# installed package; it exits 0 only if its correct kernels pass and the harness catches its three deliberate bugs.
if(EXAMPLE_DIR)
  step(${CMAKE_COMMAND} -S ${EXAMPLE_DIR} -B ${WORK_DIR}/example -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
  step(${CMAKE_COMMAND} --build ${WORK_DIR}/example)
  step(${CMAKE_COMMAND} -E env RC_PARAMS=seed=20261124 ${WORK_DIR}/example/own_index_softmax_test)  # a fixed seed: the same cases every run
  foreach(line "ok: the integer kernel is bit-exact to index@paper" "ok: the harness catches the off-by-one index rounding"
               "ok: the harness catches the uint16 row sum that wraps"
               "ok: the harness catches the missing max subtraction" "first difference at index")
    string(FIND "${step_output}" "${line}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "the example's output lacks \"${line}\":\n${step_output}")
    endif()
  endforeach()
endif()

# A user's own method evaluated beside the built-in ones through the installed evaluation layer (qattn::eval,
# examples/own-method-analysis): it exits 0 only if its checks on the sample hold.
if(ANALYSIS_EXAMPLE_DIR)
  step(${CMAKE_COMMAND} -S ${ANALYSIS_EXAMPLE_DIR} -B ${WORK_DIR}/analysis-example -G ${GENERATOR}
       -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
  step(${CMAKE_COMMAND} --build ${WORK_DIR}/analysis-example)
  step(${WORK_DIR}/analysis-example/own_method_analysis ${SAMPLE_DIR})
  foreach(line "topk:k=2" "index@paper" "ok: top-k at k = L_k is the exact softmax")
    string(FIND "${step_output}" "${line}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "the analysis example's output lacks \"${line}\":\n${step_output}")
    endif()
  endforeach()
endif()

if(NOT EXISTS ${WORK_DIR}/prefix/bin/qattn)
  message(STATUS "no qattn program installed (QATTN_BUILD_CLI=OFF): the CLI steps are skipped")
  return()
endif()
file(COPY ${WORK_DIR}/prefix/ DESTINATION ${WORK_DIR}/moved)
file(MAKE_DIRECTORY ${WORK_DIR}/elsewhere)
set(qattn ${CMAKE_COMMAND} -E env --unset=QATTN_SHARE_DIR --unset=QATTN_PLOTS_DIR ${WORK_DIR}/moved/bin/qattn)
function(run_elsewhere)
  execute_process(COMMAND ${qattn} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  WORKING_DIRECTORY ${WORK_DIR}/elsewhere)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "installed qattn ${ARGN} failed (${rc}):\n${out}\n${err}")
  endif()
  set(run_output "${out}${err}" PARENT_SCOPE)
endfunction()
# The --tensors default is the moved prefix's sample, and analyze reads it.
run_elsewhere(analyze --help)
if(NOT run_output MATCHES "${WORK_DIR}/moved/share/qattn/data/use-lite")
  message(FATAL_ERROR "installed qattn's --tensors default is not its own share/qattn:\n${run_output}")
endif()
run_elsewhere(analyze --method fp32 --format csv --out a.csv)
file(READ ${WORK_DIR}/elsewhere/a.csv csv)
if(NOT csv MATCHES "\nall,mean,fp32,")
  message(FATAL_ERROR "installed qattn analyze wrote no summary row:\n${csv}")
endif()
# qattn plot runs the installed script on a sweep's CSV (needs Python with matplotlib, as `qattn plot` does).
run_elsewhere(sweep --method index --grid c=5:1:7 --out s.csv)
run_elsewhere(plot lines s.csv -o s.png --x c --series method)
if(NOT EXISTS ${WORK_DIR}/elsewhere/s.png)
  message(FATAL_ERROR "installed qattn plot wrote no figure")
endif()
message(STATUS "installed qattn: analyze and plot ran from ${WORK_DIR}/elsewhere on its own share/qattn")
