"""The metadata keys layertap reads and writes, and the one reader of ``layertap.taps``.

* ``layertap.taps`` (model ``metadata_props``, written by ``lt.export``): a JSON
  list of ``{"name", "selector", "path", "call", "port", "index"}`` in output
  order; the model's own outputs have ``"path": null``.
* ``pkg.torch.onnx.name_scopes`` / ``class_hierarchy`` / ``namespace`` (node
  ``metadata_props``, written by the torch.export-based exporter): the module
  path and class of every enclosing module call.
"""

from __future__ import annotations

import json
import warnings
from typing import TYPE_CHECKING, Any, Iterable

from ..errors import LayertapWarning

if TYPE_CHECKING:  # pragma: no cover
    import onnx

TAPS_KEY = "layertap.taps"
NAME_SCOPES_KEY = "pkg.torch.onnx.name_scopes"
CLASS_HIERARCHY_KEY = "pkg.torch.onnx.class_hierarchy"
#: on a node whose op is not the one the exporter made its output with (a tool removed that op, a ReLU a
#: quantiser folds into the Conv before it): the scopes of the removed op, whose value the name stands for
#: (written in memory only, :mod:`~layertap.onnxfile.scopemap.lent`)
VALUE_SCOPES_KEY = "layertap.value_scopes"
#: on a fused node (ONNX Runtime's ``FusedConv``) whose scopes are those of the last op it fused, the value
#: it makes: the scopes of the first op it fused (written in memory only, :mod:`~layertap.onnxfile.scopemap.lent`)
FUSED_FROM_KEY = "layertap.fused_from"
NAMESPACE_KEY = "namespace"


def read_taps(model: "onnx.ModelProto") -> list[dict[str, Any]]:
    """The ``layertap.taps`` records (records without a name dropped); bad metadata warns and counts as none.

    The metadata comes from the file: a deeply nested or malformed value must
    not make the file unusable (its tensor names still work).

    Example:
        >>> import warnings
        >>> from onnx import helper
        >>> m = helper.make_model(helper.make_graph([], "g", [], []))
        >>> write_taps(m, [{"name": "output", "path": None}, {"name": "fc", "path": "fc"}])
        >>> [r["name"] for r in read_taps(m)]
        ['output', 'fc']
        >>> helper.set_model_props(m, {TAPS_KEY: "[" * 200_000})
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     read_taps(m)
        []
    """
    for p in model.metadata_props:
        if p.key == TAPS_KEY:
            try:
                value = json.loads(p.value)
            except (ValueError, RecursionError) as e:
                value = e
            if not isinstance(value, list):
                why = f"{type(value).__name__}: {str(value)[:80]}" if isinstance(value, Exception) else "not a list"
                warnings.warn(f"ignoring the file's layertap.taps metadata ({why}); tensor names still work",
                              LayertapWarning, stacklevel=2)
                return []
            return [r for r in value if isinstance(r, dict) and isinstance(r.get("name"), str)]
    return []


def write_taps(model: "onnx.ModelProto", records: Iterable[dict[str, Any]]) -> None:
    """Write the tap list under :data:`TAPS_KEY` (replacing an older one)."""
    keep = [p for p in model.metadata_props if p.key != TAPS_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    prop = model.metadata_props.add()
    prop.key = TAPS_KEY
    prop.value = json.dumps(list(records))


def own_outputs(model: "onnx.ModelProto") -> list[str]:
    """The graph outputs that are the model's own result (tap outputs left out).

    Without ``layertap.taps`` metadata every output is the model's own.

    Example:
        >>> from onnx import helper
        >>> vi = lambda n: helper.make_tensor_value_info(n, 1, [1])
        >>> m = helper.make_model(helper.make_graph([], "g", [], [vi("output"), vi("fc")]))
        >>> write_taps(m, [{"name": "output", "path": None}, {"name": "fc", "path": "fc"}])
        >>> own_outputs(m)
        ['output']
    """
    names = [o.name for o in model.graph.output]
    own = [r["name"] for r in read_taps(model) if r.get("path") is None]
    return [n for n in own if n in names] or names
