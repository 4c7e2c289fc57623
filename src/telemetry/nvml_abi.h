#pragma once
// The few NVML types, constants and function signatures scalelab uses, declared from NVIDIA's
// documented API (NVML API Reference, docs.nvidia.com/deploy/nvml-api) so that the build needs no
// nvml.h and the binary no libnvidia-ml at link time: the library is dlopen'ed at run time.
// Only layouts that are stable across driver releases are used (see the notes per struct).
#include <cstdint>

namespace scalelab::nvml_abi {

using Return = int;  // nvmlReturn_t
using Device = struct DeviceOpaque*;  // nvmlDevice_t

// nvmlReturn_t values used here.
inline constexpr Return kSuccess = 0;
inline constexpr Return kErrorUninitialized = 1;
inline constexpr Return kErrorInvalidArgument = 2;
inline constexpr Return kErrorNotSupported = 3;
inline constexpr Return kErrorNoPermission = 4;
inline constexpr Return kErrorNotFound = 6;
inline constexpr Return kErrorInsufficientSize = 7;
inline constexpr Return kErrorDriverNotLoaded = 9;
inline constexpr Return kErrorFunctionNotFound = 13;
inline constexpr Return kErrorGpuIsLost = 15;
inline constexpr Return kErrorArgumentVersionMismatch = 25;
inline constexpr Return kErrorGpuNotFound = 28;
inline constexpr Return kErrorUnknown = 999;

inline constexpr unsigned kDeviceNameBufferSize = 96;  // NVML_DEVICE_NAME_V2_BUFFER_SIZE
inline constexpr unsigned kDeviceUuidBufferSize = 96;  // NVML_DEVICE_UUID_V2_BUFFER_SIZE

// nvmlTemperatureSensors_t, nvmlClockType_t, nvmlPcieUtilCounter_t.
inline constexpr unsigned kTemperatureGpu = 0;
inline constexpr unsigned kClockSm = 1;
inline constexpr unsigned kClockMem = 2;
inline constexpr unsigned kPcieUtilTxBytes = 0;
inline constexpr unsigned kPcieUtilRxBytes = 1;

// nvmlClocksEventReasons (formerly nvmlClocksThrottleReasons) bits.
inline constexpr std::uint64_t kClocksEventGpuIdle = 0x1;
inline constexpr std::uint64_t kClocksEventApplicationsClocksSetting = 0x2;
inline constexpr std::uint64_t kClocksEventSwPowerCap = 0x4;
inline constexpr std::uint64_t kClocksEventHwSlowdown = 0x8;
inline constexpr std::uint64_t kClocksEventSyncBoost = 0x10;
inline constexpr std::uint64_t kClocksEventSwThermalSlowdown = 0x20;
inline constexpr std::uint64_t kClocksEventHwThermalSlowdown = 0x40;
inline constexpr std::uint64_t kClocksEventHwPowerBrakeSlowdown = 0x80;
inline constexpr std::uint64_t kClocksEventDisplayClockSetting = 0x100;

struct Utilization {  // nvmlUtilization_t
  unsigned int gpu;     // % of time a kernel ran over the last sample period
  unsigned int memory;  // % of time device memory was read or written
};

struct Memory {  // nvmlMemory_t (v1): `used` includes memory the driver reserves
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

struct MemoryV2 {  // nvmlMemory_v2_t: `used` excludes `reserved`
  unsigned int version;
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;
};
// NVML_STRUCT_VERSION(Memory, 2): the struct's size with the version number in the top byte.
inline constexpr unsigned int kMemoryV2Version =
    static_cast<unsigned int>(sizeof(MemoryV2)) | (2u << 24);
static_assert(sizeof(MemoryV2) == 40, "nvmlMemory_v2_t is 40 bytes on LP64");

// nvmlProcessInfo_v1_t (for nvmlDeviceGetComputeRunningProcesses) and nvmlProcessInfo_v2_t (for
// the _v2 entry point). The _v3 entry point is not used: its struct gained a field in some driver
// headers and lost it again, so its layout depends on the driver.
struct ProcessInfoV1 {
  unsigned int pid;
  unsigned long long used_gpu_memory;
};
struct ProcessInfoV2 {
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};

// Function signatures (the names are the exported symbols).
using InitFn = Return (*)();                                       // nvmlInit_v2, nvmlInit
using ShutdownFn = Return (*)();                                   // nvmlShutdown
using ErrorStringFn = const char* (*)(Return);                     // nvmlErrorString
using DeviceGetCountFn = Return (*)(unsigned int*);                // nvmlDeviceGetCount_v2
using DeviceGetHandleByIndexFn = Return (*)(unsigned int, Device*);  // ..._v2
using DeviceGetStringFn = Return (*)(Device, char*, unsigned int);  // GetName, GetUUID
using DeviceGetUtilizationRatesFn = Return (*)(Device, Utilization*);
using DeviceGetMemoryInfoFn = Return (*)(Device, Memory*);
using DeviceGetMemoryInfoV2Fn = Return (*)(Device, MemoryV2*);
using DeviceGetTemperatureFn = Return (*)(Device, unsigned int /*sensor*/, unsigned int* /*C*/);
using DeviceGetPowerUsageFn = Return (*)(Device, unsigned int* /*mW*/);
using DeviceGetTotalEnergyConsumptionFn = Return (*)(Device, unsigned long long* /*mJ*/);
using DeviceGetClockInfoFn = Return (*)(Device, unsigned int /*type*/, unsigned int* /*MHz*/);
using DeviceGetPcieThroughputFn = Return (*)(Device, unsigned int /*counter*/, unsigned int* /*KB/s*/);
using DeviceGetClocksEventReasonsFn = Return (*)(Device, unsigned long long*);
using DeviceGetProcessesV1Fn = Return (*)(Device, unsigned int*, ProcessInfoV1*);
using DeviceGetProcessesV2Fn = Return (*)(Device, unsigned int*, ProcessInfoV2*);

}  // namespace scalelab::nvml_abi
