"""A byte grammar's tables and its stepper (engine/json_grammar.py builds them from a JSON schema's
nodes): `table[state, byte]` the next state, with DEAD (no way on), POP (a free container closes:
the stack decides what follows) and RESUME (a run of indentation ends: the byte is read again by
the state on the stack's top), and `pushes[state, byte]` the state a free container opened there
returns to once it closes, or the state an indentation run entered there resumes at.  END is the
state after the whole answer: only an EOS may follow it; a grammar may name other states where an
EOS may come too (a regular expression's accepting ones).

A long count (a string's characters up to a large maxLength) is not a state per count: its middle
stretch is one set of *counted* states, and the count itself rides on the stack while the answer is
in them (`far`: each such state's first count, the count it leaves at, and the state it leaves to).
The table cannot tell where in the stretch an answer is, so the stretch ends FAR_WINDOW characters
before anything the count changes: a token of at most FAR_WINDOW bytes read from a counted state
cannot reach it, and the masks (engine/json_masks.py) step longer ones with the stack, as they step
tokens that close a free container.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import numpy as np

DEAD, POP, END, RESUME = 0, 1, 2, 3  # no way on; a free container closes; the answer is whole; re-read
MAX_STATES = 20000  # (int16 tables; a schema of a few dozen properties makes a few thousand)
FAR_WINDOW = 32  # bytes a token may have and still be read by the table alone from a counted state
State = tuple[int, tuple[int, ...]]  # (table state, where each open free container returns to, outermost first)
Name = tuple[Any, ...]  # a state: (kind, its parameters...)
Edges = dict[int, tuple[Name, Name | None]]  # byte -> (next state, the state to return to if it opens a container)
END_NAME: Name = ("end",)
POP_NAME: Name = ("pop",)
RESUME_NAME: Name = ("resume",)
COUNTS: Name = POP_NAME  # an edge's return state out of a counted state: the byte adds one to the count
Counted = Callable[[Name], "tuple[int, int, Name] | None"]  # a counted state: (first count, last + 1, state there)
_SERIALS = itertools.count()
T = TypeVar("T")


class Grammar:
    """The tables of every state reachable from `start`, numbered after DEAD, POP, END and RESUME, with
    `edges(name)` giving a state's bytes."""

    def __init__(
        self,
        edges_of: Callable[[Name], Edges],
        start: Name,
        may_end: Callable[[Name], bool] | None = None,
        counted: Counted | None = None,
        what: str = "this JSON schema",  # (named where it makes too many states)
    ) -> None:
        ids: dict[Name, int] = {("dead",): DEAD, POP_NAME: POP, END_NAME: END, RESUME_NAME: RESUME, start: 4}
        edges: dict[Name, Edges] = {}
        far: dict[Name, tuple[int, int, Name]] = {}
        todo = [start]
        while todo:
            name = todo.pop()
            stretch = counted(name) if counted is not None else None
            edges[name] = edges_of(name)
            if stretch is not None:
                far[name] = stretch
                if stretch[2] not in ids:  # (reached by the stepper alone, where the count leaves the stretch)
                    ids[stretch[2]] = len(ids)
                    todo.append(stretch[2])
            for target, back in edges[name].values():
                for n in (target, back):
                    if n is not None and n not in ids:
                        ids[n] = len(ids)
                        todo.append(n)
                if len(ids) > MAX_STATES:
                    raise ValueError(f"{what} makes more than {MAX_STATES} grammar states")
        # every edge as (flat index state * 256 + byte, target, return state), set in one numpy store
        at, targets, backs = array("q"), array("h"), array("h")
        for name, out in edges.items():
            row = ids[name] * 256
            for b, (target, back) in out.items():
                at.append(row + b)
                targets.append(ids[target])
                backs.append(0 if back is None else ids[back])
        table = np.full(len(ids) * 256, DEAD, np.int16)
        pushes = np.zeros(len(ids) * 256, np.int16)
        idx = np.frombuffer(at, np.int64)
        table[idx] = np.frombuffer(targets, np.int16)
        pushes[idx] = np.frombuffer(backs, np.int16)
        table[POP * 256 : POP * 256 + 256] = POP  # absorbing: a vocabulary walk marks the token for `step`
        self.start: State = (4, ())
        self.ends = frozenset({END} | {ids[name] for name in edges if may_end is not None and may_end(name)})
        self.serial = next(_SERIALS)  # (json_masks' cache key: unlike an id, never reused)
        # flat [state * 256 + byte] arrays: read byte by byte as fast as lists (numpy scalars are ~4x
        # slower), in a quarter of the memory, and made by one copy (rows of lists took half the build);
        # the [state, byte] tables the masks gather from are views of them (not second copies)
        self._t, self._p = array("h", table.tobytes()), array("h", pushes.tobytes())
        self.table = np.frombuffer(self._t, np.int16).reshape(len(ids), 256)
        self.pushes = np.frombuffer(self._p, np.int16).reshape(len(ids), 256)
        self.nbytes = self.table.nbytes + self.pushes.nbytes
        # the states with a way to RESUME (indentation runs): their masks depend on the stack's top
        self.resuming = frozenset(np.flatnonzero((self.table == RESUME).any(axis=1)).tolist())
        # counted state -> (its first count, the count that leaves it, the state at that count)
        self.far = {ids[name]: (first, limit, ids[there]) for name, (first, limit, there) in far.items()}
        self.is_far = np.zeros(len(ids), bool)
        self.is_far[list(self.far)] = True

    def step(self, state: State | None, data: bytes) -> State | None:
        """The state after `data` from `state`, or None where a byte has no way on (None stays None)."""
        if state is None:
            return None
        if self.far:
            return self._step_counted(state, data)
        s, stack = state
        for b in data:
            t = self._t[s * 256 + b]
            if t == RESUME:  # (an indentation run ends: its whitespace state reads the byte)
                if not stack:
                    return None
                s, stack = stack[-1], stack[:-1]
                t = self._t[s * 256 + b]
            if t == DEAD:
                return None
            if t == POP:  # the innermost free container closes: on to where it was opened for
                t, stack = stack[-1], stack[:-1]
            elif self._p[s * 256 + b]:
                stack = (*stack, self._p[s * 256 + b])
            s = t
        return s, stack

    def _step_counted(self, state: State, data: bytes) -> State | None:
        """`step` where some states are counted: the count is the stack's top while in them."""
        s, stack = state
        for b in data:
            i = s * 256 + b
            t = self._t[i]
            if t == RESUME:
                if not stack:
                    return None
                s, stack = stack[-1], stack[:-1]
                i = s * 256 + b
                t = self._t[i]
            if t == DEAD:
                return None
            if t == POP:
                t, stack = stack[-1], stack[:-1]
            elif s not in self.far:
                if self._p[i]:
                    stack = (*stack, self._p[i])
                if t in self.far:  # into a counted stretch, at its first count
                    stack = (*stack, self.far[t][0])
            elif t not in self.far:  # out of the stretch (the string ends)
                stack = stack[:-1]
            elif self._p[i]:  # COUNTS: one more; at the stretch's end, on to the counted states after it
                count = stack[-1] + 1
                _, limit, there = self.far[t]
                t, stack = (there, stack[:-1]) if count == limit else (t, (*stack[:-1], count))
            s = t
        return s, stack

    def may_end(self, state: State | None) -> bool:
        """Whether an EOS may come after `state` (the answer whole, or at an accepting state)."""
        return state is not None and state[0] in self.ends


def complete(state: State | None) -> bool:
    """Whether the answer is one whole value (only an EOS may follow)."""
    return state is not None and state[0] == END


def can_end(ends: Iterable[T], into: Callable[[T], Iterable[T]]) -> set[T]:
    """Every state from which one of `ends` can be reached (`into(s)`: the states with an edge to s):
    those an answer held to an automaton may be in without being stranded."""
    live = set(ends)
    todo = list(live)
    while todo:
        for s in into(todo.pop()):
            if s not in live:
                live.add(s)
                todo.append(s)
    return live


def live_states(
    start: T, steps: Callable[[T], Iterable[T]], accepts: Callable[[T], bool], most: int | None = None, where: str = ""
) -> set[T]:
    """The states reachable from `start` (`steps(s)`: where s leads) from which an accepting one can
    still be reached; ValueError past `most` states, if given (`where` names what made them)."""
    seen, todo, back = {start}, [start], dict[T, list[T]]()
    while todo:
        s = todo.pop()
        for t in steps(s):
            back.setdefault(t, []).append(s)
            if t not in seen:
                if most is not None and len(seen) >= most:
                    raise ValueError(f"{where} makes more than {most} states here")
                seen.add(t)
                todo.append(t)
    return can_end((s for s in seen if accepts(s)), lambda s: back.get(s, ()))
