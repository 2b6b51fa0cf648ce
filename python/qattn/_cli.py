"""The command `qattn` that pip installs (pyproject.toml [project.scripts]): the project's program, run unchanged.

pip's build (setup.py) ships the CMake build's program and its data files (the embedded sample, the plot script,
the experiments' inputs) inside the package as _cli_prefix/bin/qattn and _cli_prefix/share/qattn, the layout of an
install prefix, so the program finds its data relative to itself as an installed one does (cli/data_paths.cc).
main() replaces the Python process by the program with the arguments as given: its exit status, signals and
standard streams are the program's own, and `qattn --version` prints the version qattn.__version__ has (both are
CMakeLists.txt's project version). The Python programs it starts (the plot script, `qattn reproduce use-lite-e2e`)
run under this interpreter, the one the package is installed for, unless QATTN_PYTHON names another.
"""
import os
import sys
from typing import List, NoReturn, Optional

PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_cli_prefix", "bin", "qattn")


def main(argv: Optional[List[str]] = None) -> NoReturn:
    """Runs the program with argv (default sys.argv[1:]); never returns. 127 when the package has no program."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not os.access(PROGRAM, os.X_OK):
        sys.stderr.write(f"qattn: no program at {PROGRAM}: `pip install .` builds it into the package; a CMake "
                         "build has it as <build>/qattn and `cmake --install` as <prefix>/bin/qattn\n")
        sys.exit(127)
    if sys.executable:
        os.environ.setdefault("QATTN_PYTHON", sys.executable)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(PROGRAM, ["qattn", *args])


if __name__ == "__main__":
    main()
