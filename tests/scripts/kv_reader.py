"""Third process of the two-process test: attach as another session and check that the
shared pools hold exactly the bytes the writer wrote, and that the slot tables agree."""

import json
import sys

import torch
from kv_common import expected_rows

from memd.attach import MemdSession
from protos import memd_pb2


def as_bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


address, in_path = sys.argv[1], sys.argv[2]
with open(in_path) as f:
    requests = json.load(f)
session = MemdSession(address, "kv-reader")
pools = session.map()
checked = 0
for name, slots, values in expected_rows(pools, requests):
    got = pools[name][:, :, torch.tensor(slots, device=pools[name].device)].cpu()
    assert torch.equal(as_bits(got), as_bits(values)), f"{name}: bytes differ at slots {slots[:4]}..."
    checked += got.numel() * got.element_size()
for req in requests:
    n = len(req["target_slots"])
    row = pools["req_to_token"][req["row"], :n].cpu().tolist()
    assert row == req["target_slots"], f"req_to_token row {req['row']} differs"
    mapped = pools["target_to_draft"][torch.tensor(req["target_slots"], device=pools["target_to_draft"].device)]
    assert mapped.cpu().tolist() == req["draft_slots"], "shared mapping differs from the allocation"
    answer = session.stub.Translate(memd_pb2.TranslateRequest(target_slots=req["target_slots"]), timeout=5)
    assert list(answer.draft_slots) == req["draft_slots"], "Translate differs from the allocation"
untouched = pools["target_kv"][:, :, -1].cpu()
assert not untouched.any(), "a slot nobody wrote is not zero"
session.close()
print(f"ok: {checked} bytes read back from {pools['target_kv'].device}", flush=True)
