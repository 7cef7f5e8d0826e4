# On the GPU machine: the new draft against the shipped one on the held-out MT-Bench turns, in one
# bench.draft.accept run (one memd, one no-draft baseline; tables in $OUT), then the losslessness tests with the new
# draft in modeld/default_draft (on this copy only).
export PYTHONPATH=/tmp/site:$PWD
bash dev/draft-session/need-setup.sh "${0##*/}" || exit 1
python3 -m bench.draft.accept --prompts /tmp/prompts/eval/mtbench.jsonl --draft /tmp/draft --blocks 8,16 \
    --baseline modeld/default_draft > "$OUT/accept.md" 2> "$OUT/accept.log"; cat "$OUT/accept.md"
cp /tmp/draft/* modeld/default_draft/ \
    && python3 -m pytest -q -x tests/modeld/spec/test_default_draft.py tests/e2e/test_prefix_cache_e2e.py 2>&1 | tail -3
