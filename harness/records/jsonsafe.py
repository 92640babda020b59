"""Strict JSON for records: no NaN or Infinity anywhere (Python's json writes them as bare
`NaN`/`Infinity`, which is not JSON: jq, JavaScript and most readers refuse the file).

    json.dumps(strict(obj, reasons), allow_nan=False)

`strict` returns a copy of `obj` (dicts, lists, tuples, dataclass-free plain data) in which
every non-finite float is None, and appends one `path: value written as null` line per
replacement to `reasons` when given, so a record can say why a field is null.
"""

from __future__ import annotations

import math
from typing import Any


def strict(obj: Any, reasons: list[str] | None = None, path: str = "") -> Any:
    """`obj` with every NaN, +inf and -inf (Python floats, and numpy floating scalars) replaced
    by None; containers copied, everything else returned as is."""
    if isinstance(obj, float) or (type(obj).__module__ == "numpy" and hasattr(obj, "dtype")
                                  and getattr(obj.dtype, "kind", "") == "f" and getattr(obj, "ndim", 1) == 0):
        value = float(obj)
        if math.isfinite(value):
            return obj
        if reasons is not None:
            reasons.append(f"{path or '(top)'}: {value} written as null (not a finite number)")
        return None
    if isinstance(obj, dict):
        return {k: strict(v, reasons, f"{path}.{k}" if path else str(k)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict(v, reasons, f"{path}[{i}]") for i, v in enumerate(obj)]
    return obj
