"""What a call through the Python package costs over the C call itself
(best of 5 runs). Run with the package installed (make python):
    build/venv/bin/python bench/python_overhead.py"""
import timeit

import mstar_kv as mk
from mstar_kv import _ffi


def best_us(fn, n):
    return min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6


a = mk.Arena(num_pages=64, page_size=16)
r = a.add_request()
seg = [(r, 1)]
print("ctypes call of mskv_arena_step alone:  %.2f us" % best_us(lambda: _ffi.lib.mskv_arena_step(a.ptr), 100000))
print("arena.step:                            %.2f us" % best_us(lambda: a.step, 100000))
print("request.info():                        %.2f us" % best_us(r.info, 50000))
print("arena.admit + arena.abort, 1 segment:  %.2f us" % best_us(lambda: (a.admit(seg), a.abort(seg)), 20000))
