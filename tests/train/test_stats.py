"""train.stats counts the answers and answer tokens of a response folder, multi-turn answers summed, and the tokens
past the second period of a repetition loop."""

from train import responses
from train.stats import count, main


def test_counts_answers_tokens_and_looped_tokens(tmp_path, capsys):
    loop = [9] + [4, 5] * 6  # a 2-token period six times: 8 tokens past its second period, too short to stop
    long_loop = [8] * 100  # 98 past its second period; generation stops it at 64 tokens
    responses.write_shard(
        tmp_path / "responses-00000.npz",
        [({"key": "a#0", "turns": 1}, [[1, 2, 3]]), ({"key": "b#0", "turns": 2}, [[4], [5, 6]])],
    )
    responses.write_shard(
        tmp_path / "responses-00001.npz",
        [({"key": "c#0", "turns": 1}, [loop]), ({"key": "d#0", "turns": 1}, [long_loop])],
    )
    assert count(tmp_path) == (4, 6 + 13 + 100, 8 + 98, 36)
    assert count(tmp_path, loop_repeats=0) == (4, 119, 12 + 100, 36)
    assert main([str(tmp_path)]) == 0
    assert (
        "4 answers, 119 answer tokens (30 per answer; 89.1% past two periods of a repetition loop, 30.3% past where"
        in capsys.readouterr().out
    )
