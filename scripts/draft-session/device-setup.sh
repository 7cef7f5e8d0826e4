# On the GPU machine (call 3 of scripts/draft-session/prepare): the wheels, the default model converted, then a
# smoke run of generation (SECONDS, start-up included) whose answers the full run keeps.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
cp .gpucache/p*/part* /tmp/smol/ && cat /tmp/smol/part[0-9]* > /tmp/smol/smol.gguf || exit 1  # every part, in order
python3 -c "import hashlib; from modeld.fetch_default import GGUF_SHA256 as want
got = hashlib.sha256(open('/tmp/smol/smol.gguf', 'rb').read()).hexdigest()
assert got == want, 'the parts carried so far do not make the model: is a part call missing?'" || exit 1
python3 -m modeld.fetch_default --gguf /tmp/smol/smol.gguf 2>&1 | tail -1
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
mkdir -p /tmp/gen && cp train/data/*/*.npz /tmp/gen/ 2>/dev/null  # the answers of earlier sessions: skipped
python3 -m train.generate --prompts .gpucache/smoke --out /tmp/gen --sampling greedy --max-new-tokens 512 \
    --concurrency 256 --time-budget "${1:-110}" 2>&1 | grep -v Loading | tail -5
python3 -m train.stats /tmp/gen
