"""The trainer's array plumbing for a cluster pool: joining each node's observations and infos back
into one batch (Dict and Tuple spaces leaf by leaf), as a local pool of the same total size would
return them."""

from __future__ import annotations

from typing import Any

import numpy as np


def concat(parts: list[Any]) -> Any:
    """Batches of observations (one per node) as one batch: leaves concatenated, Dict and Tuple kept."""
    first = parts[0]
    if isinstance(first, dict):
        return {key: concat([part[key] for part in parts]) for key in first}
    if isinstance(first, tuple):
        return tuple(concat([part[i] for part in parts]) for i in range(len(first)))
    return np.concatenate([np.asarray(part) for part in parts])


def merge_infos(parts: list[dict[str, Any]], counts: list[int]) -> dict[str, Any]:
    """Each node's vector infos as one: arrays concatenated; a key that a node lacks gets that node's
    rows filled as gymnasium fills an env without it (zeros, None, or False for a ``_key`` mask)."""
    keys: dict[str, None] = {}
    for part in parts:
        keys.update(dict.fromkeys(part))
    merged: dict[str, Any] = {}
    for key in keys:
        values = [part.get(key) for part in parts]
        sample = next(value for value in values if value is not None)
        if isinstance(sample, dict):
            merged[key] = merge_infos([value if isinstance(value, dict) else {} for value in values], counts)
            continue
        sample = np.asarray(sample)
        merged[key] = np.concatenate(
            [
                np.asarray(value) if value is not None else _blank(key, sample, count)
                for value, count in zip(values, counts)
            ]
        )
    return merged


def _blank(key: str, sample: np.ndarray, count: int) -> np.ndarray:
    if key.startswith("_"):
        return np.zeros(count, np.bool_)
    if sample.dtype == object:
        return np.full(count, None, dtype=object)
    return np.zeros((count, *sample.shape[1:]), sample.dtype)
