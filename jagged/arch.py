"""What the kernels need to know of the target architecture, without a driver call at
import: the shared-memory limit per CTA and the SM count of a device (cached)."""
from __future__ import annotations

import torch

# the most dynamic shared memory a CTA may ask for, by compute capability (major*10)
SMEM_LIMIT = {90: 227 * 1024, 100: 227 * 1024}

_NUM_SMS: dict[int, int] = {}


def num_sms(device) -> int:
    """Multiprocessor count of `device` (a torch.device), read once per device."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    n = _NUM_SMS.get(idx)
    if n is None:
        n = _NUM_SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return n
