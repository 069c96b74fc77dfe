"""docs/architecture.md quotes the driver's wiring function: the quote is the code's."""

import inspect
import re
from pathlib import Path

from dask_rl.runtime.driver import Driver

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def test_the_wiring_quoted_in_the_architecture_is_the_drivers():
    quoted = re.search(r"```python\n(    def connect\(self\).*?)```", DOC.read_text(), re.S)
    assert quoted, "docs/architecture.md no longer quotes Driver.connect"
    assert quoted.group(1) == inspect.getsource(Driver.connect), \
        "docs/architecture.md quotes an old Driver.connect: copy the function again"
