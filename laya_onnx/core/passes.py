"""The forward passes of one call: which encoded rows run together, in what order.

A call's states are encoded first (each into one or more rows); the rows are then cut into
passes, each a list of (state index, row index): laya's chunks of `batch_size` states when the
caller gives one, else length buckets of similar rows, and every pass then split (rows in order)
where its estimated memory would exceed the pass budget (`laya_onnx.core.memory`).
"""

from __future__ import annotations

from typing import Any

from laya_onnx.core.memory import PassMemoryModel, split_rows

#: When sorting by length, states are sorted within windows of this many batches (laya's rule).
SORT_WINDOW_BATCHES = 8
#: Rows per length bucket of a `predict_batch` without `batch_size`: short rows stop paying for the
#: longest one's padding, and a bucket stays large enough to keep the GEMMs efficient.
DEFAULT_BUCKET_ROWS = 16

#: (state index, row index) of one encoded row.
Ref = tuple[int, int]


def plan_passes(
    encoded: list[list[Any]],
    batch_size: int | None,
    sort_by_length: bool,
    *,
    bucket_rows: int,
    memory_model: PassMemoryModel,
    max_pass_memory: int,
) -> list[list[Ref]]:
    """The forward passes of one call over `encoded` (each state's rows), each a list of refs.

    With an explicit `batch_size`, chunking follows laya exactly: one chunk per
    `batch_size` states, sorted by length only with a chunk smaller than the input, within
    windows of 8 chunks. Without one, a call of more than `bucket_rows` rows is run in
    length buckets: every row sorted by length and cut into passes of `bucket_rows`, so
    short rows are not padded to the longest (answers move only in the last float bits,
    within the parity rule; laya runs one pass). Either way a pass whose estimated memory
    exceeds the budget is then cut (rows in order) into passes that fit.
    """
    n_rows = sum(len(rows) for rows in encoded)
    if not batch_size and n_rows <= bucket_rows:
        longest = max(len(r.ids) for rows in encoded for r in rows)
        if memory_model.estimate(n_rows, longest) <= max_pass_memory:
            # One pass in call order, what the general path below gives such a call, cheaply.
            return [[(i, j) for i, rows in enumerate(encoded) for j in range(len(rows))]]
    chunks: list[list[Ref]]
    if not batch_size and bucket_rows and n_rows > bucket_rows:
        refs = sorted(
            ((i, j) for i, rows in enumerate(encoded) for j in range(len(rows))),
            key=lambda ref: len(encoded[ref[0]][ref[1]].ids),
        )
        chunks = [refs[start : start + bucket_rows] for start in range(0, n_rows, bucket_rows)]
    else:
        chunks = laya_chunks(encoded, batch_size, sort_by_length)
    passes: list[list[Ref]] = []
    for refs in chunks:
        lengths = [len(encoded[i][j].ids) for i, j in refs]
        for piece in split_rows(lengths, memory_model, max_pass_memory):
            passes.append(refs[piece.start : piece.stop])
    return passes


def laya_chunks(encoded: list[list[Any]], batch_size: int | None, sort_by_length: bool) -> list[list[Ref]]:
    """laya's chunks: `batch_size` states each (all of them without one), with `sort_by_length`
    sorted by their longest row within windows of SORT_WINDOW_BATCHES chunks."""
    chunk = batch_size if (batch_size and batch_size > 0) else len(encoded)
    reorder = sort_by_length and 1 < chunk < len(encoded)
    window = chunk * SORT_WINDOW_BATCHES if reorder else chunk
    chunks: list[list[Ref]] = []
    for start in range(0, len(encoded), window):
        order = list(range(start, min(start + window, len(encoded))))
        if reorder:
            order.sort(key=lambda i: max(len(r.ids) for r in encoded[i]))
        for offset in range(0, len(order), chunk):
            chunks.append([(i, j) for i in order[offset : offset + chunk] for j in range(len(encoded[i]))])
    return chunks
