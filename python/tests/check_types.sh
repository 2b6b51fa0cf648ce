#!/usr/bin/env bash
# The package's types (CTest python_types), with Debian's mypy:
#   1. mypy on the package's stubs (pyproject.toml [tool.mypy]): no errors
#   2. mypy.stubtest: every public name of qattn and its submodules against the stubs (.pyi), on the built package
#
#   check_types.sh SOURCE_DIR BUILD_PYTHON_DIR
set -euo pipefail
src=$(cd "$1" && pwd)
pkg=$(cd "$2" && pwd)
py=/usr/bin/python3
(cd "$src" && $py -m mypy) || { echo "check_types: mypy found errors in the stubs" >&2; exit 1; }
(cd / && PYTHONPATH="$pkg" $py -m mypy.stubtest --mypy-config-file "$src/python/tests/stubtest.ini" qattn) \
  || { echo "check_types: the stubs and the package differ (mypy.stubtest)" >&2; exit 1; }
echo "check_types: passed"
