"""Reading a JSON file of the run directory into its pydantic model, the one way pdbench says
which file and which field is wrong (each format's module owns its model and error class)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


def read_model(path: Path, model: type[M], error: type[Exception]) -> M:
    """`model` from the JSON file at `path`, or `error` naming the file and what is wrong with it:
    unreadable, not JSON (where), or not the model (the first bad field's dotted location)."""
    try:
        return model.model_validate(json.loads(path.read_text()))
    except OSError as e:
        raise error(f"{path}: unreadable: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise error(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "(top level)"
        raise error(f"{path}: {where}: {first['msg']}") from None
