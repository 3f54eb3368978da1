"""The mapping from PyTorch module calls to ONNX tensors, read from one file: :class:`ScopeMap`.

Built from a file's node scopes (:mod:`.node_scopes`), grouped into calls (:mod:`.calls`),
with the facts about the graph the grouping needs (:mod:`.graph_facts`), optimizer folds
(:mod:`.folds`), nodes other tools inserted without scope (:mod:`.placing`) and the names of
fused LLM files (:mod:`.llm_names`). Everything here reads a file and never imports torch.
"""

from .folds import BN_FOLD_RULES, plain_weight_name
from .graph_facts import GraphFacts, rules, stand_ins
from .llm_names import expose_fused_values_in_place, is_fused_llm, skip_norm_inputs, with_fused_values
from .scopes import Counterpart, ScopeMap

__all__ = [
    "BN_FOLD_RULES",
    "Counterpart",
    "GraphFacts",
    "ScopeMap",
    "expose_fused_values_in_place",
    "is_fused_llm",
    "plain_weight_name",
    "rules",
    "skip_norm_inputs",
    "stand_ins",
    "with_fused_values",
]
