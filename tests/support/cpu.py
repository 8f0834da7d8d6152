"""What the test machine's CPU offers (the fused kernels need AVX-512F)."""
from __future__ import annotations

from pathlib import Path

AVX512F = "avx512f" in Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else False
