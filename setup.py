"""Maps the repository's top-level layer folders into the one import name ``trimq`` (``broker/`` installs as
``trimq.broker``, ...). Everything else about the distribution is in pyproject.toml."""

from setuptools import find_packages, setup

# Each folder here is one layer of trimq; a new layer gets a folder of its own and a line here.
LAYERS = ["protocol", "runtime", "namesrv", "broker", "client", "spark_jobs", "tools", "testing", "demo"]

package_dir = {"trimq": "trimq"}
packages = ["trimq"]
for layer in LAYERS:
    package_dir[f"trimq.{layer}"] = layer
    packages += [f"trimq.{layer}"] + [f"trimq.{layer}.{sub}" for sub in find_packages(layer)]

setup(packages=packages, package_dir=package_dir)
