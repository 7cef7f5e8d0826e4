# On the GPU machine after device-setup.sh: the GPU suites with CUDA graphs on (kernels, graph replay,
# device sampling, greedy equals HF, DFLASH on equals off), then the benchmarks: the engine's speed, plain and DFLASH
# as served beside ablations of modeld's tuning (tables in $OUT/engine_speed.md), bench.engine.step_profile at batch
# 1 and 16 ($OUT/profile-b*.txt; about 80 s) and bench.engine.step_span ($OUT/span*.md). Run it after every change to
# the engine's hot path. The suites' whole output: $OUT/suite-*.txt.
# With the argument `model`, the model suite and the shipped draft alone (about 500 s, a call of its own).
# With the argument `suites`, the tests alone (for a change that touches the hot path only a little).
# With `speed`, the benchmarks alone: the second of two calls on one held machine (the whole run passes 600 s).
# With `policy`, DFLASH as served (its speculation policy) against verifying at every step and plain, by batch size.
# With `paired`, DFLASH as served against plain as served in alternating runs (bench.engine.paired_speed: the ratio
# of each pair at batch 1 and 16, greedy and sampled, after one unmeasured run of each; a few minutes): a difference
# of a few percent, beyond one run's noise.
# With `goals`, the engine-speed issue's goal table in one call (about 300 s, after set-up): paired DFLASH/plain at
# 1, 16 and 64, HF beside plain, memd's share over twelve requests, the 8B geometry's MBU and DFLASH cycle.
# With `accept`, on a bare machine (carry .whl only), the one-launch acceptance rule's tests (kernel, device sampling,
# the graphs that run it) and its timing against the torch operations it replaces (bench.kernels.fused --only DFLASH).
# With the argument `dummy`, on a bare machine (carry .whl only: no model parts, no set-up), what needs no real
# weights: the fused kernels' tests, their timing against the launches they replace (with a tile sweep at one row
# and at 16; at 64 and 256 rows, against modeld's unfused path there) and the 8B geometry's batch-1 step profile
# with the norm fusion and without (device time and kernels a step, plain and DFLASH; modeld fuses none of the 8B's
# shapes, so the two should match). With `dummy-speed`, the 8B geometry's engine speed and MBU: plain as served,
# with cuBLAS for few rows, and with the norms unfused (batch 1 decoding every token).
export PYTHONPATH=/tmp/site:$PWD
if [ "${1:-}" = dummy ] || [ "${1:-}" = dummy-speed ] || [ "${1:-}" = accept ]; then  # bare machines
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
if [ "${1:-}" = accept ]; then  # on a bare machine (carry .whl only): the one-launch acceptance rule, in and out of graphs
    python3 -m pytest -q tests/modeld/kernels/test_accept.py tests/modeld/kernels/test_argmax.py tests/modeld/runner/test_device_sampling.py \
        tests/modeld/spec/test_greedy_cycle_gpu.py tests/modeld/spec/test_dummy_draft.py tests/modeld/spec/test_draft_serving.py \
        tests/modeld/runner/test_cuda_graph.py tests/modeld/runner/test_decode_chain.py > "$OUT/suite-accept.txt" 2>&1
    tail -3 "$OUT/suite-accept.txt"
    timeout 60 python3 -m bench.kernels.fused --rows 1,16 --only DFLASH > "$OUT/accept.md" 2>&1; cat "$OUT/accept.md"
    exit 0
fi
if [ "${1:-}" = dummy ]; then
    python3 -m pytest -q tests/modeld/kernels/test_norm_linear.py tests/modeld/kernels/test_norm_qkv_rotary.py \
        tests/modeld/kernels/test_qk_norm_rotary.py tests/modeld/kernels/test_argmax.py > "$OUT/suite-fused.txt" 2>&1
    tail -2 "$OUT/suite-fused.txt"
    # modeld's tiles (FUSED_TILES, ATTENTION_TILES) and 18 others at the rows modeld fuses (1 and 16; about 150 s)
    timeout 240 python3 -m bench.kernels.fused --rows 1,16 --sweep > "$OUT/fused_kernels.md" 2>&1
    grep -v failed "$OUT/fused_kernels.md"
    # more rows than modeld fuses (16) against its path there (norm + cuBLAS): should DFLASH's verify fuse too?
    timeout 120 python3 -m bench.kernels.fused --rows 64,256 > "$OUT/fused_kernels_rows.md" 2>&1
    cat "$OUT/fused_kernels_rows.md"
    for fusion in "" --disable-norm-fusion; do  # about 100 s each: the 8B's dummy weights are built twice
        timeout 150 python3 -m bench.engine.step_profile --target bench/configs/llama3-8b --load-format dummy \
            --draft bench/configs/llama3-8b-draft --batch 1 --new-tokens 32 --rows 25 $fusion \
            > "$OUT/profile-8b$fusion.txt" 2> "$OUT/profile-8b$fusion.log"
        grep -h '###' "$OUT/profile-8b$fusion.txt"
    done
    exit 0
fi
if [ "${1:-}" = dummy-speed ]; then
    timeout 560 python3 -m bench.engine.speed --target bench/configs/llama3-8b --load-format dummy --concurrency 16 \
        --batch1 2 --new-tokens 256 --ignore-eos --skip-hf --rows plain --ablate skinny_linear=false \
        --ablate norm_fusion=false > "$OUT/engine_speed_8b.md" 2> "/tmp/engine_speed_8b.log"
    grep -v "^{" "$OUT/engine_speed_8b.md"  # cut off at 560 s, the rows that ran are in the file
    exit 0
fi
paired() {  # $1: time limit (s), $2: greedy concurrencies; four alternating pairs, sampled at 16
    timeout "$1" python3 -m bench.engine.paired_speed --pairs 4 --concurrency "$2" --sampled-concurrency 16 \
        --ignore-eos > "$OUT/paired.md" 2> /tmp/paired.log || tail -5 /tmp/paired.log
    grep -v '^{' "$OUT/paired.md"
}
if [ "${1:-}" = goals ]; then  # needs the model (parts): the engine-speed issue's goal table in one call (about 300 s)
    paired 200 16,64  # DFLASH as served against plain as served at batch 1, 16 and 64 (about 90 s)
    # HF generate at batch 1 beside plain and DFLASH as served, plain at one step a replay, DFLASH speculating at
    # every size
    timeout 150 python3 -m bench.engine.speed --concurrency 16,64 --batch1 3 --rounds 4 --ignore-eos \
        --ablate plain:steps_per_replay=1 --ablate adaptive_speculation=false \
        > "$OUT/engine_speed.md" 2> /tmp/engine_speed.log || tail -5 /tmp/engine_speed.log
    grep -v '^{' "$OUT/engine_speed.md" | head -12; grep -A14 '^Per-step' "$OUT/engine_speed.md" | grep '^|'
    grep 'DFLASH step / plain step' "$OUT/engine_speed.md"
    # memd's share over twelve requests at batch 1 (three requests let one slow call move it)
    timeout 100 python3 -m bench.engine.speed --concurrency 16 --sampled-concurrency 1 --batch1 12 --rounds 1 \
        --ignore-eos --skip-hf > "$OUT/engine_speed_b12.md" 2> /tmp/engine_speed_b12.log \
        || tail -5 /tmp/engine_speed_b12.log
    grep -A10 '^Per-step' "$OUT/engine_speed_b12.md" | grep '^|'
    # the 8B geometry (dummy weights): MBU at batch 1 and a DFLASH cycle against a plain step (about 95 s)
    timeout 200 python3 -m bench.engine.speed --target bench/configs/llama3-8b --draft bench/configs/llama3-8b-draft \
        --load-format dummy --concurrency 16 --batch1 2 --rounds 2 --new-tokens 256 --ignore-eos --skip-hf \
        --rows plain --ablate steps_per_replay=1 \
        --ablate dflash:adaptive_speculation=false \
        > "$OUT/engine_speed_8b.md" 2> /tmp/engine_speed_8b.log || tail -5 /tmp/engine_speed_8b.log
    grep -h 'MBU at batch 1\|DFLASH step / plain step' "$OUT/engine_speed_8b.md"
    exit 0
fi
if [ "${1:-}" = paired ]; then  # needs the model (parts)
    paired 560 16
    exit 0
fi
if [ "${1:-}" = policy ]; then  # the speculation policy against the fixed settings: needs the model (parts), ~400 s
    # every request decodes 128 tokens (--ignore-eos), so a batch keeps its size to the end: DFLASH as served (the
    # policy), DFLASH verifying at every step and plain as served at each batch size; greedy, then sampled
    timeout 300 python3 -m bench.engine.speed --concurrency 2,4,8,16,32,64 --sampled-concurrency 1,4,16,64 \
        --batch1 2 --rounds 3 --ignore-eos --skip-hf --ablate adaptive_speculation=false \
        > "$OUT/policy.md" 2> /tmp/policy.log
    grep -v '^{' "$OUT/policy.md" | head -12; grep -A6 '^Sampled' "$OUT/policy.md"
    # clients back to back: DFLASH as served against verifying at every step, everything else as served
    timeout 280 python3 -m bench.serving.clients --clients 8,16 > "$OUT/clients.md" 2> /tmp/clients.log
    cat "$OUT/clients.md"
    exit 0
fi
if [ "${1:-}" != speed ]; then  # `device-check.sh speed`: the benchmarks alone, after a `suites` call on this machine
if [ "${1:-}" != model ]; then  # `device-check.sh model`: the model suite and the shipped draft alone
python3 -m pytest -q tests/modeld/kernels tests/memd/test_tables_written.py tests/modeld/runner/test_cuda_graph.py tests/modeld/runner/test_device_sampling.py \
    tests/modeld/spec/test_dummy_draft.py tests/modeld/spec/test_draft_serving.py tests/modeld/spec/test_greedy_cycle_gpu.py \
    tests/modeld/spec/test_draft_attention.py tests/modeld/runner/test_decode_chain.py > "$OUT/suite-kernels.txt" 2>&1; tail -3 "$OUT/suite-kernels.txt"
fi
python3 -m pytest -q tests/modeld/model/test_forward_vs_hf.py tests/e2e/test_generate.py tests/modeld/spec/test_dflash_gpu.py \
    tests/e2e/test_several_steps_gpu.py tests/modeld/runner/test_step_ahead.py -k "cuda or gpu or graph or several" > "$OUT/suite-model.txt" 2>&1; tail -3 "$OUT/suite-model.txt"
python3 -m pytest -q tests/modeld/spec/test_default_draft.py 2>&1 | tail -2  # the shipped draft, lossless (its daemons run on the CPU)
[ "${1:-}" = suites ] || [ "${1:-}" = model ] && exit 0  # `device-check.sh suites`: the suites alone (about half the call), no benchmarks
fi
python3 -m bench.memd.waits --device cuda --batch1 20 --new-tokens 32 > "$OUT/memd_waits.md" 2> "/tmp/memd_waits.log"
cat "$OUT/memd_waits.md"  # 20 admissions at batch 1: what each costs in the engine, and memd's handler time
python3 -m bench.memd.waits --device cuda --batch1 20 --new-tokens 32 --draft modeld/default_draft \
    > "$OUT/memd_waits_dflash.md" 2> "/tmp/memd_waits_dflash.log"
cat "$OUT/memd_waits_dflash.md"  # the same with DFLASH as served (one waited call an admission)
# plain and DFLASH as served, each without the overlap, with the norms unfused and with every prompt chunk beside the
# decodes; plain at several steps a replay from batch 1; DFLASH at one verify step a replay below 16 running, and
# verifying at every step (its speculation policy off)
python3 -m bench.engine.speed --concurrency 16,64 --batch1 3 --ablate overlap_decode=false --ablate norm_fusion=false \
    --ablate alone_prompt_tokens=0 --ablate plain:several_steps_from_batch=1 --ablate several_cycles_from_batch=16 \
    --ablate adaptive_speculation=false > "$OUT/engine_speed.md" 2> "/tmp/engine_speed.log"
grep -v '^{' "$OUT/engine_speed.md" | head -30  # the rest is in the file
# clients sending requests back to back (4, 8, 16): a lone arrival's prompt chunk beside the decodes or alone
# (alone_prompt_tokens), and DFLASH verifying at every step (its speculation policy off)
python3 -m bench.serving.clients > /tmp/clients.md 2> /tmp/clients.log
# where a step's time goes, plain against DFLASH (device-busy against wall time per step; ops by device and host time)
python3 -m bench.engine.step_profile --batch 1 --new-tokens 64 --rows 40 > "$OUT/profile-b1.txt" \
    2> "/tmp/profile-b1.log"
# the overlap's gap: device busy against wall per step with plain decode steps queued ahead (as served) and without
python3 -m bench.engine.step_profile --batch 1 --new-tokens 64 --rows 40 --disable-overlap-decode \
    > "$OUT/profile-b1-apart.txt" 2> "/tmp/profile-b1-apart.log"
python3 -m bench.engine.step_profile --batch 16 --new-tokens 64 --rows 40 > "$OUT/profile-b16.txt" \
    2> "/tmp/profile-b16.log"
grep -h '###' "$OUT"/profile-b*.txt
# a batch-1 step's host parts against the device's span, and what makes a graph's launch slow in the engine (40 s)
python3 -m bench.engine.step_span > "$OUT/span.md" 2> "/tmp/span.log"; cat "$OUT/span.md"
python3 -m bench.engine.step_span --overlap-decode > "$OUT/span-overlap.md" 2> "/tmp/span-overlap.log"
head -8 "$OUT/span-overlap.md"
tail -20 /tmp/clients.md  # last, so that the call's output (its last 12,000 characters) holds them
