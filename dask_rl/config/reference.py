"""The pipeline reference, ``docs/config.md``, generated from the schema (a test keeps it
current): ``python -m dask_rl.config.reference > docs/config.md``."""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any

from dask_rl.config.loader import VARIANTS, variant_classes
from dask_rl.config.schema import PipelineConfig


def describe(cls: type = PipelineConfig, prefix: str = "",
             variant: str = "") -> list[tuple[str, Any, str]]:
    """(key path, default, doc) for every field; variants' docs start with their name."""
    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}" if prefix else f.name
        tp = hints[f.name]
        if tp in VARIANTS:
            for name, cls_ in variant_classes(tp).items():
                rows += describe(cls_, key, variant=name)
        elif isinstance(tp, type) and dataclasses.is_dataclass(tp):
            rows += describe(tp, key)
        elif any(dataclasses.is_dataclass(a) for a in typing.get_args(tp)):  # optional section
            rows.append((key, None, f.metadata.get("doc", "")))
            rows += describe(next(a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)),
                             key)
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            doc = f.metadata.get("doc", "")
            rows.append((key, default, f"*{variant}:* {doc}" if variant else doc))
    return rows


def reference_markdown() -> str:
    """The field reference of ``docs/config.md``."""
    lines = ["# Pipeline reference", "",
             "Every key a pipeline accepts, its default and its meaning. `algo` keys depend on "
             "`algo.name` and `aggregation` keys on `aggregation.strategy` (shown in italics). "
             "Generated from the schema (`dask_rl/config/schema.py` and the config classes of "
             "`dask_rl/algos/` and `dask_rl/staleness/`) by "
             "`python -m dask_rl.config.reference > docs/config.md`.",
             "",
             "| key | default | meaning |", "|---|---|---|"]
    for key, default, doc in describe():
        shown = json.dumps(list(default) if isinstance(default, tuple) else default)
        lines.append(f"| `{key}` | `{shown}` | {doc} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    sys.stdout.write(reference_markdown())
