"""python -m mstar_kv: what this installation has and finds. The version,
the library loaded, the CPU attention path chosen, and whether the CUDA
driver, NVRTC and UCX were found (and why not)."""
import os
import sys
from typing import List, Optional, TextIO

import mstar_kv as mk


def _nvrtc() -> "tuple":
    try:
        mk.cuda_compile(arch=80, ptx=True, kernel_source='extern "C" __global__ void mskv_probe(void) {}\n',
                        disable_disk_cache=True)
        return True, "compiled a test kernel"
    except mk.MskvError as e:
        return False, e.detail or str(e)


def report() -> List[str]:
    """The lines python -m mstar_kv prints."""
    lines = ["mstar_kv %s" % mk.__version__, "library: %s" % mk.library_path]
    if os.environ.get("MSKV_LIBRARY"):
        lines[-1] += " (MSKV_LIBRARY)"
    with mk.Cpu() as cpu:
        info = cpu.info()
    avail = [name for name, ok in mk.cpu_isas().items() if ok and name != "auto"]
    env = os.environ.get("MSKV_CPU_ISA")
    lines.append("cpu isa: %s (available: %s%s)" % (mk.cpu_isa_name(info.isa), ", ".join(avail),
                                                   "; MSKV_CPU_ISA=%s" % env if env else ""))
    ok, devices, version, why = mk.cuda_probe_driver()
    if ok:
        lines.append("cuda driver: yes (%d device%s, driver %d.%d)" % (devices, "" if devices == 1 else "s",
                                                                      version // 1000, version % 1000 // 10))
    else:
        lines.append("cuda driver: no (%s)" % why)
    ok_n, why_n = _nvrtc()
    lines.append("nvrtc: %s (%s)" % ("yes" if ok_n else "no", why_n))
    ok_c, why_c = mk.cuda_probe()
    lines.append("cuda: %s" % ("yes: the GPU layer can create a context" if ok_c else "no (%s)" % why_c))
    try:
        ok_u, why_u = mk.ucx_probe()
        lines.append("ucx: %s" % ("yes (%s)" % why_u if ok_u else "no (%s)" % why_u))
    except mk.UnsupportedError as e:
        lines.append("ucx: no (%s)" % e)
    return lines


def main(argv: Optional[List[str]] = None, out: TextIO = sys.stdout) -> int:
    """Prints report(), one fact a line; returns the exit status (0)."""
    for line in report():
        print(line, file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
