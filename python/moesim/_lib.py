"""Finding and binding libmoesim.so (include/moesim.h) with ctypes.

Search order: $MOESIM_LIB (a path to the library), a libmoesim.so* in this package's folder,
the build tree of a source checkout (../../build/libmoesim.so from this file), then the system's
library path (libmoesim.so.<ABI>)."""
import ctypes
import ctypes.util
import os
from pathlib import Path

ABI_VERSION = 1  # MOESIM_ABI_VERSION of include/moesim.h this binding speaks


class MoesimError(Exception):
    """An error moesim reported: str() is its one-line message; .status its code
    (1 bad input, 2 I/O, 3 out of memory)."""

    def __init__(self, message, status=1):
        super().__init__(message)
        self.status = status


def _candidates():
    env = os.environ.get("MOESIM_LIB")
    if env:
        yield env
        return  # an explicit choice: no silent fallback to another library
    here = Path(__file__).resolve().parent
    yield from sorted(str(p) for p in here.glob("libmoesim.so*"))
    build = here.parent.parent / "build" / "libmoesim.so"
    if build.exists():
        yield str(build)
    yield f"libmoesim.so.{ABI_VERSION}"
    found = ctypes.util.find_library("moesim")
    if found:
        yield found


def _load():
    tried = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({e})")
            continue
        if not hasattr(lib, "moesim_abi_version"):
            raise MoesimError(f"{path}: not libmoesim (no moesim_abi_version)")
        if lib.moesim_abi_version() != ABI_VERSION:
            raise MoesimError(f"{path}: libmoesim ABI {lib.moesim_abi_version()}, "
                              f"this package speaks {ABI_VERSION}")
        return _bind(lib), path
    raise MoesimError("libmoesim.so not found (set MOESIM_LIB to its path); tried: "
                      + "; ".join(tried or ["nothing"]))


def _bind(lib):
    c_str, out = ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)
    lib.moesim_version.restype = c_str
    lib.moesim_version.argtypes = []
    lib.moesim_abi_version.restype = ctypes.c_int
    lib.moesim_free.argtypes = [ctypes.c_void_p]
    lib.moesim_free.restype = None
    lib.moesim_trace_open.argtypes = [c_str, out, out]
    lib.moesim_trace_stats.argtypes = [c_str, out, out]
    lib.moesim_config_load.argtypes = [c_str, c_str, out, out]
    lib.moesim_sim.argtypes = [c_str, c_str, c_str, c_str, c_str, ctypes.POINTER(c_str),
                               ctypes.c_size_t, out, out]
    lib.moesim_sweep.argtypes = [c_str, c_str, ctypes.c_uint, out, out]
    lib.moesim_model_shape.argtypes = [c_str, out, out]
    for f in ("moesim_trace_open", "moesim_trace_stats", "moesim_config_load", "moesim_sim",
              "moesim_sweep", "moesim_model_shape"):
        getattr(lib, f).restype = ctypes.c_int
    return lib


_LIB = None
LIB_PATH = None


def lib():
    """The bound library (loaded on first use)."""
    global _LIB, LIB_PATH
    if _LIB is None:
        _LIB, LIB_PATH = _load()
    return _LIB


def enc(s, what="argument"):
    """A path or name for the C calls (None stays NULL): a str or os.PathLike without NUL
    bytes, which C would silently cut at."""
    if s is None:
        return None
    if not isinstance(s, (str, os.PathLike)):
        raise TypeError(f"{what}: expected a str or a path, got {type(s).__name__}")
    b = os.fsencode(s)
    if b"\0" in b:
        raise ValueError(f"{what}: embedded null byte in {s!r}")
    return b


def take(ptr):
    """The string at a char* the library returned, freed."""
    if not ptr.value:
        return None
    try:
        return ctypes.string_at(ptr.value).decode()
    finally:
        lib().moesim_free(ptr.value)


def call(fn, *args):
    """Calls fn(*args, &result, &error); returns the result string or raises MoesimError."""
    result, error = ctypes.c_void_p(), ctypes.c_void_p()
    status = fn(*args, ctypes.byref(result), ctypes.byref(error))
    text, message = take(result), take(error)
    if status:
        raise MoesimError(message or f"moesim status {status}", status)
    return text
