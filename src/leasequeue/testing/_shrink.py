"""Delta debugging: the smallest operation list that still fails.

``ddmin`` is Zeller and Hildebrandt's algorithm: try the list cut into
``n`` chunks, keep a chunk (or a complement) that still fails, refine the
cut when nothing does.  Its result is *1-minimal*: removing any single
operation makes the failure go away.  Every test replays the candidate from
scratch on fresh transports, so the result is exactly reproducible; a budget
counts replayed operations (not seconds), so that shrinking is deterministic
too.
"""

from __future__ import annotations

from typing import Callable, Iterator, List, Sequence, Tuple, TypeVar

__all__ = ["ddmin"]

T = TypeVar("T")


def ddmin(items: Sequence[T], fails: Callable[[List[T]], bool], budget: int) -> Tuple[List[T], bool]:
    """Shrink ``items`` (which must fail) to a 1-minimal failing list.

    ``fails(candidate)`` replays a candidate.  ``budget`` bounds the total
    length of the candidates tried; returns ``(smallest, complete)`` where
    ``complete`` is False when the budget ran out before 1-minimality.
    """
    current = list(items)
    spent = 0
    n = 2
    while len(current) >= 2:
        size = len(current)
        chunks = [current[size * i // n: size * (i + 1) // n] for i in range(n)]
        reduced = False
        for candidate, next_n in _candidates(chunks, n):
            if not candidate:
                continue
            spent += len(candidate)
            if spent > budget:
                return current, False
            if fails(candidate):
                current, n, reduced = candidate, next_n, True
                break
        if not reduced:
            if n >= size:
                break
            n = min(size, 2 * n)
    return current, True


def _candidates(chunks: List[List[T]], n: int) -> Iterator[Tuple[List[T], int]]:
    """Each chunk alone (with n == 2 they are the complements), then each
    complement; with the granularity to continue at."""
    if n > 2:
        for chunk in chunks:
            yield chunk, 2
    for i in range(n):
        yield [x for j, chunk in enumerate(chunks) if j != i for x in chunk], max(n - 1, 2)
