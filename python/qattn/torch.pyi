# Types of qattn.torch (docs in torch.py). Tensors are typed Any: the stubs do not import torch.
from contextlib import AbstractContextManager
from typing import Any, Optional, Protocol, Tuple, Union

from .dump_torch import AttentionDumper as AttentionDumper, capture as capture

_Tensor = Any

def attention(
    q: _Tensor,
    k: _Tensor,
    v: _Tensor,
    method: str,
    scale: Optional[float] = ...,
    causal: bool = ...,
    mask: Optional[_Tensor] = ...,
    return_probs: bool = ...,
    **options: Any,
) -> Union[_Tensor, Tuple[_Tensor, _Tensor]]: ...

class RouteWarning(UserWarning): ...

class _Routed(Protocol):  # what route's `with ... as r` gives (stub only)
    @property
    def calls(self) -> int: ...  # attention calls the block sent through qattn

def route(method: str, strict: bool = ..., **options: Any) -> AbstractContextManager[_Routed]: ...
