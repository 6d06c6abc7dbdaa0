"""gpu/affinity.py: NVML's CPU masks and the kernel's CPU lists, and the fake's answer."""

from __future__ import annotations

import pynvml
import pytest

from nodeagent.gpu.affinity import cpu_list, cpus_of_mask, mask_of_cpus, mask_words, parse_cpu_list
from nodeagent.gpu.fake import FakeNvml
from nodeagent.gpu.nvml import NvmlBackend


def test_a_mask_and_a_list_name_the_same_cpus_both_ways() -> None:
    cpus = (0, 1, 2, 3, 63, 64, 65, 130)
    words = mask_of_cpus(cpus, mask_words(192))
    assert words == [(1 << 4) - 1 | 1 << 63, 0b11, 1 << 2]
    assert cpus_of_mask(words) == cpus
    assert cpu_list(cpus) == "0-3,63-65,130"
    assert parse_cpu_list("0-3,63-65,130") == cpus
    assert parse_cpu_list(" 5, 1-2 ,") == (1, 2, 5)
    assert mask_words(1) == 1 and mask_words(64) == 1 and mask_words(65) == 2
    assert mask_of_cpus([200], 1) == [0]  # beyond the mask: left out, as NVML does


@pytest.mark.parametrize("text", ["3-1", "-1", "a", "1-b"])
def test_a_bad_cpu_list_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cpu_list(text)


def test_the_backend_reads_each_gpus_cpus_from_nvml_and_none_where_not_said() -> None:
    fake = FakeNvml({"gpus": [{"uuid": "GPU-a", "cpus": "0-1"}, {"uuid": "GPU-b"}]})
    backend = NvmlBackend(fake)
    backend.open()
    first, second = backend.sample()
    assert first.cpus == (0, 1) and second.cpus == ()
    with pytest.raises(pynvml.NVMLError):
        fake.nvmlDeviceGetCpuAffinity(fake.nvmlDeviceGetHandleByIndex(1), 2)
