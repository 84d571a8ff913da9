#!/usr/bin/env python3
"""Bytes and inflate time of a trace's look-ahead rows under three chunkings, deflated as
moesim's writer deflates (shuffle, then libdeflate's zlib streams, through ctypes):

  distance    one distance, all K' candidates a chunk, level 1 (the writer before)
  top_k, l1   one distance, top_k candidates a chunk, level 1
  top_k, l2   one distance, top_k candidates a chunk, level 2 (the writer now)

Chunks hold about TRACE_CHUNK_TARGET_BYTES / D of raw bytes in each (the rows of a 1 MiB chunk
of whole rows, one distance of them), as the writer sizes them. Prints each dataset's bytes per
layout (all distances) and the CPU seconds to inflate what a reader of distance 1's first top_k
candidates inflates (least of 5). Needs h5py and numpy (the Python package's dependencies) and
libdeflate (scripts/install-deps.sh).

Usage: python3 bench/lookahead_chunk_sizes.py TRACE.h5 [TOKENS]  (TOKENS: the first ones only)
"""
import ctypes
import ctypes.util
import sys
import time

import h5py
import numpy as np

CHUNK_TARGET_BYTES = 1024 * 1024
lib = ctypes.CDLL(ctypes.util.find_library("deflate") or "libdeflate.so.0")
lib.libdeflate_alloc_compressor.restype = ctypes.c_void_p
lib.libdeflate_alloc_decompressor.restype = ctypes.c_void_p
lib.libdeflate_zlib_compress.restype = ctypes.c_size_t
lib.libdeflate_zlib_compress.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                                         ctypes.c_void_p, ctypes.c_size_t]
lib.libdeflate_zlib_decompress.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                                           ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
compressors = {level: lib.libdeflate_alloc_compressor(level) for level in (1, 2)}
decompressor = lib.libdeflate_alloc_decompressor()


def shuffled(rows):
    """HDF5's shuffle filter: byte j of element i goes to j * n + i."""
    return rows.view(np.uint8).reshape(-1, rows.itemsize).T.tobytes()


def chunks(part, rows_per_chunk, level):
    """The part's chunks, compressed: (packed bytes, raw size) each; the last zero-padded."""
    out = []
    for r0 in range(0, part.shape[0], rows_per_chunk):
        rows = np.zeros((rows_per_chunk,) + part.shape[1:], part.dtype)
        rows[:min(rows_per_chunk, part.shape[0] - r0)] = part[r0:r0 + rows_per_chunk]
        raw = shuffled(rows)
        buf = ctypes.create_string_buffer(len(raw) + len(raw) // 8 + 1024)
        n = lib.libdeflate_zlib_compress(compressors[level], raw, len(raw), buf, len(buf))
        assert n > 0
        out.append((buf.raw[:n], len(raw)))
    return out


def inflate_s(packed):
    """Least CPU seconds of 5 to inflate the chunks."""
    best = float("inf")
    out = ctypes.create_string_buffer(max(n for _, n in packed))
    for _ in range(5):
        t = time.process_time()
        for data, n in packed:
            assert lib.libdeflate_zlib_decompress(decompressor, data, len(data), out, n, None) == 0
        best = min(best, time.process_time() - t)
    return best


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: lookahead_chunk_sizes.py TRACE.h5 [TOKENS]")
    f = h5py.File(sys.argv[1], "r")
    tokens = int(sys.argv[2]) if len(sys.argv) == 3 else None
    top_k = int(f.attrs["top_k"])
    layouts = (("distance", None, 1), ("top_k, l1", top_k, 1), ("top_k, l2", top_k, 2))
    print(f"{sys.argv[1]}: look-ahead bytes (MB) and CPU s to inflate distance 1's first top_k")
    print(f"{'dataset':<24} " + " ".join(f"{name:>11}" for name, _, _ in layouts) +
          "  " + " ".join(f"{name + ' s':>13}" for name, _, _ in layouts))
    for name in ("lookahead/expert_ids", "lookahead/scores"):
        data = f[name][:tokens]
        n, L, D, K = data.shape
        whole_rows = max(1, CHUNK_TARGET_BYTES // (L * D * K * data.itemsize))
        sizes, seconds = [], []
        for _, kc, level in layouts:
            kc = kc if kc and K > kc and K % kc == 0 else K
            rows = min(n, whole_rows * (K // kc))  # each chunk: ~1 MiB / D of raw bytes
            total = 0
            for d in range(D):
                for c0 in range(0, K, kc):
                    packed = chunks(data[:, :, d, c0:c0 + kc], rows, level)
                    total += sum(len(p) for p, _ in packed)
                    if d == 0 and c0 == 0:
                        first = inflate_s(packed)
                    elif d == 0 and c0 < top_k:
                        first += inflate_s(packed)
            sizes.append(total / 1e6)
            seconds.append(first)
        print(f"{name:<24} " + " ".join(f"{s:11.1f}" for s in sizes) + "  " +
              " ".join(f"{s:13.3f}" for s in seconds))


if __name__ == "__main__":
    main()
