# On the GPU machine after device-setup.sh: SECONDS of generation (engine inproc, modeld or hf) over the prompts in
# /tmp/prompts (the part calls brought them) into /tmp/gen, then the answers packed into $OUT/gen to bring back.
# The pack holds every answer in /tmp/gen, earlier sessions' included: it replaces what train/data/ holds (one
# folder, so that training never reads an answer twice). ShareGPT, self-instruct and chat-like sources go first
# (MT-Bench is chat; the dictionary-style sources outweigh it in the prompt build's order).
export PYTHONPATH=/tmp/site:$PWD
bash dev/draft-session/need-setup.sh "${0##*/}" || exit 1
python3 -m train.generate --prompts /tmp/prompts --out /tmp/gen --engine "${2:-inproc}" --batch 512 --sampling greedy \
    --max-new-tokens 512 --concurrency 384 --time-budget "$1" \
    --sources-first sharegpt,self-instruct,chat-templates,openai-evals,multi-turn,python-code,math-word,shakespeare,manpages,stdlib-docs 2>&1 | grep -v Loading | tail -5
python3 -m train.stats /tmp/gen
python3 -m train.generate pack --src /tmp/gen --out "$OUT/gen" --max-mib 15
