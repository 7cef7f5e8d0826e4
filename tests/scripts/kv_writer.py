"""Second process of the two-process test: attach, allocate, write K/V rows through the
shared buffers, report the slots, and hold the lease until stdin says so."""

import json
import sys

import torch
from kv_common import expected_rows

from memd.attach import MemdSession

address, out_path = sys.argv[1], sys.argv[2]
session = MemdSession(address, "kv-writer")
pools = session.map()
answer = session.alloc(extends=[("w1", 0, 37), ("w2", 0, 5)])
requests = [
    {"rid": r.rid, "row": r.row, "target_slots": list(r.target_slots), "draft_slots": list(r.draft_slots)}
    for r in answer.requests
]
for name, slots, values in expected_rows(pools, requests):
    kv = pools[name]
    kv[:, :, torch.tensor(slots, device=kv.device)] = values.to(kv.device)
if torch.cuda.is_available():
    torch.cuda.synchronize()
with open(out_path, "w") as f:
    json.dump(requests, f)
print("ready", flush=True)
sys.stdin.readline()
session.close()
print("released", flush=True)
