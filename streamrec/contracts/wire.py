"""The one pair of wire functions every contract has: to JSON and back.

A contract is a frozen pydantic model that forbids unknown fields, so a renamed or missing
field fails where it is read, naming itself (``ContractError``), and not later as a wrong
number. NaN metrics stay NaN: ``to_json`` (a Redis field, a file) writes them as ``json``
does, where pydantic's own JSON would write ``null`` and then refuse it as a float; and
``to_wire`` writes each non-finite float as the string ``json`` would (``"NaN"``,
``"Infinity"``), because Airflow's API server takes strict JSON only (an AUC not yet
measured failed every XCom push), and pydantic reads the string back as the float.
Inside another model's pydantic JSON (an artifact's manifest holds the gate decision) a
contract writes them as JSON's constants (``NaN``), which pydantic reads back: with its
default, ``null``, a version whose gate passed before any pass had matured (AUC NaN) was
published with a manifest nothing could read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, ValidationError

from streamrec.errors import ContractError, broken_fields


class Contract(BaseModel):
    """A value that crosses a process or a stage."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")

    def to_wire(self) -> dict[str, Any]:
        """As strict JSON-ready data (Airflow's XCom, a reply): non-finite floats as strings."""
        wire: dict[str, Any] = _strict(json.loads(self.to_json()))
        return wire

    def to_json(self) -> str:
        """As JSON text (a Redis field, a file)."""
        return json.dumps(self.model_dump(mode="python"))

    @classmethod
    def from_wire(cls, raw: str | bytes | Mapping[str, Any], what: str = "") -> Self:
        """Read ``raw`` (JSON text or decoded data); ContractError naming the contract,
        ``what`` was read, and each broken field."""
        try:
            data = json.loads(raw) if isinstance(raw, str | bytes) else raw
            return cls.model_validate(data)
        except ValidationError as e:
            where = f" ({what})" if what else ""
            raise ContractError(
                f"{cls.__name__}{where} breaks its contract ({cls.__module__}): {broken_fields(e)}"
            ) from None
        except json.JSONDecodeError as e:
            raise ContractError(f"{cls.__name__}{what and f' ({what})'} is not JSON: {e}") from None


def _strict(value: Any) -> Any:
    """``value`` with each non-finite float replaced by its ``json`` spelling."""
    if isinstance(value, float) and not math.isfinite(value):
        return json.dumps(value)
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_strict(v) for v in value]
    return value
