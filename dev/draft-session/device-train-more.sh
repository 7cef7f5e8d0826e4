# On the GPU machine, after device-train.sh on the same held machine (its checkpoint is in /tmp): SECONDS more of
# the same run (train_draft --resume with the arguments fit_budget wrote), the schedule's clock going on from the
# checkpoint: a middle call stops part-way, the call that reaches fit_budget's --schedule-seconds ends annealed,
# and with `last` (device-train-more.sh SECONDS last) this call ends the schedule annealed whatever is left of it.
# The bf16 draft comes back in parts ($OUT/draft.safetensors.part-*: cat them) after every call, and the losses of
# every call so far in $OUT/train_log.json.
export PYTHONPATH=/tmp/site:$PWD
[ -f /tmp/ckpt.pt ] && [ -f /tmp/train-continue.txt ] \
    || { echo "no checkpoint of device-train.sh on this machine: a fresh machine cannot continue" >&2; exit 1; }
last=(); [ "${2:-}" = last ] && last=(--schedule-seconds 0)
python3 -m train.train_draft $(cat /tmp/train-continue.txt) --time-budget "$1" "${last[@]}" --log-json "$OUT/train_log.json" \
    2>&1 | grep -v Loading > "$OUT/train.txt"
grep -v '^[-| ]' "$OUT/train.txt" | tail -12
split -b 15M /tmp/draft/model.safetensors "$OUT/draft.safetensors.part-" && cp /tmp/draft/config.json "$OUT/draft_config.json"
sha256sum /tmp/draft/model.safetensors
