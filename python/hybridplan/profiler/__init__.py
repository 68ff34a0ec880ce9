"""Profiles a torch.nn.Module into a Graph: `profile` (a validated hybridplan Graph) and
`profile_dict` (its JSON as a dict), measured on a device or, without materialising the model,
run under fake tensors and priced by a device model (fake_profile, device_model). Modules named
after their C++ twins in csrc/profiler: block_list (the node rule), block_timing (splitting a
step's time among nodes), profile; plus dataflow (edges) and stage_split (where the module can
be cut into pipeline stages)."""

from . import device_model
from .device_model import DeviceModel, measure_cpu
from .profile import profile, profile_dict

__all__ = ["profile", "profile_dict", "device_model", "DeviceModel", "measure_cpu"]
