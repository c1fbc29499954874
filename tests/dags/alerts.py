"""A failure notification for the DAG tests: appends each event to the file $SPLITKEEPER_TEST_ALERTS."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from splitkeeper import notification


@notification
def record(event: Mapping[str, Any]) -> None:
    with open(os.environ["SPLITKEEPER_TEST_ALERTS"], "a", encoding="utf-8") as f:
        f.write(json.dumps(dict(event)) + "\n")
