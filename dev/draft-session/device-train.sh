# On the GPU machine after device-setup.sh: a schedule sized to SECONDS (train.fit_budget) on every answer in
# /tmp/gen, with the prompts in /tmp/prompts (the part calls brought them); any further arguments go to
# train.fit_budget (for example --layers 4 --init modeld/default_draft --lr 3e-4 to continue the shipped draft;
# --schedule-seconds T for a run that later calls of device-train-more.sh continue on this held machine); the
# bf16 draft comes back in parts ($OUT/draft.safetensors.part-*: cat them).
export PYTHONPATH=/tmp/site:$PWD
bash dev/draft-session/need-setup.sh "${0##*/}" || exit 1
seconds=$1
shift
# A profile of a few steps first (the op table goes to $OUT/train.txt with the whole log): the blocks a second buy
# what the draft is short of, and the profile says where a step's device time goes.
python3 -m train.stats /tmp/gen
python3 -m train.fit_budget --prompts /tmp/prompts --responses /tmp/gen --out /tmp/draft --ckpt /tmp/ckpt.pt \
    --seconds "$seconds" --profile-steps 3 --log-json "$OUT/train_log.json" \
    --continue-args /tmp/train-continue.txt "$@" 2>&1 | grep -v Loading \
    > "$OUT/train.txt"
grep -v '^[-| ]' "$OUT/train.txt" | tail -30
grep -A 22 'profile of' "$OUT/train.txt" | cut -c1-150
split -b 15M /tmp/draft/model.safetensors "$OUT/draft.safetensors.part-" && cp /tmp/draft/config.json "$OUT/draft_config.json"
sha256sum /tmp/draft/model.safetensors
