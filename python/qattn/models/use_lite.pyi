# Types of qattn.models.use_lite (docs in use_lite.py).
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import numpy.typing as npt

_F32 = npt.NDArray[np.float32]
# attention(q, k, v, scale, layer) -> O, as fp32_attention; layer_hook(layer, q, k, v, scale) sees each layer's heads.
_Attention = Callable[[_F32, _F32, _F32, float, int], _F32]
_LayerHook = Callable[[int, _F32, _F32, _F32, float], None]

PACKAGE: str
VERSION: str
TARBALL: str
INTEGRITY: str

def default_dir() -> str: ...
def fetch(dest: Optional[str] = ..., timeout: float = ...) -> str: ...
def load_weights(directory: str) -> Dict[str, np.ndarray]: ...
def fp32_attention(q: _F32, k: _F32, v: _F32, scale: float, layer: int) -> _F32: ...

class Model:
    embedding: _F32
    inv_timescales: _F32
    eps: float
    layers: List[Dict[str, Any]]
    wh: _F32
    bh: _F32
    l2_eps: float
    def __init__(self, directory: Optional[str] = ...) -> None: ...
    def attention_inputs(
        self, ids: npt.ArrayLike, attention: _Attention = ..., layer_hook: Optional[_LayerHook] = ...
    ) -> _F32: ...
    def embed(
        self, ids: npt.ArrayLike, attention: _Attention = ..., layer_hook: Optional[_LayerHook] = ...
    ) -> _F32: ...
