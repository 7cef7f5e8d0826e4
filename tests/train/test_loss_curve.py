"""train.loss_curve's moving mean (the curve itself needs matplotlib, which only the plots extra installs)."""

import numpy as np

from train.loss_curve import moving_mean


def test_the_moving_mean_averages_the_window_before_each_step():
    values = np.array([4.0, 2.0, 6.0, 0.0, 8.0])
    assert moving_mean(values, 2).tolist() == [4.0, 3.0, 4.0, 3.0, 4.0]
    assert moving_mean(values, 10).tolist() == [4.0, 3.0, 4.0, 3.0, 4.0]
    assert moving_mean(values, 1).tolist() == values.tolist()
