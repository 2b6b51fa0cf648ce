from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[Union[np.float32, np.float64]]

def methods() -> List[Dict[str, Any]]: ...
def canonical(spec: str) -> str: ...
def softmax(logits: FloatArray, method: str, engine: str = ...) -> npt.NDArray[np.float64]: ...
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
) -> Union[npt.NDArray[np.float64], Tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]]: ...
def compare(a: FloatArray, b: FloatArray) -> Dict[str, float]: ...
def load(path: str) -> Dict[str, np.ndarray]: ...
def save(path: str, arrays: Dict[str, FloatArray]) -> None: ...
