"""core.device: what /stats `device`, /fit and the memory budget read from
MLX's own report, for each backend's shape of it (the CUDA keys are those of
MLX's mlx/backend/cuda/device_info.cpp; this machine has no GPU, so the
GPU shapes are fed in), and the no-MLX guess the command line makes."""
from __future__ import annotations

import os
import sys

from core import device

RAM = 64 << 30


def test_an_nvidia_card_reports_its_own_memory():
    info = {"device_name": "NVIDIA H200", "architecture": "sm_90", "uuid": "GPU-1", "pci_bus_id": "0000:01:00.0",
            "compute_capability_major": 9, "compute_capability_minor": 0, "free_memory": 140 << 30,
            "total_memory": 143 << 30}
    assert device.summarize(True, "cuda", info, RAM) == {
        "type": "gpu", "backend": "cuda", "name": "NVIDIA H200", "memory_bytes": 143 << 30}


def test_metal_and_the_cpu_use_the_machines_ram():
    metal = {"device_name": "Apple M3 Max", "architecture": "applegpu_g15s", "memory_size": RAM,
             "max_recommended_working_set_size": 48 << 30}
    assert device.summarize(True, "metal", metal, RAM) == {
        "type": "gpu", "backend": "metal", "name": "Apple M3 Max", "memory_bytes": RAM}
    cpu = {"device_name": "Intel(R) Xeon(R) Processor", "architecture": "x86_64"}
    assert device.summarize(False, "cpu", cpu, RAM) == {
        "type": "cpu", "backend": "cpu", "name": "Intel(R) Xeon(R) Processor", "memory_bytes": RAM}


def test_this_machine():
    """On Linux without both an NVIDIA driver and MLX's CUDA build (this CPU
    machine), MLX computes on the CPU, with a BLAS chosen."""
    if sys.platform != "linux":
        return
    expected = os.path.exists(device.NVIDIA_DRIVER) and device.cuda_build_installed()
    assert device.gpu_expected() is expected
    assert (device.describe()["type"] == "gpu") is expected
    if not expected:
        from core.blas import cpu_model

        assert device.planned_line().startswith(f"CPU ({cpu_model()}), BLAS: ")
        assert device.card()["type"] == "cpu" and device.card()["memory_bytes"] == device.ram_bytes()
        described = device.describe()
        assert described["type"] == "cpu" and described["memory_bytes"] == device.ram_bytes() > 0
