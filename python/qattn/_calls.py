"""Calls into the native module _qattn with the errors a user can read (qattn/__init__.py and _lowp.py use them)."""


def _native(public, fn, *args):
    """``fn(*args)``, a function of the native module called positionally by the public function ``public``. Where
    the native binding refuses an argument's type, the TypeError names the parameter, the type it takes and the type
    given, never the value (an array's repr can run to thousands of lines)."""
    try:
        return fn(*args)
    except TypeError as e:
        if "incompatible function arguments" not in str(e):
            raise
        raise TypeError("%s: %s" % (public, _misfit(str(e), args))) from None


def _misfit(message, args):
    """The first argument whose type the binding's signature (in ``message``) does not take, in words."""
    import re

    import numpy as np
    m = re.search(r"1\. \((.*)\) -> ", message)
    params = []
    if m:
        depth, item = 0, ""
        for ch in m.group(1) + ",":
            if ch == "," and depth == 0:
                params.append(item.strip())
                item = ""
                continue
            depth += ch in "[(" and 1 or ch in "])" and -1 or 0
            item += ch
    def fits(typ, x):
        typ = typ.split("=")[0].strip()
        if typ.startswith("Optional["):
            return x is None or fits(typ[len("Optional["):-1], x)
        if typ == "str":
            return isinstance(x, str)
        if typ == "bool":
            return isinstance(x, (bool, np.bool_))
        if typ == "int":
            return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))
        if typ == "float":
            return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))
        if typ == "numpy.ndarray":
            return isinstance(x, np.ndarray)
        if typ.startswith("List["):
            return isinstance(x, (list, tuple)) and all(fits(typ[len("List["):-1], y) for y in x)
        return True  # handle, object and anything not modelled here
    for param, x in zip(params, args):
        name, _, typ = param.partition(":")
        if typ and not fits(typ, x):
            words = {"str": "a str", "bool": "True or False", "int": "an int", "float": "a real number",
                     "numpy.ndarray": "a NumPy array"}
            t = typ.split("=")[0].strip()
            want = ("None or " + words.get(t[len("Optional["):-1], t[len("Optional["):-1])) if t.startswith(
                "Optional[") else words.get(t, t)
            return "%s must be %s, got %s" % (name.strip(), want, type(x).__module__ + "." + type(x).__qualname__
                                              if type(x).__module__ not in ("builtins",) else type(x).__qualname__)
    return "the arguments' types (%s) do not fit" % ", ".join(type(x).__qualname__ for x in args)


def _widen16(x):
    """A NumPy float16 array as float32 (exact, as ``qattn analyze`` reads float16 .npy); anything else as it is."""
    import numpy as np
    return x.astype(np.float32) if isinstance(x, np.ndarray) and x.dtype == np.float16 else x
