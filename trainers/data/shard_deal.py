"""How a split stored as shards is dealt to ranks and loader processes (pure arithmetic, no reading).

A split is read as one stream of samples: its shards one after the other, each in its stored order.
- Training, epoch e: the shards in an order drawn from (seed, e); rank r of R takes stream samples
  [r q, (r + 1) q), q = total // R. Every rank holds q samples, so every rank takes the same number of steps,
  and no sample is read twice; the total mod R (< R) samples at the stream's end are left out, others each
  epoch (trainers.data.sources.train_shard cuts its permutation to a multiple of R alike).
- Validation: the shards in their stored order, rank r the next len(range(r, total, R)) samples, as many as
  trainers.data.sources.eval_shard gives it: the ranks cover the split once between them.
A rank's range is cut into as many equal runs of the stream as it has loader processes (sizes within one
sample); a run is a list of pieces: whole shards, and a part of one at either end. A piece that starts inside
a shard is read from the shard's start, the samples before it read past, not decoded. Given (seed, epoch),
the ranks and the loader processes, the deal is always the same: a resumed run repeats no sample.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qkvsearch.trainers.data.sources import Part


@dataclass(frozen=True)
class Piece:
    """Samples [start, stop) of shard ``shard`` (an index into its split's files), in the shard's order."""

    shard: int
    start: int
    stop: int


def shard_order(shards: int, seed: int, epoch: int) -> list[int]:
    """The training shards in the order epoch ``epoch`` (0-based) reads them, drawn from (seed, epoch)."""
    return [int(i) for i in np.random.default_rng([seed, epoch]).permutation(shards)]


def rank_range(total: int, part: Part) -> tuple[int, int]:
    """[first, stop) of the stream that ``part``'s rank reads."""
    r, world = part.rank, part.world_size
    if part.training:
        q = total // world
        return r * q, (r + 1) * q
    q, extra = divmod(total, world)  # the first ``extra`` ranks hold one more, as range(r, total, world)
    first = r * q + min(r, extra)
    return first, first + q + (r < extra)


def reader_pieces(lengths, part: Part, readers: int, reader: int) -> list[Piece]:
    """The pieces loader process ``reader`` of ``readers`` of ``part``'s rank reads, in order. lengths: samples
    per shard."""
    first, stop = rank_range(sum(lengths), part)
    n = stop - first
    lo, hi = first + n * reader // readers, first + n * (reader + 1) // readers
    order = shard_order(len(lengths), part.seed, part.epoch) if part.training else range(len(lengths))
    return stream_pieces(lengths, order, lo, hi)


def stream_pieces(lengths, order, first: int, stop: int) -> list[Piece]:
    """Stream samples [first, stop) of the shards read in ``order``, as pieces."""
    pieces, at = [], 0
    for shard in order:
        n = lengths[shard]
        lo, hi = max(first - at, 0), min(stop - at, n)
        if lo < hi:
            pieces.append(Piece(shard, lo, hi))
        at += n
        if at >= stop:
            break
    return pieces
