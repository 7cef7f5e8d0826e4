"""GPU kernels of modeld (Triton) with plain-torch references that double as the CPU path.

kv_write: store new tokens' K/V rows into a paged pool (direct, translated to draft slots, committed prefix).
attention: causal / sliding-window GQA attention over a paged pool, for decode and extend alike.
"""
