"""The package qattn, built by the project's CMake build (pyproject.toml has the package's metadata).

setuptools calls build_ext; this one configures the source tree with CMake (Release, QATTN_PYTHON=ON, the program
qattn, no tests) in build-pyXY/ at the top of the tree (XY the interpreter's version; ignored by git as the other
build directories are, and at their depth, so that a compiler cache such as ccache with base_dir at the tree's root
reuses their objects) and builds two targets: the extension _qattn, copied where the wheel
takes it from, and the program qattn. `cmake --install` puts the program and its data files (the embedded sample,
the plot script, the experiments' inputs) under a staging prefix, whose bin/qattn and share/qattn become the
package's qattn/_cli_prefix/: the layout of an install prefix, so the program finds its data relative to itself as
an installed one does (cli/data_paths.cc), and the console script `qattn` (qattn._cli) runs it. The interpreter
that runs pip is the one CMake builds for (Python3_EXECUTABLE), so a venv gets a module for its Python.

Each of the four phases prints one line (with the seconds since the build began), then CMake's and Ninja's own
output, "[n/m]" per compiled file. pip shows them with `pip install -v`; without -v it shows only "Building wheel for
qattn (pyproject.toml)" and a spinner (on a terminal) or "still running..." at most once a minute (otherwise).
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import time

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
CLI_PREFIX = "_cli_prefix"  # qattn/_cli_prefix/{bin/qattn, share/qattn/...}; qattn/_cli.py reads the same name


def project_version():
    with open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
        m = re.search(r"project\(qattn\s+VERSION\s+([0-9.]+)", f.read())
    if not m:
        raise RuntimeError("setup.py: CMakeLists.txt has no project(qattn VERSION x.y.z)")
    return m.group(1)


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def phase(self, what):
        """One line per phase on stdout, flushed ahead of the child's output that pip interleaves with it."""
        print(f"setup.py [{time.monotonic() - self.start:.0f} s]: {what}", flush=True)

    def run_step(self, command):
        print("setup.py: $ " + " ".join(command), flush=True)
        subprocess.run(command, check=True)

    def build_extension(self, ext):
        self.start = time.monotonic()
        for tool in ("cmake",):
            if shutil.which(tool) is None:
                raise RuntimeError(f"setup.py: `{tool}` is not on PATH; install Debian's cmake and ninja-build "
                                   "(scripts/install-deps.sh installs every build dependency)")
        build_dir = os.path.join(ROOT, f"build-py{sys.version_info.major}{sys.version_info.minor}")
        staging = os.path.abspath(os.path.join(self.build_temp, "cmake-install"))
        jobs = str(os.cpu_count() or 1)
        configure = ["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release", "-DQATTN_PYTHON=ON",
                     "-DQATTN_BUILD_TESTS=OFF", "-DQATTN_BUILD_CLI=ON", f"-DPython3_EXECUTABLE={sys.executable}"]
        if shutil.which("ninja") and not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            configure += ["-G", "Ninja"]
        self.phase(f"1/4 configuring the project with CMake in {build_dir}")
        self.run_step(configure)
        self.phase(f"2/4 building the extension _qattn and the library under it ({jobs} jobs)")
        self.run_step(["cmake", "--build", build_dir, "--target", "_qattn", "--parallel", jobs])
        self.phase(f"3/4 building the program qattn ({jobs} jobs)")
        self.run_step(["cmake", "--build", build_dir, "--target", "qattn_cli", "--parallel", jobs])

        self.phase(f"4/4 installing the program and its data files under {staging}, copying them into the package")
        shutil.rmtree(staging, ignore_errors=True)
        self.run_step(["cmake", "--install", build_dir, "--prefix", staging])
        built = glob.glob(os.path.join(build_dir, "python", "qattn", "_qattn*.so"))
        if len(built) != 1:
            raise RuntimeError(f"setup.py: expected one _qattn module in {build_dir}/python/qattn, found {built}")
        dest = self.get_ext_fullpath(ext.name)
        package = os.path.dirname(dest)
        os.makedirs(package, exist_ok=True)
        shutil.copyfile(built[0], dest)
        prefix = os.path.join(package, CLI_PREFIX)
        shutil.rmtree(prefix, ignore_errors=True)
        os.makedirs(os.path.join(prefix, "bin"))
        shutil.copy2(os.path.join(staging, "bin", "qattn"), os.path.join(prefix, "bin", "qattn"))
        shutil.copytree(os.path.join(staging, "share", "qattn"), os.path.join(prefix, "share", "qattn"))
        self.phase(f"done: {dest} and {prefix}")

    def get_outputs(self):
        """The extension and every file under _cli_prefix (setup.py install --record lists them)."""
        outputs = super().get_outputs()
        for ext in self.extensions:
            prefix = os.path.join(os.path.dirname(self.get_ext_fullpath(ext.name)), CLI_PREFIX)
            outputs += [os.path.join(d, f) for d, _, files in os.walk(prefix) for f in files]
        return outputs


setup(version=project_version(), ext_modules=[CMakeExtension("qattn._qattn")], cmdclass={"build_ext": CMakeBuild})
