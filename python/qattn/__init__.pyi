import os
from typing import Any, Callable, Dict, List, Literal, Mapping, Optional, Sequence, Tuple, Union, overload

import numpy as np
import numpy.typing as npt

_FloatArray = npt.NDArray[Union[np.float32, np.float64]]
_IntArray = npt.NDArray[Union[np.int8, np.int16, np.int32]]

from . import plot as plot
from .plot import write_csv as write_csv

__version__: str

def methods() -> List[Dict[str, Any]]: ...
def quantizers() -> Dict[str, List[Dict[str, Any]]]: ...
def canonical(spec: str) -> str: ...
def softmax(logits: _FloatArray, method: str, engine: str = ...) -> npt.NDArray[np.float64]: ...
def softmax_integer(
    logits: _IntArray, method: str, cint: Optional[int] = ..., alpha: Optional[float] = ...
) -> Tuple[npt.NDArray[np.float64], Optional[np.ndarray], float]: ...
def exact_softmax(logits: _FloatArray, decimal: bool = ...) -> np.ndarray: ...
@overload
def attention(
    q: _FloatArray,
    k: _FloatArray,
    v: _FloatArray,
    method: Union[str, "Method"],
    scale: Optional[float] = ...,
    causal: bool = ...,
    mask: Optional[npt.NDArray[np.bool_]] = ...,
    return_probs: Literal[False] = ...,
    engine: str = ...,
    threads: int = ...,
    kv: Optional[str] = ...,
    raw: bool = ...,
) -> npt.NDArray[np.float64]: ...
@overload
def attention(
    q: _FloatArray,
    k: _FloatArray,
    v: _FloatArray,
    method: Union[str, "Method"],
    scale: Optional[float] = ...,
    causal: bool = ...,
    mask: Optional[npt.NDArray[np.bool_]] = ...,
    *,
    return_probs: Literal[True],
    engine: str = ...,
    threads: int = ...,
    kv: Optional[str] = ...,
    raw: bool = ...,
) -> Tuple[npt.NDArray[np.float64], np.ndarray]: ...
@overload
def attention(
    q: _FloatArray,
    k: _FloatArray,
    v: _FloatArray,
    method: Union[str, "Method"],
    scale: Optional[float] = ...,
    causal: bool = ...,
    mask: Optional[npt.NDArray[np.bool_]] = ...,
    return_probs: bool = ...,
    engine: str = ...,
    threads: int = ...,
    kv: Optional[str] = ...,
    raw: bool = ...,
) -> Union[npt.NDArray[np.float64], Tuple[npt.NDArray[np.float64], np.ndarray]]: ...
def quantize_kv(k: _FloatArray, v: _FloatArray, spec: str) -> Dict[str, Any]: ...
def quantize_weights(w: _FloatArray, x: _FloatArray, spec: str) -> npt.NDArray[np.float64]: ...
def compare(a: _FloatArray, b: _FloatArray) -> Dict[str, float]: ...
class Method:
    name: str
    fn: Callable[..., Any]
    kind: str
    params: Dict[str, Any]
    thread_safe: bool
    def __init__(
        self, name: str, fn: Callable[..., Any], kind: str = ..., *, thread_safe: bool = ..., **params: Any
    ) -> None: ...
    @property
    def label(self) -> str: ...
    def with_params(self, **params: Any) -> "Method": ...
class _Records(List[Dict[str, Any]]):
    summary: List[Dict[str, Any]]
    def __init__(self, records: List[Dict[str, Any]], summary: List[Dict[str, Any]]) -> None: ...
    def to_frame(self, summary: bool = ..., columns: Union[None, str, Sequence[str]] = ...) -> Any: ...

def analyze(
    dump: Union[str, os.PathLike],
    methods: Union[None, str, Method, Sequence[Union[str, Method]]] = ...,
    kv: Optional[str] = ...,
    weights: Optional[str] = ...,
    softmax_only: bool = ...,
    reference: str = ...,
    engine: str = ...,
    as_frame: bool = ...,
    format: Optional[str] = ...,
    threads: int = ...,
    summary: bool = ...,
    columns: Union[None, str, Sequence[str]] = ...,
) -> Any: ...
def sweep(
    dump: Union[str, os.PathLike],
    method: Union[str, Method],
    grid: Mapping[str, Any],
    metric: str = ...,
    target: str = ...,
    softmax_only: bool = ...,
    engine: str = ...,
    threads: int = ...,
) -> List[Dict[str, Any]]: ...
def fp8_encode(
    x: Union[float, np.floating[Any], npt.NDArray[np.floating[Any]]], format: str = ..., saturate: bool = ...
) -> npt.NDArray[np.uint8]: ...
def lowp_encode(
    x: Union[float, np.floating[Any], npt.NDArray[np.floating[Any]]], fmt: str, rounding: str = ..., saturate: bool = ...
) -> npt.NDArray[np.uint8]: ...
def lowp_decode(codes: npt.NDArray[np.uint8], fmt: str) -> npt.NDArray[np.float32]: ...
def mx_quantize(
    x: Union[float, np.floating[Any], npt.NDArray[np.floating[Any]]], fmt: str = ..., block: int = ...
) -> Tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]: ...
def nvfp4_quantize(
    x: Union[float, np.floating[Any], npt.NDArray[np.floating[Any]]],
) -> Tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8], float]: ...
def mma(
    a: np.ndarray,
    bt: np.ndarray,
    c: Optional[npt.NDArray[Union[np.float32, np.float16]]] = ...,
    scale_a: Optional[npt.NDArray[np.uint8]] = ...,
    scale_bt: Optional[npt.NDArray[np.uint8]] = ...,
    model: str = ...,
) -> np.ndarray: ...
def mma_models() -> List[Dict[str, Any]]: ...
def load(path: str) -> Dict[str, np.ndarray]: ...
def save(path: str, arrays: Dict[str, _FloatArray]) -> None: ...
