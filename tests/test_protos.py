"""The committed stubs are exactly what protos/generate.py makes from the .proto files."""

import filecmp
import pathlib

from protos.generate import PROTO_DIR, generate


def test_stubs_are_regenerated_identically(tmp_path):
    generate(tmp_path)
    made = sorted(p.name for p in (tmp_path / "protos").iterdir())
    assert made == sorted(
        p.name for p in PROTO_DIR.iterdir() if p.name.endswith(("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"))
    )
    for name in made:
        assert filecmp.cmp(tmp_path / "protos" / name, pathlib.Path(PROTO_DIR) / name, shallow=False), name
