#!/usr/bin/env python3
"""bench/sdpa_peer.py against a stand-in torch (no GPU, no PyTorch needed):
each backend's sdpa_kernel context is left even when the backend raises (a
selection left in force would restrict the backends tried after it). Prints the harness's totals
line ("N passed, N failed, N skipped") for tests/run.sh."""
import contextlib
import importlib.util
import io
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
PEER = os.path.join(HERE, "..", "bench", "sdpa_peer.py")


class FakeTorch:
    """The few torch names sdpa_peer.py uses. sdpa_kernel contexts nest like
    the real one: the innermost open selection is the one in force."""

    def __init__(self, failing):
        self.failing = failing          # the backend whose attention raises
        self.open = []                  # the selections in force, innermost last
        self.entered, self.left = [], []

    def modules(self):
        fake = self
        torch = types.ModuleType("torch")
        torch.bfloat16 = "bf16"
        torch.randn = lambda *shape, **kw: object()
        cuda = types.ModuleType("torch.cuda")
        cuda.is_available = lambda: True
        cuda.synchronize = lambda: None

        class Event:
            def __init__(self, enable_timing=False):
                pass

            def record(self):
                pass

            def elapsed_time(self, other):
                return 1.0

        cuda.Event = Event
        torch.cuda = cuda
        nn = types.ModuleType("torch.nn")
        functional = types.ModuleType("torch.nn.functional")

        def sdpa(q, k, v):
            if fake.open and fake.open[-1] == [fake.failing]:
                raise RuntimeError("no kernel for this backend")
            return q

        functional.scaled_dot_product_attention = sdpa
        attention = types.ModuleType("torch.nn.attention")

        class SDPBackend:
            CUDNN_ATTENTION = "CUDNN_ATTENTION"
            FLASH_ATTENTION = "FLASH_ATTENTION"
            EFFICIENT_ATTENTION = "EFFICIENT_ATTENTION"

        class sdpa_kernel:
            # left only through __exit__: PyTorch's is a generator that CPython
            # also closes when the last reference goes, which code must not rely on
            def __init__(self, backends):
                self.backends = tuple(backends)

            def __enter__(self):
                fake.open.append(list(self.backends))
                fake.entered.append(self.backends)

            def __exit__(self, *exc):
                fake.open.remove(list(self.backends))
                fake.left.append(self.backends)
                return False

        attention.SDPBackend = SDPBackend
        attention.sdpa_kernel = sdpa_kernel
        nn.functional = functional
        nn.attention = attention
        torch.nn = nn
        return {"torch": torch, "torch.cuda": cuda, "torch.nn": nn, "torch.nn.functional": functional,
                "torch.nn.attention": attention}


def run_peer(fake):
    saved = {n: sys.modules.get(n) for n in fake.modules()}
    sys.modules.update(fake.modules())
    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    try:
        spec = importlib.util.spec_from_file_location("sdpa_peer_under_test", PEER)
        peer = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(peer)
        sys.argv = ["sdpa_peer.py", "--iters", "2"]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = peer.main()
    finally:
        sys.argv = argv
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m
    return rc, out.getvalue(), err.getvalue()


TESTS = []


def test(fn):
    TESTS.append(fn)
    return fn


@test
def sdpa_peer_leaves_each_backend_context_even_when_the_backend_raises():
    fake = FakeTorch(failing="FLASH_ATTENTION")
    rc, out, err = run_peer(fake)
    assert fake.open == [], "contexts left open: %s" % fake.open
    assert sorted(fake.entered) == sorted(fake.left), "entered %s, left %s" % (fake.entered, fake.left)
    assert rc == 0 and "sdpa_tflops" in out, (rc, out, err)


def main():
    passed = failed = 0
    for fn in TESTS:
        print("[ RUN  ] %s" % fn.__name__)
        try:
            fn()
        except AssertionError as e:
            failed += 1
            print("  %s\n[ FAIL ] %s" % (e, fn.__name__))
            continue
        passed += 1
        print("[  OK  ] %s" % fn.__name__)
    print("%d passed, %d failed, 0 skipped" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
