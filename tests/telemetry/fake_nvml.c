/* A fake libnvidia-ml for the telemetry tests: the real dlopen path, with scripted answers.
 *
 * nvmlInit_v2 reads the script named by $FAKE_NVML_SCRIPT (and resets all counters), lines:
 *   device <i> <uuid> <name...>        a GPU at NVML index i (declare them in index order)
 *   <field> <i> <v1> <v2> ...          the field's value at the 1st, 2nd, ... call; the last holds
 *   <field> <i> not_supported          the field answers NVML_ERROR_NOT_SUPPORTED
 *   <field> <i> error <code>           the field answers that nvmlReturn_t
 *   lost <i> <n>                       from the (n+1)-th nvmlDeviceGetUtilizationRates call on,
 *                                      every call on device i answers NVML_ERROR_GPU_IS_LOST
 *   procs <i> <pid>:<bytes> ...        the compute processes on device i
 *   mem_v2 mismatch                    nvmlDeviceGetMemoryInfo_v2 answers ARGUMENT_VERSION_MISMATCH
 *   init error <code>                  nvmlInit_v2 answers that code
 * Fields: gpu_util mem_util mem_total mem_used mem_reserved temperature power_mw energy_mj
 *         sm_clock mem_clock pcie_tx pcie_rx clocks_event. A field without a line answers 0.
 * Memory: v2 gives total/reserved/used as scripted; v1 reports used + reserved as used.
 * nvmlDeviceGetMemoryInfo_v2 checks the struct version as the real driver does.
 *
 * Built twice: in full, and with FAKE_NVML_MINIMAL, which leaves out the symbols a driver may
 * lack (nvmlDeviceGetTotalEnergyConsumption, nvmlDeviceGetMemoryInfo_v2,
 * nvmlDeviceGetCurrentClocksEventReasons, nvmlDeviceGetComputeRunningProcesses_v2).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
  OK = 0,
  ERR_UNINITIALIZED = 1,
  ERR_INVALID_ARGUMENT = 2,
  ERR_NOT_SUPPORTED = 3,
  ERR_INSUFFICIENT_SIZE = 7,
  ERR_GPU_IS_LOST = 15,
  ERR_ARGUMENT_VERSION_MISMATCH = 25,
};

enum {
  F_GPU_UTIL, F_MEM_UTIL, F_MEM_TOTAL, F_MEM_USED, F_MEM_RESERVED, F_TEMPERATURE, F_POWER_MW,
  F_ENERGY_MJ, F_SM_CLOCK, F_MEM_CLOCK, F_PCIE_TX, F_PCIE_RX, F_CLOCKS_EVENT, F_COUNT
};
static const char* kFieldNames[F_COUNT] = {
    "gpu_util", "mem_util", "mem_total", "mem_used", "mem_reserved", "temperature", "power_mw",
    "energy_mj", "sm_clock", "mem_clock", "pcie_tx", "pcie_rx", "clocks_event"};

#define MAX_DEVICES 8
#define MAX_VALUES 64
#define MAX_PROCS 16

struct Field {
  int n;
  double v[MAX_VALUES];
  int calls;
  int error; /* non-zero: answer this */
};

struct Device {
  int present;
  char uuid[96];
  char name[96];
  struct Field f[F_COUNT];
  int lost_after; /* -1: never */
  int util_answers;
  int gone;
  int nprocs;
  unsigned pids[MAX_PROCS];
  unsigned long long proc_bytes[MAX_PROCS];
};

static struct Device g_dev[MAX_DEVICES];
static int g_count;
static int g_initialized;
static int g_mem_v2_mismatch;
static int g_init_error;

static void load_script(void) {
  memset(g_dev, 0, sizeof g_dev);
  for (int i = 0; i < MAX_DEVICES; ++i) g_dev[i].lost_after = -1;
  g_count = 0;
  g_mem_v2_mismatch = 0;
  g_init_error = 0;
  const char* path = getenv("FAKE_NVML_SCRIPT");
  if (!path) return;
  FILE* f = fopen(path, "r");
  if (!f) return;
  char line[1024];
  while (fgets(line, sizeof line, f)) {
    char* save = NULL;
    char* tok = strtok_r(line, " \t\r\n", &save);
    if (!tok || tok[0] == '#') continue;
    if (strcmp(tok, "mem_v2") == 0) {
      g_mem_v2_mismatch = 1;
      continue;
    }
    if (strcmp(tok, "init") == 0) {
      strtok_r(NULL, " \t\r\n", &save); /* "error" */
      char* code = strtok_r(NULL, " \t\r\n", &save);
      g_init_error = code ? atoi(code) : 999;
      continue;
    }
    char* idx = strtok_r(NULL, " \t\r\n", &save);
    if (!idx) continue;
    const int i = atoi(idx);
    if (i < 0 || i >= MAX_DEVICES) continue;
    struct Device* d = &g_dev[i];
    if (strcmp(tok, "device") == 0) {
      char* uuid = strtok_r(NULL, " \t\r\n", &save);
      char* rest = strtok_r(NULL, "\r\n", &save);
      d->present = 1;
      snprintf(d->uuid, sizeof d->uuid, "%s", uuid ? uuid : "GPU-unknown");
      snprintf(d->name, sizeof d->name, "%s", rest ? rest : "Fake GPU");
      if (i + 1 > g_count) g_count = i + 1;
      continue;
    }
    if (strcmp(tok, "lost") == 0) {
      char* n = strtok_r(NULL, " \t\r\n", &save);
      d->lost_after = n ? atoi(n) : 0;
      continue;
    }
    if (strcmp(tok, "procs") == 0) {
      char* p;
      while ((p = strtok_r(NULL, " \t\r\n", &save)) && d->nprocs < MAX_PROCS) {
        unsigned pid = 0;
        unsigned long long bytes = 0;
        if (sscanf(p, "%u:%llu", &pid, &bytes) == 2) {
          d->pids[d->nprocs] = pid;
          d->proc_bytes[d->nprocs] = bytes;
          ++d->nprocs;
        }
      }
      continue;
    }
    for (int k = 0; k < F_COUNT; ++k) {
      if (strcmp(tok, kFieldNames[k]) != 0) continue;
      struct Field* fl = &d->f[k];
      char* v;
      while ((v = strtok_r(NULL, " \t\r\n", &save))) {
        if (strcmp(v, "not_supported") == 0) {
          fl->error = ERR_NOT_SUPPORTED;
        } else if (strcmp(v, "error") == 0) {
          char* code = strtok_r(NULL, " \t\r\n", &save);
          fl->error = code ? atoi(code) : 999;
        } else if (fl->n < MAX_VALUES) {
          fl->v[fl->n++] = strtod(v, NULL);
        }
      }
    }
  }
  fclose(f);
}

/* The device behind a handle, or NULL. */
static struct Device* dev_of(void* handle) {
  struct Device* d = (struct Device*)handle;
  if (d < g_dev || d >= g_dev + MAX_DEVICES || !d->present) return NULL;
  return d;
}

static int is_lost(const struct Device* d) { return d->gone; }

/* Next scripted value of a field: returns an error code or OK with *out set. */
static nvmlReturn_t next_value(struct Device* d, int field, double* out) {
  struct Field* f = &d->f[field];
  if (f->error) return f->error;
  const int i = f->calls < f->n ? f->calls : f->n - 1;
  *out = f->n > 0 ? f->v[i] : 0.0;
  ++f->calls;
  return OK;
}

#define CHECK_DEVICE(handle)                   \
  struct Device* d = dev_of(handle);           \
  if (!g_initialized) return ERR_UNINITIALIZED; \
  if (!d) return ERR_INVALID_ARGUMENT;         \
  if (is_lost(d)) return ERR_GPU_IS_LOST;

EXPORT nvmlReturn_t nvmlInit_v2(void) {
  load_script();
  if (g_init_error) return g_init_error;
  g_initialized = 1;
  return OK;
}

EXPORT nvmlReturn_t nvmlShutdown(void) {
  if (!g_initialized) return ERR_UNINITIALIZED;
  g_initialized = 0;
  return OK;
}

EXPORT const char* nvmlErrorString(nvmlReturn_t rc) {
  switch (rc) {
    case OK: return "Success";
    case ERR_UNINITIALIZED: return "Uninitialized";
    case ERR_INVALID_ARGUMENT: return "Invalid Argument";
    case ERR_NOT_SUPPORTED: return "Not Supported";
    case ERR_GPU_IS_LOST: return "GPU is lost";
    case ERR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case 9: return "Driver Not Loaded";
    default: return "Unknown Error";
  }
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  if (!g_initialized) return ERR_UNINITIALIZED;
  *count = (unsigned)g_count;
  return OK;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, void** handle) {
  if (!g_initialized) return ERR_UNINITIALIZED;
  if (index >= (unsigned)g_count || !g_dev[index].present) return ERR_INVALID_ARGUMENT;
  *handle = &g_dev[index];
  return OK;
}

EXPORT nvmlReturn_t nvmlDeviceGetName(void* handle, char* name, unsigned int length) {
  CHECK_DEVICE(handle);
  if (strlen(d->name) + 1 > length) return ERR_INSUFFICIENT_SIZE;
  strcpy(name, d->name);
  return OK;
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(void* handle, char* uuid, unsigned int length) {
  CHECK_DEVICE(handle);
  if (strlen(d->uuid) + 1 > length) return ERR_INSUFFICIENT_SIZE;
  strcpy(uuid, d->uuid);
  return OK;
}

typedef struct {
  unsigned int gpu, memory;
} Utilization;

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(void* handle, Utilization* u) {
  struct Device* dd = dev_of(handle);
  /* The reading after the n-th one starts with this call: the device is gone from here on. */
  if (dd && dd->lost_after >= 0 && dd->util_answers >= dd->lost_after) dd->gone = 1;
  CHECK_DEVICE(handle);
  double g = 0, m = 0;
  nvmlReturn_t rc = next_value(d, F_GPU_UTIL, &g);
  if (rc == OK) rc = next_value(d, F_MEM_UTIL, &m);
  if (rc != OK) return rc;
  u->gpu = (unsigned)g;
  u->memory = (unsigned)m;
  ++d->util_answers;
  return OK;
}

typedef struct {
  unsigned long long total, free, used;
} MemoryV1;
typedef struct {
  unsigned int version;
  unsigned long long total, reserved, free, used;
} MemoryV2;

static nvmlReturn_t memory_values(struct Device* d, double* total, double* reserved, double* used) {
  nvmlReturn_t rc = next_value(d, F_MEM_TOTAL, total);
  if (rc == OK) rc = next_value(d, F_MEM_RESERVED, reserved);
  if (rc == OK) rc = next_value(d, F_MEM_USED, used);
  return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(void* handle, MemoryV1* m) {
  CHECK_DEVICE(handle);
  double total, reserved, used;
  nvmlReturn_t rc = memory_values(d, &total, &reserved, &used);
  if (rc != OK) return rc;
  m->total = (unsigned long long)total;
  m->used = (unsigned long long)(used + reserved);
  m->free = m->total - m->used;
  return OK;
}

#ifndef FAKE_NVML_MINIMAL
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void* handle, MemoryV2* m) {
  CHECK_DEVICE(handle);
  if (g_mem_v2_mismatch) return ERR_ARGUMENT_VERSION_MISMATCH;
  if (m->version != ((unsigned)sizeof(MemoryV2) | (2u << 24))) return ERR_ARGUMENT_VERSION_MISMATCH;
  double total, reserved, used;
  nvmlReturn_t rc = memory_values(d, &total, &reserved, &used);
  if (rc != OK) return rc;
  m->total = (unsigned long long)total;
  m->reserved = (unsigned long long)reserved;
  m->used = (unsigned long long)used;
  m->free = m->total - m->reserved - m->used;
  return OK;
}
#endif

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(void* handle, unsigned sensor, unsigned* t) {
  CHECK_DEVICE(handle);
  if (sensor != 0) return ERR_INVALID_ARGUMENT;
  double v;
  nvmlReturn_t rc = next_value(d, F_TEMPERATURE, &v);
  if (rc == OK) *t = (unsigned)v;
  return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(void* handle, unsigned* mw) {
  CHECK_DEVICE(handle);
  double v;
  nvmlReturn_t rc = next_value(d, F_POWER_MW, &v);
  if (rc == OK) *mw = (unsigned)v;
  return rc;
}

#ifndef FAKE_NVML_MINIMAL
EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(void* handle, unsigned long long* mj) {
  CHECK_DEVICE(handle);
  double v;
  nvmlReturn_t rc = next_value(d, F_ENERGY_MJ, &v);
  if (rc == OK) *mj = (unsigned long long)v;
  return rc;
}
#endif

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(void* handle, unsigned type, unsigned* mhz) {
  CHECK_DEVICE(handle);
  double v;
  nvmlReturn_t rc;
  if (type == 1) {
    rc = next_value(d, F_SM_CLOCK, &v);
  } else if (type == 2) {
    rc = next_value(d, F_MEM_CLOCK, &v);
  } else {
    return ERR_INVALID_ARGUMENT;
  }
  if (rc == OK) *mhz = (unsigned)v;
  return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetPcieThroughput(void* handle, unsigned counter, unsigned* kb) {
  CHECK_DEVICE(handle);
  double v;
  nvmlReturn_t rc;
  if (counter == 0) {
    rc = next_value(d, F_PCIE_TX, &v);
  } else if (counter == 1) {
    rc = next_value(d, F_PCIE_RX, &v);
  } else {
    return ERR_INVALID_ARGUMENT;
  }
  if (rc == OK) *kb = (unsigned)v;
  return rc;
}

static nvmlReturn_t clocks_event(void* handle, unsigned long long* mask) {
  CHECK_DEVICE(handle);
  double v;
  nvmlReturn_t rc = next_value(d, F_CLOCKS_EVENT, &v);
  if (rc == OK) *mask = (unsigned long long)v;
  return rc;
}

#ifndef FAKE_NVML_MINIMAL
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(void* handle, unsigned long long* mask) {
  return clocks_event(handle, mask);
}
#endif

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(void* handle, unsigned long long* mask) {
  return clocks_event(handle, mask);
}

typedef struct {
  unsigned int pid;
  unsigned long long used;
} ProcV1;
typedef struct {
  unsigned int pid;
  unsigned long long used;
  unsigned int gi, ci;
} ProcV2;

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(void* handle, unsigned* count, ProcV1* p) {
  CHECK_DEVICE(handle);
  if (*count < (unsigned)d->nprocs) {
    *count = (unsigned)d->nprocs;
    return ERR_INSUFFICIENT_SIZE;
  }
  for (int i = 0; i < d->nprocs; ++i) {
    p[i].pid = d->pids[i];
    p[i].used = d->proc_bytes[i];
  }
  *count = (unsigned)d->nprocs;
  return OK;
}

#ifndef FAKE_NVML_MINIMAL
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(void* handle, unsigned* count, ProcV2* p) {
  CHECK_DEVICE(handle);
  if (*count < (unsigned)d->nprocs) {
    *count = (unsigned)d->nprocs;
    return ERR_INSUFFICIENT_SIZE;
  }
  for (int i = 0; i < d->nprocs; ++i) {
    p[i].pid = d->pids[i];
    p[i].used = d->proc_bytes[i];
    p[i].gi = p[i].ci = 0xFFFFFFFFu;
  }
  *count = (unsigned)d->nprocs;
  return OK;
}
#endif
