"""A v1 handler over JSON inputs, written like ABEJA's lightfm/movielens predict.py sample
(numpy arrays inside the yielded dict), plus a probe of what each input decodes to."""

import numpy as np

item_labels = np.array(["Star Wars (1977)", "Contact (1997)", "Fargo (1996)", "Scream (1996)"])


def handler(_iter, ctx):
    for iter in _iter:
        if not isinstance(iter, dict):
            kind = type(iter).__name__
            shape = list(iter.shape) if hasattr(iter, "shape") else None
            yield {"type": kind, "shape": shape, "context": ctx}
            continue
        user_id = iter["user_id"]
        scores = np.arange(len(item_labels)) * (1 if user_id % 2 else -1)
        top_items = item_labels[np.argsort(-scores)]
        result = {
            "user_id": user_id,
            "known_positives": item_labels[:1],
            "recommended": top_items[:3],
        }
        yield result
