"""Packages are found, not listed: each source folder installs under the one import name (pyproject.toml
maps the folders; search/_root is the package root, qkvsearch itself)."""
from setuptools import find_packages, setup

FOLDERS = {"qkvsearch.search": "search", "qkvsearch.spaces": "spaces", "qkvsearch.trainers": "trainers"}

packages = ["qkvsearch", "qkvsearch.reference"]
for name, folder in FOLDERS.items():
    packages += [name] + [f"{name}.{sub}" for sub in find_packages(folder, exclude=["_root", "_root.*"])]

setup(packages=packages)
