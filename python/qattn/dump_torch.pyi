# Types of qattn.dump_torch (docs in dump_torch.py). Tensors and modules are typed Any: the stubs do not import torch.
import os
from contextlib import AbstractContextManager
from typing import Any, Callable, Optional, Protocol, Tuple, Union

_Tensor = Any
_Module = Any

class AttentionDumper:
    out_dir: str
    def __init__(self, out_dir: Union[str, "os.PathLike[str]"]) -> None: ...
    def record(
        self,
        layer: int,
        q: _Tensor,
        k: _Tensor,
        v: _Tensor,
        layout: str = ...,
        scale: Optional[float] = ...,
        causal: Optional[bool] = ...,
    ) -> None: ...
    def hook_projections(
        self,
        layer: int,
        q_proj: _Module,
        k_proj: _Module,
        v_proj: _Module,
        num_heads: int,
        num_kv_heads: Optional[int] = ...,
        scale: Optional[float] = ...,
        causal: Optional[bool] = ...,
        rope: Optional[Callable[[_Tensor, _Tensor], Tuple[_Tensor, _Tensor]]] = ...,
    ) -> None: ...
    def hook_fused_qkv(
        self, layer: int, qkv_proj: _Module, num_heads: int, scale: Optional[float] = ..., causal: Optional[bool] = ...
    ) -> None: ...
    def hook_multihead_attention(
        self, layer: int, mha: _Module, scale: Optional[float] = ..., causal: Optional[bool] = ...
    ) -> None: ...
    def remove_hooks(self) -> None: ...
    def write(self) -> None: ...

class _CaptureBlock(Protocol):  # what capture's `with ... as c` gives (stub only)
    @property
    def function(self) -> str: ...  # the wrapped function's dotted name
    @property
    def calls(self) -> int: ...  # the calls recorded in the block

def capture(
    dumper: AttentionDumper,
    fn: Union[None, str, Tuple[Any, str]] = ...,
    layers: Optional[int] = ...,
) -> AbstractContextManager[_CaptureBlock]: ...
