"""Regenerate the Python stubs from the .proto files in this folder.

Run `python -m protos.generate` from the repository root with grpcio-tools
1.84.0 installed (pinned in pyproject's `dev` extra). Stubs made by a newer
grpcio-tools refuse to import on the GPU machine's grpcio 1.84.0, so the
version is checked before anything is written.
"""

import pathlib
import sys

PROTO_DIR = pathlib.Path(__file__).resolve().parent
REQUIRED_TOOLS = "1.84.0"


def generate(out_root: pathlib.Path) -> list[pathlib.Path]:
    import grpc_tools
    from grpc_tools import protoc

    version = grpc_tools.__version__ if hasattr(grpc_tools, "__version__") else None
    if version is None:
        from importlib.metadata import version as dist_version

        version = dist_version("grpcio-tools")
    if version != REQUIRED_TOOLS:
        raise SystemExit(f"grpcio-tools {REQUIRED_TOOLS} is required, found {version}")
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    protos = sorted(PROTO_DIR.glob("*.proto"))
    for proto in protos:
        args = [
            "protoc",
            f"-I{PROTO_DIR.parent}",
            f"-I{include}",
            f"--python_out={out_root}",
            f"--pyi_out={out_root}",
            f"--grpc_python_out={out_root}",
            str(proto.relative_to(PROTO_DIR.parent)),
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {proto.name}")
    return protos


if __name__ == "__main__":
    generate(PROTO_DIR.parent)
    print("stubs written to", PROTO_DIR, file=sys.stderr)
