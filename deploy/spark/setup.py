"""The one thing pyproject.toml cannot say: a wheel that carries the chpart binary
(chpart_spark/bin/chpart, put there by deploy/spark/build-wheel.sh in a copy of this directory)
is tagged for the platform that binary runs on, $CHPART_WHEEL_PLATFORM (build-wheel.sh derives
it from build-portable.sh's glibc floor: manylinux_2_17_x86_64), not py3-none-any, so pip
installs it only where it runs. Without the binary (the editable install of a checkout) the
package stays pure Python and finds chpart elsewhere (_cli.resolve_binary)."""

import os

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
CARRIES_BINARY = os.path.exists(os.path.join(HERE, "chpart_spark", "bin", "chpart"))


class PlatformWheel(bdist_wheel):
    def finalize_options(self):
        super().finalize_options()
        if CARRIES_BINARY:
            self.root_is_pure = False

    def get_tag(self):
        if not CARRIES_BINARY:
            return super().get_tag()
        platform = os.environ.get("CHPART_WHEEL_PLATFORM")
        if not platform:
            raise SystemExit("chpart_spark/bin/chpart is present: set CHPART_WHEEL_PLATFORM (build-wheel.sh does)")
        return "py3", "none", platform


setup(cmdclass={"bdist_wheel": PlatformWheel})
