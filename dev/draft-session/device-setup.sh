# On the GPU machine (the last part call of dev/draft-session/prepare: carry the last .gpucache/pN, .whl and
# .gpucache/smoke): the last folder's model part and prompt files (device-part.sh), both checked whole (the model's
# sha256; every file manifest.json lists, by size and sha256), the wheels, the default model converted, then a
# smoke run of generation (SECONDS, start-up included; none with 0) whose answers the full run keeps.
bash dev/draft-session/device-part.sh || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
cat /tmp/smol/part[0-9]* > /tmp/smol/smol.gguf || exit 1  # every part, in order
python3 -c "import hashlib, sys; from modeld.model.fetch_default import GGUF_SHA256 as want
got = hashlib.sha256(open('/tmp/smol/smol.gguf', 'rb').read()).hexdigest()
sys.exit(None if got == want else 'the parts carried so far do not make the model: is a part call missing?')" || whole=no
python3 - <<'PY' || whole=no
import hashlib, json, pathlib, sys
root = pathlib.Path("/tmp/prompts")
if not (root / "manifest.json").is_file():
    sys.exit("/tmp/prompts has no manifest.json: is a part call missing?")
manifest = json.loads((root / "manifest.json").read_text())
wrong = []
for shard in manifest["shards"]:
    path = root / shard["file"]
    if not path.is_file():
        wrong.append(f"{shard['file']} missing")
    elif path.stat().st_size != shard["bytes"] or hashlib.sha256(path.read_bytes()).hexdigest() != shard["sha256"]:
        wrong.append(f"{shard['file']} is not the one manifest.json lists (size or sha256)")
for name, count in manifest["held_out"].items():  # the held-out evaluation sets, one item a line
    path = root / "eval" / f"{name}.jsonl"
    if not path.is_file():
        wrong.append(f"eval/{name}.jsonl missing")
    elif sum(1 for line in path.read_text().splitlines() if line.strip()) != count:
        wrong.append(f"eval/{name}.jsonl has not the {count} items manifest.json lists")
if wrong:
    sys.exit("the prompts carried so far are not the build (is a part call missing?): " + "; ".join(wrong))
print(f"/tmp/prompts: {manifest['prompts']} prompts in {len(manifest['shards'])} shards, as manifest.json lists")
PY
[ "${whole:-}" != no ] || exit 1  # both checked first, so that the messages name all that is missing
python3 -m modeld.model.fetch_default --gguf /tmp/smol/smol.gguf 2>&1 | tail -1
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
mkdir -p /tmp/gen && cp train/data/*/*.npz /tmp/gen/ 2>/dev/null  # the answers of earlier sessions: skipped
[ "${1:-110}" = 0 ] && exit 0  # SECONDS 0: no smoke run (a session that trains on the answers it has)
python3 -m train.generate --prompts .gpucache/smoke --out /tmp/gen --sampling greedy --max-new-tokens 512 \
    --concurrency 256 --time-budget "${1:-110}" 2>&1 | grep -v Loading | tail -5
python3 -m train.stats /tmp/gen
