"""Capacity slots of an expert-parallel MoE layer's dispatch: which routed tokens a source rank
sends to which expert, and at which row. Pure array code, the same on torch tensors (on the GPU:
no host synchronization, capturable) and NumPy arrays (the CPU test, ``tests/test_ep_routing.py``).

Drop rule. A source rank walks its routed pairs in order ``p = t · k + j`` (token ``t``, its
``j``-th choice; a token's choices are distinct experts) and gives each pair the next free slot
of its expert. Each (source rank, expert) has ``capacity`` slots: the pairs that find none — the
later tokens in the rank's order — are dropped, and that expert contributes zero to that token.
"""


def _arange_like(a, n):
    """``arange(n)`` of ``a``'s kind (torch on ``a``'s device, or NumPy)."""
    if type(a).__module__.startswith("torch"):
        import torch

        return torch.arange(n, device=a.device)
    import numpy

    return numpy.arange(n)


def assign_slots(topk_ids, experts, capacity):
    """Slots for routed tokens, for one source rank or a batch of them.

    ``topk_ids``: ``[..., T, k]`` integer expert ids (leading dimensions: independent source
    ranks). Returns ``(dest, kept, counts)``:

    - ``dest`` ``[..., T · k]``: row of pair ``p`` in its rank's send block ``[experts · capacity]``
      (expert ``e``'s slots are rows ``e · capacity ..``); ``experts · capacity`` for a dropped pair;
    - ``kept`` ``[..., T · k]`` bool;
    - ``counts`` ``[..., experts]``: kept pairs per expert, ``min(routed, capacity)``.

    Uses a one-hot prefix sum, ``O(T · k · experts)`` memory: fine for an example, a serving
    engine would sort instead.
    """
    shape = topk_ids.shape
    flat = topk_ids.reshape(*shape[:-2], shape[-2] * shape[-1])
    hit = (flat[..., None] == _arange_like(flat, experts)) * 1  # [..., T·k, E] int
    # Earlier pairs of the same expert (an exclusive prefix sum), picked at each pair's expert.
    slot = ((hit.cumsum(-2) - hit) * hit).sum(-1)
    kept = slot < capacity
    counts = (hit * kept[..., None]).sum(-2)
    dest = (flat * capacity + slot) * kept + (experts * capacity) * ~kept
    return dest, kept, counts


def assign_slots_loop(topk_ids, experts, capacity):
    """:func:`assign_slots` for one source rank as a plain loop (nested lists in and out): the
    rule as written in the module's docstring, for tests."""
    used = [0] * experts
    dest, kept = [], []
    for choices in topk_ids:
        for e in choices:
            if used[e] < capacity:
                dest.append(e * capacity + used[e])
                kept.append(True)
                used[e] += 1
            else:
                dest.append(experts * capacity)
                kept.append(False)
    return dest, kept, used
