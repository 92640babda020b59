"""What the advisor refuses with, torch-free: `python -m harness.advise`'s flag checks answer
with these before the search (and torch, which it imports) is loaded."""

from __future__ import annotations


class AdviseError(ValueError):
    """An input the advisor cannot plan for; str() is one line naming why (exit 2)."""


MEMORY_LIMITS_ALLOWED = ("allowed: numbers > 0, the memory limit of the schedules that take one (zb_auto's "
                         "schedule.memory_limit) in units of 1F1B's peak (pp microbatches per rank), e.g. 1 2 or 1,2; "
                         "or budget: 1 and the largest the memory allows")
