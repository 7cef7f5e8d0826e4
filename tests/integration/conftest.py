"""The stacks the integration tests run against: plain processes always; containers (podman) when
DFLASH_CONTAINER_TESTS=1, which .ci/run sets. There, a missing podman is a failure, not a skip.

The image is built once per test session by scripts/build-images (podman's layer cache makes a second build of
an unchanged tree quick); nothing is kept between sessions but what podman itself keeps."""

import os
import shutil
import subprocess

import pytest

from tests.daemons import REPO
from tests.integration.stacks import ContainerStack, ProcessStack

CONTAINERS = os.environ.get("DFLASH_CONTAINER_TESTS") == "1"


@pytest.fixture(scope="session")
def container_image():
    """The CPU image: DFLASH_IMAGE if given (already built), else built here by scripts/build-images."""
    if not CONTAINERS:
        pytest.skip("container tests run when DFLASH_CONTAINER_TESTS=1 (.ci/run sets it)")
    if shutil.which("podman") is None:
        pytest.fail("DFLASH_CONTAINER_TESTS=1 but podman is not installed")
    if os.environ.get("DFLASH_IMAGE"):
        return os.environ["DFLASH_IMAGE"]
    out = subprocess.run(
        [str(REPO / "scripts" / "build-images"), "--variant", "cpu"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if out.returncode != 0:
        pytest.fail(f"scripts/build-images failed ({out.returncode}):\n{out.stderr[-6000:]}")
    return out.stdout.split()[-1]  # the image id: this session's build, whatever the tag points to later


@pytest.fixture(scope="module", params=["processes", "containers"])
def stack(request, default_model):
    if request.param == "containers":
        image = request.getfixturevalue("container_image")
        s = ContainerStack(image)
    else:
        s = ProcessStack(default_model)
    try:
        try:
            s.start()
        except Exception:
            print(s.logs())
            raise
        yield s
    finally:
        s.close()
