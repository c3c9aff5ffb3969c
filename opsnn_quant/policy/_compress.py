"""The fewest rules, of exact names and subtree globs, that give every module its label.

Module names form a tree by their dots. The candidate rules are an exact name (``exact(n)``,
matching ``n`` only) and a subtree glob ``exact(v) + ".*"`` (``*`` at the root), matching the
proper descendants of node ``v``. Exact rules go first, then the globs in post-order (a subtree's
globs before its root's), so a module resolves to its exact rule, else to the glob of its
nearest ancestor that has one. A dynamic programme over the tree finds the fewest such rules
that resolve every target module to its label, trying at each node "no glob" or a glob of each
label found below it; the caller says which globs are allowed (``glob_ok``: e.g. only within one
modality, and none that would reach a module that must keep its default). Ties go to no glob,
then to the label met first in model order: the same input gives the same rules.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field


def exact(name: str) -> str:
    """A glob that matches ``name`` only (fnmatch metacharacters bracketed)."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def subtree_glob(node: str) -> str:
    """The glob matching every proper descendant of ``node`` (``*`` for the root ``""``)."""
    return "*" if node == "" else f"{exact(node)}.*"


@dataclass
class Placement:
    """One rule of the plan.

    Attributes:
        match: the glob (an exact name or a subtree glob).
        label: the label it gives.
        node: the module (exact rule) or the subtree root (glob) it was placed at.
        glob: True for a subtree glob.
        decides: the target modules that resolve to this rule, in model order.
    """

    match: str
    label: Hashable
    node: str
    glob: bool
    decides: list[str] = field(default_factory=list)


def plan_rules(
    names: Sequence[str],
    targets: Mapping[str, Hashable],
    glob_ok: Callable[[str, Hashable], bool],
) -> list[Placement]:
    """The fewest exact and subtree-glob rules that resolve every target to its label.

    Args:
        names: module names in model order (the targets among them; others are ignored).
        targets: module name -> the label its rule must give.
        glob_ok: whether a glob with a label may be placed at a node (``""`` = the root).

    Returns:
        Exact placements in model order, then globs in post-order (children in model order).
    """
    return _Planner(names, targets, glob_ok).plan()


class _Planner:
    """The dynamic programme of :func:`plan_rules` over the tree of target names."""

    def __init__(
        self,
        names: Sequence[str],
        targets: Mapping[str, Hashable],
        glob_ok: Callable[[str, Hashable], bool],
    ) -> None:
        self.order = {n: i for i, n in enumerate(names)}
        self.targets = targets
        self.glob_ok = glob_ok
        wanted = sorted((n for n in targets if n in self.order), key=self.order.__getitem__)
        self.children = _tree(wanted)
        self.below: dict[str, list[Hashable]] = {}  # labels of targets under a node, first met
        self._collect("")
        self._memo: dict[tuple[str, Hashable], tuple[int, Hashable | None, bool]] = {}
        self.exacts: list[Placement] = []
        self.globs: list[Placement] = []

    def plan(self) -> list[Placement]:
        self._place("", None, None)
        self.exacts.sort(key=lambda p: self.order[p.node])
        for glob in self.globs:
            glob.decides.sort(key=self.order.__getitem__)
        return self.exacts + self.globs

    def _collect(self, node: str) -> list[Hashable]:
        seen: dict[Hashable, None] = {}
        for child in self.children[node]:
            if child in self.targets:
                seen.setdefault(self.targets[child], None)
            for label in self._collect(child):
                seen.setdefault(label, None)
        self.below[node] = list(seen)
        return self.below[node]

    def _best(self, node: str, inherited: Hashable) -> tuple[int, Hashable | None, bool]:
        """(rules needed in the subtree, glob label or None, glob placed) given ``inherited``."""
        key = (node, inherited)
        if key not in self._memo:
            own = 1 if node in self.targets and self.targets[node] != inherited else 0
            options: list[tuple[int, Hashable | None, bool]] = [
                (self._cost_below(node, inherited), None, False)
            ]
            for label in self.below[node]:
                if label != inherited and self.glob_ok(node, label):
                    options.append((1 + self._cost_below(node, label), label, True))
            cost, label, placed = min(options, key=lambda o: o[0])  # first minimum: stable ties
            self._memo[key] = (own + cost, label, placed)
        return self._memo[key]

    def _cost_below(self, node: str, inherited: Hashable) -> int:
        return sum(self._best(c, self._relevant(c, inherited))[0] for c in self.children[node])

    def _relevant(self, node: str, inherited: Hashable) -> Hashable:
        """``inherited``, or None when no target at or under ``node`` wants that label: such a
        glob helps none of them, the same as no glob (this keeps the memo small)."""
        wanted_here = node in self.targets and self.targets[node] == inherited
        return inherited if wanted_here or inherited in self.below[node] else None

    def _place(self, node: str, inherited: Hashable, holder: Placement | None) -> None:
        inherited = self._relevant(node, inherited) if node else inherited
        if holder is not None and inherited != holder.label:
            holder = None
        if node in self.targets:
            if self.targets[node] == inherited and holder is not None:
                holder.decides.append(node)
            else:
                self.exacts.append(Placement(exact(node), self.targets[node], node, False, [node]))
        _, label, placed = self._best(node, inherited)
        if placed:
            glob = Placement(subtree_glob(node), label, node, True)
            for child in self.children[node]:
                self._place(child, label, glob)
            self.globs.append(glob)
        else:
            for child in self.children[node]:
                self._place(child, inherited, holder)


def _tree(names: Sequence[str]) -> dict[str, list[str]]:
    """Node -> its children (model order), over ``names`` and their dotted ancestors."""
    children: dict[str, list[str]] = {"": []}
    for name in names:
        parts = name.split(".")
        parent = ""
        for depth in range(1, len(parts) + 1):
            node = ".".join(parts[:depth])
            if node not in children:
                children[node] = []
                children[parent].append(node)
            parent = node
    return children
