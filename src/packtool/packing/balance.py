"""A pack order that gives data-parallel ranks similar vision-tower work in each step.

With R data-parallel ranks, the R consecutive packs of a step go one to each rank; a step waits for its
slowest rank, and a rank's vision tower works in proportion to its pack's image tokens. Packs of N tokens
each can differ a lot there: one holds a single long text, the next a dozen images.
``balance_visual_tokens(image_tokens, ranks, seed)`` sorts the packs by their image tokens, cuts the sorted
list into groups of ``ranks`` consecutive packs (each group: similar counts), and orders the groups at
random (``seed``), so that the steps still mix heavy and light work over time. A last, partial group goes
last. ``step_spread`` measures the result: per step, the largest minus the smallest image-token count.
"""

from __future__ import annotations

import numpy as np

from packtool.stats import step_spread as step_spread  # the measure, beside the image statistics


def balance_visual_tokens(image_tokens: np.ndarray, ranks: int, seed: int) -> np.ndarray:
    """A permutation of the packs (for ``PackPlan.permute``) in which every run of ``ranks`` consecutive
    packs (one step) has similar image-token counts.

    >>> order = balance_visual_tokens(np.array([0, 90, 5, 100, 3, 80]), ranks=2, seed=0)
    >>> sorted(order.reshape(-1, 2).tolist())  # the steps: (0, 3), (5, 80), (90, 100) image tokens
    [[0, 4], [1, 3], [2, 5]]
    """
    if ranks < 1:
        raise ValueError(f"ranks must be at least 1, got {ranks}")
    order = np.argsort(np.asarray(image_tokens), kind="stable")
    full = len(order) // ranks * ranks
    groups = order[:full].reshape(-1, ranks)
    shuffled = groups[np.random.default_rng([seed, 0x5649]).permutation(len(groups))].reshape(-1)
    return np.concatenate([shuffled, order[full:]]).astype(np.int64)
