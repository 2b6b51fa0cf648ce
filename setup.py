"""The extension qattn._qattn, built by the project's CMake build (pyproject.toml has the package's metadata).

setuptools calls build_ext; this one configures the source tree with CMake (Release, QATTN_PYTHON=ON, no tests) in
setuptools' build directory, builds the target _qattn and copies the module where the wheel takes it from. The
interpreter that runs pip is the one CMake builds for (Python3_EXECUTABLE), so a venv gets a module for its Python.
"""
import glob
import os
import re
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


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
    def build_extension(self, ext):
        for tool in ("cmake",):
            if shutil.which(tool) is None:
                raise RuntimeError(f"setup.py: `{tool}` is not on PATH; install Debian's cmake and ninja-build "
                                   "(scripts/install-deps.sh installs every build dependency)")
        build_dir = os.path.abspath(os.path.join(self.build_temp, "cmake"))
        configure = ["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release", "-DQATTN_PYTHON=ON",
                     "-DQATTN_BUILD_TESTS=OFF", "-DQATTN_BUILD_CLI=OFF", f"-DPython3_EXECUTABLE={sys.executable}"]
        if shutil.which("ninja") and not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            configure += ["-G", "Ninja"]
        subprocess.run(configure, check=True)
        subprocess.run(["cmake", "--build", build_dir, "--target", "_qattn", "--parallel", str(os.cpu_count() or 1)],
                       check=True)
        built = glob.glob(os.path.join(build_dir, "python", "qattn", "_qattn*.so"))
        if len(built) != 1:
            raise RuntimeError(f"setup.py: expected one _qattn module in {build_dir}/python/qattn, found {built}")
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(built[0], dest)


setup(version=project_version(), ext_modules=[CMakeExtension("qattn._qattn")], cmdclass={"build_ext": CMakeBuild})
