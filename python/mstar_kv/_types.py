"""Type aliases of the annotations (documentation for help() and type
checkers; nothing is checked at run time from them)."""
from typing import Any, Sequence, Tuple, Union

#: A NumPy array, a torch tensor or any __array_interface__ /
#: __cuda_array_interface__ / DLPack object (mstar_kv._tensors says which).
Tensor = Any
#: An enum argument: the IntEnum member, its int value, or its lower-case name ("causal", "1d", "bf16").
Choice = Union[str, int]
#: One step's segments: (Request, n_tokens) pairs.
Segments = Sequence[Tuple[Any, int]]
