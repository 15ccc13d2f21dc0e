"""What a call through the Python package costs over the C call itself
(best of 5 runs). Run with the package installed (make python):
    build/venv/bin/python bench/python_overhead.py"""
import ctypes
import timeit

import mstar_kv as mk
from mstar_kv import _ffi

raw = getattr(_ffi.lib, "raw", _ffi.lib)   # the ctypes.CDLL under the package's integer checks


def best_us(fn, n):
    return min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6


a = mk.Arena(num_pages=64, page_size=16)
r = a.add_request()
seg = [(r, 1)]
ret = mk.Retention(16, window_chunks=2)
rp = ctypes.byref(ret._s)
seg1 = _ffi.mskv_segment()
print("ctypes call of mskv_arena_step alone:  %.2f us" % best_us(lambda: raw.mskv_arena_step(a.ptr), 100000))
print("ctypes call of mskv_skipped_tokens:    %.2f us" % best_us(lambda: raw.mskv_skipped_tokens(rp, 100), 100000))
print("_ffi.lib.mskv_skipped_tokens:          %.2f us" % best_us(lambda: _ffi.lib.mskv_skipped_tokens(rp, 100),
                                                              100000))
print("mskv_segment.n_tokens = 5:             %.2f us" % best_us(lambda: setattr(seg1, "n_tokens", 5), 100000))
print("arena.step:                            %.2f us" % best_us(lambda: a.step, 100000))
print("request.info():                        %.2f us" % best_us(r.info, 50000))
print("arena.admit + arena.abort, 1 segment:  %.2f us" % best_us(lambda: (a.admit(seg), a.abort(seg)), 20000))
