"""Ranking metrics for the recommender adapters (Wide & Deep, DLRM, DCNv2), plain numpy.

`auc` is the rank-based (Mann-Whitney) ROC AUC: tied scores share their average rank, so a tie between a positive
and a negative counts one half. `map_at_k` is the Outbrain click-prediction metric (MAP@12): within each display the
ads are ranked by score, a display scores the average precision at k of its clicked ad(s) (1/rank with one click),
and displays without a click are left out. Equal scores keep the rows' order (a stable sort), so a constant model
scores whatever the row order gives rather than a tie-averaged value.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def auc(scores, labels) -> float:
    """ROC AUC of `scores` for binary `labels` (non-zero = positive); ValueError when only one class is present."""
    scores = np.asarray(scores, dtype=np.float64).ravel()
    positive = np.asarray(labels).ravel() != 0
    if scores.shape != positive.shape:
        raise ValueError(f"scores and labels differ in length: {scores.size} vs {positive.size}")
    n_pos = int(positive.sum())
    n_neg = positive.size - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError("AUC needs both classes in the labels; only one is present")
    ranks = pd.Series(scores).rank(method="average").to_numpy()  # 1-based, ties averaged
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def map_at_k(display_ids, scores, clicked, k: int = 12) -> float:
    """Mean over displays with a click of the average precision at k of the ads ranked by descending score."""
    display = np.asarray(display_ids).ravel()
    scores = np.asarray(scores, dtype=np.float64).ravel()
    clicked = np.asarray(clicked).ravel() != 0
    if not (display.size == scores.size == clicked.size):
        raise ValueError(
            f"display_ids, scores and clicked differ in length: {display.size}, {scores.size}, {clicked.size}"
        )
    n = display.size
    # by display, then score descending, then row order (lexsort's last key is the primary one)
    order = np.lexsort((np.arange(n), -scores, display))
    display, clicked = display[order], clicked[order]
    new_group = np.r_[True, display[1:] != display[:-1]] if n else np.zeros(0, dtype=bool)
    group = np.cumsum(new_group) - 1
    starts = np.flatnonzero(new_group)
    rank = np.arange(n) - starts[group] + 1
    hits = np.cumsum(clicked)
    hits_in_group = hits - (hits[starts] - clicked[starts])[group]  # clicks at or above this rank in its display
    precision = np.where(clicked & (rank <= k), hits_in_group / rank, 0.0)
    ap_sum = np.bincount(group, weights=precision, minlength=starts.size)
    n_clicked = np.bincount(group, weights=clicked, minlength=starts.size)
    has_click = n_clicked > 0
    if not has_click.any():
        raise ValueError("MAP@k needs at least one display with a click")
    return float(np.mean(ap_sum[has_click] / np.minimum(n_clicked[has_click], k)))
