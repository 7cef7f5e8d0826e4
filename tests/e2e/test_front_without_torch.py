"""modeld's gRPC front imports neither torch nor the model code (modeld.engine.build, the engine process's): its
modules import without them, and a front that served a generate call (with the engine's tokenizer, text and all)
has no libtorch mapped; memd's pools end free."""

import pathlib
import subprocess
import sys

import pytest

import client
from tests.daemons import run_memd, run_modeld

MEMD_ARGS = [
    "--page-size",
    "1",
    "--max-running-requests",
    "2",
    "--max-total-tokens",
    "2048",
    "--draft-model",
    "none",
    "--kv-cache-dtype",
    "float32",
    "--strict",
]
HEAVY = ("torch", "transformers", "triton", "cupy")


def test_the_fronts_modules_import_without_torch():
    code = (
        "import sys, modeld.front.server, modeld.front.service, modeld.engine.process, memd.attach; "
        f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=pathlib.Path(__file__).parents[2]
    ).stdout.split()
    assert loaded == []


@pytest.mark.skipif(not pathlib.Path("/proc/self/maps").exists(), reason="reads the front's mappings from /proc")
def test_a_front_that_served_a_request_has_no_torch_loaded(default_model):
    with (
        run_memd(default_model, *MEMD_ARGS) as memd,
        run_modeld(memd, "--target-model", str(default_model)) as modeld,
        client.Client(modeld.address, timeout=60) as c,
    ):
        result = c.generate("Say hello.", max_new_tokens=4, temperature=0)
        assert result.output_ids and result.text
        maps = pathlib.Path(f"/proc/{modeld.pid}/maps").read_text()
        assert "libtorch" not in maps, "the front loaded torch"
        memd.wait_idle()
