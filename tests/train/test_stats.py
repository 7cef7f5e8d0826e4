"""train.stats counts the answers and answer tokens of a response folder, multi-turn answers summed."""

from train import responses
from train.stats import count, main


def test_counts_answers_and_tokens(tmp_path, capsys):
    responses.write_shard(tmp_path / "responses-00000.npz", [({"key": "a#0", "turns": 1}, [[1, 2, 3]]),
                                                             ({"key": "b#0", "turns": 2}, [[4], [5, 6]])])
    responses.write_shard(tmp_path / "responses-00001.npz", [({"key": "c#0", "turns": 1}, [[7, 8]])])
    assert count(tmp_path) == (3, 8)
    assert main([str(tmp_path)]) == 0
    assert "3 answers, 8 answer tokens" in capsys.readouterr().out
