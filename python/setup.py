"""Installs the tinyacc package and builds libtinyacc.so with `go build`.

    pip install --no-build-isolation ./python

needs Go on PATH (or TINYACC_GO) and the tinyacc repository around this
folder; it works offline once the Go modules are in the module cache.
"""

import os
import subprocess

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def build_library(dest_dir):
    """Runs go build -buildmode=c-shared into dest_dir/libtinyacc.so."""
    go = os.environ.get("TINYACC_GO", "go")
    dest_dir = os.path.abspath(dest_dir)  # go build runs in the repository root
    out = os.path.join(dest_dir, "libtinyacc.so")
    os.makedirs(dest_dir, exist_ok=True)
    cmd = [go, "build", "-buildmode=c-shared", "-o", out, "./capi"]
    try:
        subprocess.check_call(cmd, cwd=REPO)
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit("tinyacc: building libtinyacc.so failed (%s): run `%s` in %s to see why; "
                         "Go must be installed (or set TINYACC_GO)" % (e, " ".join(cmd), REPO))
    header = os.path.join(dest_dir, "libtinyacc.h")  # cgo's, not the documented one
    if os.path.exists(header):
        os.remove(header)
    return out


class BuildPyWithLibrary(build_py):
    """build_py that also compiles the Go library into the package."""

    def run(self):
        super().run()
        build_library(os.path.join(self.build_lib, "tinyacc"))


class BinaryDistribution(Distribution):
    """The package carries a native library: wheels are platform-specific."""

    def has_ext_modules(self):
        return True


setup(
    name="tinyacc",
    version="0.1.0",
    description="Python bindings of tinyacc, a training engine for GPT models",
    packages=["tinyacc"],
    python_requires=">=3.8",
    cmdclass={"build_py": BuildPyWithLibrary},
    distclass=BinaryDistribution,
    zip_safe=False,
)
