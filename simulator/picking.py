"""The k-th of the fleet's nodes that qualify, in fleet order, without a pass over the fleet.

A straggler is drawn uniformly among the nodes up, not deleted and not straggling already,
in the order the fleet holds them: at 131,072 GPUs for a year that list of 16,640 nodes was
built for each of about 300 draws (5% of the run). A Fenwick tree over the nodes' positions
gives the count and the k-th qualifying one in O(log n), so the same draw picks the same
node as the list did.
"""

from __future__ import annotations


class Qualifying:
    """Positions 0, 1, 2, ... (appended in order), each qualifying or not."""

    def __init__(self) -> None:
        self._flags: list[bool] = []
        self._tree: list[int] = [0]  # 1-based Fenwick tree over the flags, sized to capacity
        self._count = 0

    def __len__(self) -> int:
        return len(self._flags)

    @property
    def count(self) -> int:
        """How many positions qualify."""
        return self._count

    def append(self, qualifies: bool) -> int:
        """A new last position; returns it."""
        at = len(self._flags)
        self._flags.append(False)
        if len(self._flags) >= len(self._tree):
            self._rebuild(2 * len(self._tree))
        self.set(at, qualifies)
        return at

    def set(self, at: int, qualifies: bool) -> None:
        if self._flags[at] is qualifies:
            return
        self._flags[at] = qualifies
        delta = 1 if qualifies else -1
        self._count += delta
        tree, i = self._tree, at + 1
        while i < len(tree):
            tree[i] += delta
            i += i & -i

    def kth(self, k: int) -> int:
        """The position of the ``k``-th qualifying one (0-based, in position order)."""
        if not 0 <= k < self._count:
            raise IndexError(f"{k} of {self._count} qualifying")
        tree, at, left = self._tree, 0, k + 1
        step = 1 << (len(tree) - 1).bit_length()
        while step:
            nxt = at + step
            if nxt < len(tree) and tree[nxt] < left:
                at, left = nxt, left - tree[nxt]
            step >>= 1
        return at  # the tree's 1-based position at + 1 is the 0-based position at

    def _rebuild(self, capacity: int) -> None:
        tree = [0] * capacity
        for i, flag in enumerate(self._flags, start=1):
            if flag:
                tree[i] += 1
        for i in range(1, capacity):  # fold each node into its parent: O(n)
            parent = i + (i & -i)
            if parent < capacity:
                tree[parent] += tree[i]
        self._tree = tree
