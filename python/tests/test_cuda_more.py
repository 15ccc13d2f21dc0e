"""The rest of the GPU layer from Python. Without a device: the driver
probe, one NVRTC compilation (where libnvrtc is installed), the embedded
kernel source, the launch geometry and the page divisor, and the CPU ISA
report. Graph capture and head shards need a GPU (skipped with the reason
where there is none)."""
from pathlib import Path

import numpy as np
import pytest

import mstar_kv as mk

REPO = Path(__file__).resolve().parents[2]


def _gpu_or_skip():
    ok, why = mk.cuda_probe()
    if not ok:
        pytest.skip("needs a GPU (CUDA driver, device and NVRTC): %s" % why)


def test_probe_driver_tells_no_driver_from_a_device():
    ok, devices, version, why = mk.cuda_probe_driver()
    if ok:
        assert devices > 0 and version >= 1000 and why == ""
    else:
        assert devices == 0 and ("libcuda" in why or "device" in why)
    ok2, _, _, why2 = mk.cuda_probe_driver(driver_path="/nonexistent/libcuda.so.1")
    assert not ok2 and "/nonexistent/libcuda.so.1" in why2


def test_the_embedded_kernel_source_is_kernels_cu_line_for_line():
    src = mk.cuda_embedded_source()
    lines = mk.cuda_embedded_lines()
    assert "".join(lines) == src and all(line.endswith("\n") for line in lines)
    if (REPO / "kernels.cu").is_file():
        assert src == (REPO / "kernels.cu").read_text()


def test_compile_gives_a_cubin_or_says_there_is_no_nvrtc(tmp_path):
    src = 'extern "C" __global__ void mskv_py_probe(int *p) { *p = 1; }\n'
    try:
        img = mk.cuda_compile(arch=80, kernel_source=src, cache_dir=str(tmp_path))
    except mk.CudaUnavailableError as e:
        pytest.skip("no libnvrtc here: %s" % e)
    assert not img.is_ptx and img.data[:4] == b"\x7fELF" and not img.from_disk
    again = mk.cuda_compile(arch=80, kernel_source=src, cache_dir=str(tmp_path))
    assert again.from_disk and again.key == img.key and again.data == img.data
    ptx = mk.cuda_compile(arch=80, ptx=True, kernel_source=src, disable_disk_cache=True)
    assert ptx.is_ptx and b"mskv_py_probe" in ptx.data
    with pytest.raises(mk.NvrtcError) as e:
        mk.cuda_compile(arch=80, kernel_source="this is not CUDA\n", disable_disk_cache=True)
    assert "error" in e.value.detail


def test_log_spills_sums_stores_and_loads():
    log = ("ptxas info    : Function properties for k\n"
           "    8 bytes stack frame, 12 bytes spill stores, 20 bytes spill loads\n")
    assert mk.cuda_log_spills(log) == 32
    assert mk.cuda_log_spills("no report here") == -1
    with pytest.raises(TypeError, match="log"):
        mk.cuda_log_spills(None)


def test_page_divisor_divides_like_the_kernel():
    g = np.random.default_rng(7)
    print("seed 7")
    for page_size in (1, 3, 16, 17, 64, 1000):
        magic, shift = mk.cuda_page_divisor(page_size)
        for j in [0, 1, page_size - 1, page_size, (1 << 31) - 1] + list(g.integers(0, 1 << 31, 50)):
            assert (int(j) * magic) >> shift == int(j) // page_size, (page_size, j)
    with pytest.raises(ValueError, match="page_size"):
        mk.cuda_page_divisor(0)


def test_attention_geometry_splits_long_decodes_and_refuses_a_bad_head_dim():
    decode = mk.cuda_attn_geometry(1, 1, 1, 8192, 32, 8, 128, multiprocessors=132)
    assert decode.decode == 1 and decode.n_splits > 1 and decode.workspace_bytes > 0
    assert decode.kv_chunk * decode.n_splits >= 8192 and decode.kv_chunk % decode.block_keys == 0
    prefill = mk.cuda_attn_geometry(4, 4096, 1024, 1024, 32, 8, 128, multiprocessors=132)
    assert prefill.decode == 0 and prefill.n_splits == 1 and prefill.workspace_bytes == 0
    assert len(prefill.grid) == 3 and prefill.block_threads == 128
    with pytest.raises(mk.InvalidArgumentError, match="head_dim=96"):
        mk.cuda_attn_geometry(1, 1, 1, 64, 8, 8, 96, multiprocessors=132)


def test_cpu_isa_report_and_the_pools_choice():
    isas = mk.cpu_isas()
    assert isas["auto"] and isas["portable"]
    assert mk.cpu_isa_name(mk.CpuIsa.AVX2) == "avx2" and mk.cpu_isa_name("neon") == "neon"
    with mk.Cpu() as cpu:
        info = cpu.info()
        assert info.isa != mk.CpuIsa.AUTO and isas[mk.cpu_isa_name(info.isa)]
        assert info.num_threads >= 1 and info.workspace_bytes > 0
    with pytest.raises(ValueError, match="isa"):
        mk.cpu_isa_name("sse9")


def test_cpu_info_counts_the_work_items_of_the_last_attention(arena):
    from conftest import filled
    r, _, _ = filled(arena, 12)
    plan = arena.plan_build([(r, 0)], mk.Plan(1, 0, 8))
    arena.admit([(r, 4)])
    plan = arena.plan_build([(r, 4)], mk.Plan(1, 4, 8))
    arena.write_kv(0, plan, np.ones((4, 2, 8), np.float32), np.ones((4, 2, 8), np.float32))
    with mk.Cpu() as cpu:
        assert cpu.info().last_call_items == 0
        cpu.attention(arena, 0, plan, np.ones((4, 2, 8), np.float32))
        assert cpu.info().last_call_items >= 1


def test_graph_capture_replays_a_step():
    _gpu_or_skip()
    torch = pytest.importorskip("torch", reason="the GPU graph test feeds torch CUDA tensors")
    with mk.Cuda() as cu, mk.CudaStore(cu, 16, 16, 1, 1, 64, dtype="f16") as st:
        a = st.arena()
        r = a.add_request()
        a.admit([(r, 8)])
        plan = a.plan_build([(r, 8)], mk.Plan(2, 16, 8), pad=(2, 16, 16, 16))
        dplan = st.upload_plan(plan)
        k = torch.randn(16, 1, 64, device="cuda", dtype=torch.float16)
        q = torch.randn(16, 1, 64, device="cuda", dtype=torch.float16)
        out = torch.zeros_like(q)
        st.capture_begin()
        st.write_kv(0, dplan, k, k)
        st.attention(0, dplan, q, out)
        with st.capture_end() as g:
            g.launch()
            st.sync()
            assert torch.isfinite(out[:8].float()).all()


def test_shards_need_a_context():
    with pytest.raises(mk.InvalidArgumentError):
        mk.CudaShards([], 16, 16, 1, 2, 64)
    with pytest.raises(TypeError, match=r"contexts\[0\]"):
        mk.CudaShards(["gpu0"], 16, 16, 1, 2, 64)


def test_shards_split_the_heads_over_devices():
    _gpu_or_skip()
    with mk.Cuda() as cu, mk.CudaShards([cu, cu], 16, 16, 1, 2, 64) as sh:
        assert sh.count == 2
        assert sh.store(0).desc.kv_heads == 1
        a = sh.arena()
        r = a.add_request()
        a.admit([(r, 4)])
        plan = a.plan_build([(r, 4)], mk.Plan(1, 4, 4))
        assert len(sh.plan_upload(plan)) == 2
        a.commit([(r, 4)])
        sh.publish([(r, 4)])
        sh.sync()


class _FakeLib:
    """Stands in for the library: records the graph calls, fails none."""

    def __init__(self):
        self.calls = []

    def mskv_cuda_capture_begin(self, st):
        self.calls.append(("begin", st))
        return 0

    def mskv_cuda_capture_end(self, st, out):
        out._obj.value = 0xD00D
        self.calls.append(("end", st))
        return 0

    def mskv_cuda_graph_launch(self, st, g):
        self.calls.append(("launch", st, g))
        return 0

    def mskv_cuda_graph_destroy(self, st, g):
        self.calls.append(("destroy", st, g))

    def mskv_cuda_store_destroy(self, st):
        self.calls.append(("store_destroy", st))


def test_a_graph_is_destroyed_once_and_before_its_store(monkeypatch):
    fake = _FakeLib()
    monkeypatch.setattr(mk._ffi, "lib", fake)
    st = object.__new__(mk.CudaStore)

    class _Ctx:
        def _call(self, function, *args):
            assert getattr(fake, function)(*args) == 0
    st._ptr, st._cuda, st._arenas = 0x5700, _Ctx(), set()
    st.capture_begin()
    g = st.capture_end()
    g.launch()
    st.close()
    assert fake.calls == [("begin", 0x5700), ("end", 0x5700), ("launch", 0x5700, 0xD00D),
                          ("destroy", 0x5700, 0xD00D), ("store_destroy", 0x5700)]
    g.close()                                  # already gone with the store: nothing more
    assert len(fake.calls) == 5
    with pytest.raises(mk.MskvError, match="closed"):
        g.launch()
