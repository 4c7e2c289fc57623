#pragma once
// Matching physical GPUs (as NVML and nvidia-smi number them) to CUDA ordinals.
//
// CUDA numbers the devices a process sees 0..k-1 in the order CUDA_VISIBLE_DEVICES lists them.
// Each entry is a device index (NVML/PCI order) or a UUID ("GPU-8f6c...", a unique prefix is
// enough), separated by commas. As CUDA does, the list ends at the first entry that names no
// device (an index out of range, an unknown or ambiguous UUID, a duplicate); an empty value hides
// every device. Unset means every device, in NVML order.
//
// Caveats (see docs/telemetry.md): index entries assume CUDA_DEVICE_ORDER=PCI_BUS_ID (NVML's
// order), which is CUDA's order too on machines with one GPU model; MIG entries ("MIG-...") are
// not resolved (the list ends there, with a note).
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace scalelab {

struct GpuIdentity {
  unsigned index = 0;  // NVML / nvidia-smi index
  std::string uuid;    // "GPU-..."
};

struct VisibleMapping {
  // ordinal_to_gpu[o] is the position in the `gpus` argument of CUDA ordinal o.
  std::vector<std::size_t> ordinal_to_gpu;
  // Why the list ended early ("" when every entry named a device).
  std::string note;
};

// Maps CUDA ordinals to entries of `gpus`. `visible` is the CUDA_VISIBLE_DEVICES value (nullopt:
// the variable is unset).
VisibleMapping map_cuda_visible_devices(const std::optional<std::string>& visible,
                                        const std::vector<GpuIdentity>& gpus);

// The CUDA_VISIBLE_DEVICES value of this process, nullopt when unset.
std::optional<std::string> cuda_visible_devices_from_env();

// "cuda:<ordinal>": the device name every GPU source uses, so that their series line up.
std::string cuda_device_name(int ordinal);

}  // namespace scalelab
