"""Values across the sandbox boundary: the only thing model code can send back is plain data.

The sandboxed child answers each call with one JSON line; :func:`encode` writes it (in the child,
without the ``json`` module, whose import costs milliseconds per run) and :func:`decode` reads it
(in the judge, from text the model's code may have written itself). JSON has no tuples, sets,
non-string keys, bytes or non-finite floats, so those travel tagged as one-key objects::

    None, True, 3, "s", [..]      as themselves      (every JSON object is a tag)
    {"f": "0.1"}                   float (its repr: exact, and nan/inf survive)
    {"t": [..]} {"s": [..]} {"z": [..]}   tuple, set, frozenset
    {"d": [[k, v], ..]}            dict (keys of any sendable, hashable type)
    {"b": "00ff"} {"c": ["1.0", "2.0"]}   bytes, complex

:func:`decode` builds only these built-in types and refuses anything else, deeper than
:data:`MAX_DEPTH`, or an integer longer than :data:`MAX_INT_DIGITS` digits, so what a test sees
can never be an object with a forged ``__eq__`` or a value that is costly to compare.
Standard library only: this file is part of both the child's and the judge's program.
"""

MAX_DEPTH = 64
MAX_INT_DIGITS = 4300  # Python's own default limit for str <-> int conversion
_FLOATS = {"nan", "inf", "-inf"}


class ValueSendError(TypeError):
    """The value cannot cross the boundary (its type, its depth or its size)."""


def quote(text):
    """``text`` as a JSON string literal (ASCII only; control characters and quotes escaped)."""
    out = []
    for char in text:
        code = ord(char)
        if 32 <= code < 127 and char not in '"\\':
            out.append(char)
        elif code > 0xFFFF:
            code -= 0x10000
            out.append("\\u%04x\\u%04x" % (0xD800 + (code >> 10), 0xDC00 + (code & 0x3FF)))
        else:
            out.append("\\u%04x" % code)
    return '"' + "".join(out) + '"'


def encode(value, depth=0):
    """JSON text of ``value`` in the tagged form above.

    Exact built-in types only (a subclass of ``int`` or ``str`` is refused, never converted).

    Raises:
        ValueSendError: For any other type, a container nested deeper than ``MAX_DEPTH`` (which
            also catches a list that contains itself), or an int over ``MAX_INT_DIGITS`` digits.
    """
    if depth > MAX_DEPTH:
        raise ValueSendError(f"the value is nested deeper than {MAX_DEPTH} levels")
    kind = type(value)
    if value is None or value is True or value is False:
        return {None: "null", True: "true", False: "false"}[value]
    if kind is int:
        if value.bit_length() > MAX_INT_DIGITS * 3.33:
            raise ValueSendError(f"the int has more than {MAX_INT_DIGITS} digits")
        return int.__repr__(value)
    if kind is float:
        return '{"f":' + quote(float.__repr__(value)) + "}"
    if kind is str:
        return quote(value)
    if kind is list:
        return "[" + ",".join(encode(v, depth + 1) for v in value) + "]"
    tag = {tuple: "t", set: "s", frozenset: "z"}.get(kind)
    if tag:
        return '{"' + tag + '":[' + ",".join(encode(v, depth + 1) for v in value) + "]}"
    if kind is dict:
        pairs = ("[" + encode(k, depth + 2) + "," + encode(v, depth + 2) + "]"
                 for k, v in value.items())
        return '{"d":[' + ",".join(pairs) + "]}"
    if kind is bytes:
        return '{"b":' + quote(value.hex()) + "}"
    if kind is complex:
        return '{"c":[' + quote(repr(value.real)) + "," + quote(repr(value.imag)) + "]}"
    raise ValueSendError(f"a value of type {kind.__name__} cannot leave the sandbox (only None, "
                         f"bool, int, float, complex, str, bytes, list, tuple, set, frozenset "
                         f"and dict can)")


def _float(text):
    if not isinstance(text, str) or len(text) > 40:
        raise ValueError("bad float")
    if text.lstrip("-") not in _FLOATS and not all(c in "0123456789.e+-" for c in text):
        raise ValueError(f"bad float {text[:40]!r}")
    return float(text)


def decode(node, depth=0):
    """The value of a tagged JSON tree (as parsed by ``json.loads``); see the module docstring.

    Raises:
        ValueError: On anything but the documented forms.
    """
    if depth > MAX_DEPTH + 2:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    kind = type(node)
    if node is None or kind in (bool, str):
        return node
    if kind is int:
        return node
    if kind is list:
        return [decode(v, depth + 1) for v in node]
    if kind is not dict or len(node) != 1:
        raise ValueError(f"unexpected {kind.__name__}")
    (tag, body), = node.items()
    if tag == "f":
        return _float(body)
    if tag == "b" and isinstance(body, str):
        return bytes.fromhex(body)
    if tag == "c" and isinstance(body, list) and len(body) == 2:
        return complex(_float(body[0]), _float(body[1]))
    if not isinstance(body, list):
        raise ValueError(f"bad tag {tag!r}")
    items = [decode(v, depth + 1) for v in body]
    if tag == "t":
        return tuple(items)
    if tag == "s":
        return set(items)
    if tag == "z":
        return frozenset(items)
    if tag == "d":
        if not all(type(p) is list and len(p) == 2 for p in items):
            raise ValueError("bad dict pairs")
        return {k: v for k, v in items}
    raise ValueError(f"unknown tag {tag!r}")
