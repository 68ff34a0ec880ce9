"""pip install --no-build-isolation .   (or -e .)

Builds the torch-free planner module hybridplan._C with CMake (the same build as `make build`,
Python bindings only) and installs the pure-Python package from python/hybridplan. Use
--no-build-isolation so pip reuses the installed torch==2.13.0 CPU wheel instead of fetching one.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = ROOT / "build-setuptools"
        subprocess.check_call([
            "cmake", "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja",
            "-DHYBRIDPLAN_WITH_TORCH=OFF", "-DHYBRIDPLAN_BUILD_TESTS=OFF",
            "-DHYBRIDPLAN_BUILD_PYTHON=ON", f"-DPython3_EXECUTABLE={sys.executable}",
        ])
        subprocess.check_call(["cmake", "--build", str(build_dir), "--target", "_C", "hybridplan",
                               "-j", str(os.cpu_count() or 1)])
        built = next((ROOT / "python" / "hybridplan").glob("_C*.so"))
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, target)


setup(
    name="hybridplan",
    version="0.1.0",
    description="Plan and apply hybrid data-parallel x model-parallel training for PyTorch",
    package_dir={"": "python"},
    packages=["hybridplan"],
    ext_modules=[CMakeExtension("hybridplan._C")],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.10",
    install_requires=["torch==2.13.0", "tqdm", "matplotlib"],
    entry_points={"console_scripts": ["hybridplan-py=hybridplan.__main__:main"]},
)
