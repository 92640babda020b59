"""What tensor parallelism refuses, as pure functions of the config: each returns the first
problem as one line "<key>=<value>: <what is allowed>" or None. No processes, no torch.

Which sizes tp splits (tensor.py, the models' tp_plan):
- mlp: hidden (column then row pairs split the features);
- gpt: heads (attention by heads, so hidden too), the MLP's 4 x hidden, vocab (the
  vocabulary-parallel embedding and LM head);
- hf: heads, ffn (the MLP's intermediate size), vocab; kv_heads split where tp divides them,
  replicated where tp is a multiple of them, refused otherwise (a rank's query heads would
  need parts of two KV heads).
sequence_parallel shards the sequence between the TP collectives: model.seq must divide by
tp, and tp must be > 1; model=mlp has no sequence and refuses it.
"""

from __future__ import annotations

from typing import Any


def _divides(key: str, value: int, tp: int, what: str = "") -> str | None:
    if value % tp:
        return f"{key}={value}: tp={tp} must divide it{what} (allowed: a multiple of {tp})"
    return None


def tp_problem(model: Any, tp: int, sequence_parallel: bool = False) -> str | None:
    """The first thing wrong with running `model` (a ModelConfig: name, hidden, heads, ...) at
    tensor-parallel degree `tp`, with or without sequence parallelism; None if nothing."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        return f"tp={tp!r}: must be an integer >= 1"
    name = getattr(model, "name", None)
    if sequence_parallel and (tp == 1 or name == "mlp"):
        return sequence_parallel_problem(tp, None)
    if tp == 1:
        return None
    if name == "mlp":
        return _divides("model.hidden", model.hidden, tp, " (column/row-parallel pairs split the features)")
    if name not in ("gpt", "hf"):
        return None  # custom: its own plan says what it splits (tensor.refusal when it has none)
    problem = _divides("model.heads", model.heads, tp, " (attention is split by heads)") \
        or _divides("model.hidden", model.hidden, tp) \
        or _divides("model.vocab", model.vocab, tp, " (the embedding and LM head are split by vocabulary)")
    if problem:
        return problem
    if name == "hf":
        ffn = getattr(model, "ffn", None) or 4 * model.hidden
        if model.ffn is not None:
            problem = _divides("model.ffn", ffn, tp, " (the MLP is split by its intermediate size)")
        kv = getattr(model, "kv_heads", None) or model.heads
        if not problem and kv % tp and tp % kv:
            problem = (f"model.kv_heads={kv}: tp={tp} must divide it (KV heads split) or be a multiple of it "
                       f"(KV heads replicated) (allowed: a divisor or a multiple of {tp})")
        if problem:
            return problem
    return sequence_parallel_problem(tp, model.seq) if sequence_parallel else None


def sequence_parallel_problem(tp: int, seq: int | None) -> str | None:
    """sequence_parallel alone: tp > 1, and a sequence length (None: a model without one) tp divides."""
    if tp == 1:
        return "sequence_parallel=true: needs tp > 1 (it shards the sequence over the TP group; allowed: false at tp=1)"
    if seq is None:
        return "sequence_parallel=true: the model has no sequence to shard (model=mlp; allowed: false)"
    return _divides("model.seq", seq, tp, " (sequence_parallel shards the sequence)")


def check_tp(model: Any, tp: int, sequence_parallel: bool = False) -> None:
    """tp_problem, raised as the project's ConfigError (one line, before any worker starts)."""
    from harness.config import ConfigError

    problem = tp_problem(model, tp, sequence_parallel)
    if problem:
        raise ConfigError(problem)
