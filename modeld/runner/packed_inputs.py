"""The rows of a step's packed inputs: one int64 array [FIELDS, width] that reaches the device in one copy.
Per token: ids, positions, target slots; per request: req_to_token row, first new position, new tokens, K/V length
after the step, first token in the packed ids; then where the DFLASH drafts go in the ids."""

IDS, POSITIONS, SLOTS, ROWS, STARTS, LENS, KV_LENS, INDPTR, DRAFT_AT = range(9)
FIELDS = 9
