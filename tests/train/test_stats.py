"""train.stats counts the answers and answer tokens of a response folder, multi-turn answers summed, and the tokens
past the second period of a repetition loop."""

from train import responses
from train.stats import count, main


def test_counts_answers_tokens_and_looped_tokens(tmp_path, capsys):
    loop = [9] + [4, 5] * 6  # a 2-token period six times: 8 tokens past its second period
    responses.write_shard(tmp_path / "responses-00000.npz", [({"key": "a#0", "turns": 1}, [[1, 2, 3]]),
                                                             ({"key": "b#0", "turns": 2}, [[4], [5, 6]])])
    responses.write_shard(tmp_path / "responses-00001.npz", [({"key": "c#0", "turns": 1}, [loop])])
    assert count(tmp_path) == (3, 6 + 13, 8)
    assert count(tmp_path, loop_repeats=0) == (3, 19, 12)
    assert main([str(tmp_path)]) == 0
    assert "3 answers, 19 answer tokens (6 per answer; 42.1% past two periods" in capsys.readouterr().out
