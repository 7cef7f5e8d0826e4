# On the GPU machine after device-setup.sh: SECONDS of self-instruct (the target writes questions over
# train.templates' topics, PER_TOPIC per topic and kind of request), added through the build's hold-out and
# deduplication (train.prompts extend) to the prompt build in /tmp/prompts (the part calls brought it); the
# questions come back in $OUT/self-instruct: keep them in train/data/self-instruct/, which prepare's build reads
# (the same ids).
export PYTHONPATH=/tmp/site:$PWD
bash dev/draft-session/need-setup.sh "${0##*/}" || exit 1
python3 -m train.self_instruct --out /tmp/si --per-topic "${2:-3}" --time-budget "$1" --concurrency 384 --temperature 0.8 \
    2>&1 | grep -v Loading | tail -3
python3 -m train.prompts extend --prompts /tmp/prompts --extra /tmp/si | tail -5
mkdir -p "$OUT/self-instruct" && cp /tmp/si/*.jsonl.gz "$OUT/self-instruct/"
