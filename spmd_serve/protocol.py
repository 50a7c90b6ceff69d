"""StepPlan: the contract between rank 0 and every other rank, broadcast once per step.

It carries the full per-step inputs (so workers stay stateless): a worker computes exactly what
the plan says and nothing else.  On the wire it is a fixed int64 header (sent with a
non-blocking Ibcast, so idle workers can sleep between polls) followed by one int64 payload
(blocking Bcast) holding the arrays back to back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
F32 = npt.NDArray[np.float32]

RUN, SHUTDOWN = 1, 2
# A plan for the rank's *draft runner* (speculative decoding's second model: draft_model, mtp), not
# its target: the same fields, executed by `worker_loop`'s draft runner on every rank.
RUN_DRAFT = 3
HEADER_LEN = 6  # [kind, step_id, B, T, MB, payload_len]; payload_len also says whether logits_lens follows


@dataclass(frozen=True)
class StepPlan:
    kind: int  # RUN, RUN_DRAFT or SHUTDOWN
    step_id: int  # monotonically increasing, for logs and sanity checks
    input_ids: I64  # [T] int64 token ids of all scheduled tokens, sequence after sequence
    positions: I64  # [T] int64 absolute position of each token in its sequence
    query_lens: I64  # [B] int64 new tokens per sequence (1 for decode)
    ctx_lens: I64  # [B] int64 tokens already in the KV cache per sequence
    block_tables: I64  # [B, MB] int64 block ids; rows padded with 0 (masked by ctx/query lens)
    slot_mapping: I64  # [T] int64 cache slot (block * block_size + offset) of each new token
    # [B] int64 logits rows wanted per sequence: those of its last n tokens (1; 1 + drafts for a
    # speculative step, whose every draft position is scored; a chunk's positions for one scoring its
    # prompt: engine/prompt_logprobs.py).  None: 1 for every sequence.
    logits_lens: I64 | None = None
    # [T, H] float32 hidden rows a draft plan feeds (the MTP draft's `prev_hidden`: RUN_DRAFT only,
    # travelling in the payload as [H, the rows' bytes as int64 words])
    hidden: F32 | None = None
    # the payload this plan's arrays are views of (from_wire), sent as it is: no copy to send
    wire: I64 | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.logits_lens is None:
            object.__setattr__(self, "logits_lens", np.ones(self.query_lens.shape[0], np.int64))

    @property
    def row_lens(self) -> I64:
        """`logits_lens` as an array (never None after construction)."""
        assert self.logits_lens is not None
        return self.logits_lens

    @property
    def speculative(self) -> bool:
        """Some sequence wants more than its last token's logits (it verifies drafts, or scores its prompt)."""
        return bool((self.row_lens != 1).any())

    @property
    def num_rows(self) -> int:
        """Rows of logits the step returns: sum of `logits_lens`."""
        return int(self.row_lens.sum())

    @property
    def num_seqs(self) -> int:
        return int(self.query_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    def header(self) -> I64:
        payload_len = 3 * self.num_tokens + 2 * self.num_seqs + self.block_tables.size
        if self.speculative:
            payload_len += self.num_seqs
        if self.hidden is not None:
            payload_len += 1 + -(-self.hidden.size // 2)
        return np.array(
            [
                self.kind,
                self.step_id,
                self.num_seqs,
                self.num_tokens,
                self.block_tables.shape[1] if self.block_tables.ndim == 2 else 0,
                payload_len,
            ],
            dtype=np.int64,
        )

    def payload(self) -> I64:
        if self.wire is not None:
            return self.wire
        parts = [
            self.input_ids,
            self.positions,
            self.slot_mapping,
            self.query_lens,
            self.ctx_lens,
            self.block_tables.reshape(-1),
        ]
        if self.speculative:  # only speculative steps carry their logits rows (the length says so)
            parts.append(self.row_lens)
        if self.hidden is not None:
            assert self.kind == RUN_DRAFT and not self.speculative, "hidden rows travel in draft plans only"
            rows = np.ascontiguousarray(self.hidden, np.float32).reshape(-1)
            rows = np.concatenate([rows, np.zeros(rows.size % 2, np.float32)])  # whole int64 words
            parts += [np.array([self.hidden.shape[1]], np.int64), rows.view(np.int64)]
        out: I64 = np.concatenate(parts).astype(np.int64, copy=False)
        return out

    def select(self, seqs: I64, block_size: int) -> StepPlan:
        """The sub-plan of sequences `seqs` (indices, in order), with block tables trimmed to the
        blocks those sequences actually reach (ceil((ctx + query) / block_size))."""
        starts = np.concatenate([[0], np.cumsum(self.query_lens)]).astype(np.int64)
        tokens = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in seqs])
        reach = int(((self.ctx_lens[seqs] + self.query_lens[seqs] + block_size - 1) // block_size).max())
        return StepPlan(
            self.kind,
            self.step_id,
            self.input_ids[tokens],
            self.positions[tokens],
            self.query_lens[seqs],
            self.ctx_lens[seqs],
            np.ascontiguousarray(self.block_tables[seqs, :reach]),
            self.slot_mapping[tokens],
            self.row_lens[seqs],
            None if self.hidden is None else self.hidden[tokens],
        )

    @staticmethod
    def shutdown(step_id: int) -> StepPlan:
        e = np.zeros(0, np.int64)
        return StepPlan(SHUTDOWN, step_id, e, e, e, e, np.zeros((0, 0), np.int64), e)

    @staticmethod
    def unpack(header: I64, payload: I64) -> StepPlan:
        kind, step_id, b, t, mb, length = header.tolist()
        hidden_follows = kind == RUN_DRAFT and length > 3 * t + 2 * b + b * mb
        speculative = length == 3 * t + 3 * b + b * mb and b > 0 and not hidden_follows
        return StepPlan.from_wire(kind, step_id, b, t, mb, payload, speculative)

    @staticmethod
    def from_wire(kind: int, step_id: int, b: int, t: int, mb: int, payload: I64, speculative: bool) -> StepPlan:
        """The plan whose arrays are views of `payload` (the layout `payload()` writes): basic
        slices only, which stay cheap on the cold caches between two graph steps."""
        e = 3 * t + 2 * b + b * mb  # where the block tables end
        rest = payload[e:]
        hidden = None
        if kind == RUN_DRAFT and rest.size:  # [H, rows as int64 words]
            h = int(rest[0])
            hidden = rest[1:].view(np.float32)[: t * h].reshape(t, h)
        return StepPlan(
            kind,
            step_id,
            payload[:t],
            payload[t : 2 * t],
            payload[3 * t : 3 * t + b],
            payload[3 * t + b : 3 * t + 2 * b],
            payload[3 * t + 2 * b : e].reshape(b, mb),
            payload[2 * t : 3 * t],
            rest if speculative else None,
            hidden,
            payload,
        )


def split_by_query_len(query_lens: I64) -> list[I64]:
    """Sequence groups to run as separate passes: decodes (1 new token) apart from prefill chunks.

    Attention pads every sequence to the longest query of its pass, so one 512-token chunk next to
    31 decodes would make 31 x 511 padded query rows; two passes cost one extra round of graph
    launches instead.  Deterministic in the plan, so every rank splits identically.
    """
    decode = np.flatnonzero(query_lens == 1)
    prefill = np.flatnonzero(query_lens > 1)
    return [g for g in (decode, prefill) if g.size]


def grid_indices(query_lens: I64) -> tuple[I64, I64, I64]:
    """Derive the attention grid from the plan (every rank computes the same arrays locally).

    Returns pad_index [B, S] (index into T, T = padding), unpad_index [T] (index into B*S) and
    logits_index [B] (index into T of each sequence's last token), with S = max(query_lens).
    """
    b = query_lens.shape[0]
    t = int(query_lens.sum())
    s = int(query_lens.max()) if b else 0
    starts = np.concatenate([[0], np.cumsum(query_lens)[:-1]]).astype(np.int64)  # [B]
    col = np.arange(s, dtype=np.int64)  # [S]
    valid = col[None, :] < query_lens[:, None]  # [B, S]
    pad_index = np.where(valid, starts[:, None] + col[None, :], t)
    unpad_index = (np.arange(b, dtype=np.int64)[:, None] * s + col[None, :])[valid]
    logits_index = starts + query_lens - 1
    return pad_index.astype(np.int64), unpad_index.astype(np.int64), logits_index.astype(np.int64)


def logits_index(query_lens: I64, logits_lens: I64 | None) -> I64:
    """[sum(logits_lens)] index into T of every token whose logits are wanted: the last
    logits_lens[i] tokens of sequence i, in order (plain steps, or None: each sequence's last token)."""
    ends = query_lens.cumsum()  # [B] one past each sequence's last token
    if logits_lens is None or len(logits_lens) == int(logits_lens.sum()):  # (each >= 1) all 1
        return ends - 1
    return np.concatenate([np.arange(e - n, e, dtype=np.int64) for e, n in zip(ends, logits_lens)])
