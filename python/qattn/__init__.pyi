import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[Union[np.float32, np.float64]]
IntArray = npt.NDArray[Union[np.int8, np.int16, np.int32]]

def methods() -> List[Dict[str, Any]]: ...
def quantizers() -> Dict[str, List[Dict[str, Any]]]: ...
def canonical(spec: str) -> str: ...
def softmax(logits: FloatArray, method: str, engine: str = ...) -> npt.NDArray[np.float64]: ...
def softmax_integer(
    logits: IntArray, method: str, cint: Optional[int] = ..., alpha: Optional[float] = ...
) -> Tuple[npt.NDArray[np.float64], Optional[np.ndarray], float]: ...
def exact_softmax(logits: FloatArray, decimal: bool = ...) -> np.ndarray: ...
def attention(
    q: FloatArray,
    k: FloatArray,
    v: FloatArray,
    method: str,
    scale: Optional[float] = ...,
    causal: bool = ...,
    mask: Optional[npt.NDArray[np.bool_]] = ...,
    return_probs: bool = ...,
    engine: str = ...,
    threads: int = ...,
    kv: Optional[str] = ...,
    raw: bool = ...,
) -> Union[npt.NDArray[np.float64], Tuple[npt.NDArray[np.float64], np.ndarray]]: ...
def quantize_kv(k: FloatArray, v: FloatArray, spec: str) -> Dict[str, Any]: ...
def quantize_weights(w: FloatArray, x: FloatArray, spec: str) -> npt.NDArray[np.float64]: ...
def compare(a: FloatArray, b: FloatArray) -> Dict[str, float]: ...
class Method:
    name: str
    fn: Callable[..., Any]
    kind: str
    params: Dict[str, Any]
    def __init__(self, name: str, fn: Callable[..., Any], kind: str = ..., **params: Any) -> None: ...
    @property
    def label(self) -> str: ...
    def with_params(self, **params: Any) -> "Method": ...
def analyze(
    dump: Union[str, os.PathLike],
    methods: Union[None, str, Method, Sequence[Union[str, Method]]] = ...,
    kv: Optional[str] = ...,
    weights: Optional[str] = ...,
    softmax_only: bool = ...,
    reference: str = ...,
    engine: str = ...,
    as_frame: Optional[bool] = ...,
) -> Any: ...
def sweep(
    dump: Union[str, os.PathLike],
    method: Union[str, Method],
    grid: Dict[str, Sequence[Any]],
    metric: str = ...,
    target: str = ...,
    softmax_only: bool = ...,
    engine: str = ...,
) -> List[Dict[str, Any]]: ...
def fp8_encode(x: FloatArray, format: str = ..., saturate: bool = ...) -> npt.NDArray[np.uint8]: ...
def load(path: str) -> Dict[str, np.ndarray]: ...
def save(path: str, arrays: Dict[str, FloatArray]) -> None: ...
