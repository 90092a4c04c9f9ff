/*
 * libnvidia-ml.so.1 for simcuda: a simulated NVML (NVIDIA Management Library).
 *
 * Why it exists: a real NVIDIA driver always installs NVML beside libcuda.so.1, and the
 * real PyTorch CUDA wheel relies on that.  c10's DriverAPI dlopens libnvidia-ml.so.1,
 * asserts that some symbols exist, and (with expandable segments) calls nvmlInit_v2
 * through a pointer it never checks; without this library the process jumps to address
 * 0.  NCCL, NVSHMEM, tensorpipe and torch's Python (ctypes) use NVML too.
 *
 * What it reports: the devices simcuda's driver simulates, with the identity from
 * identity.h (name, UUID, PCI location, compute capability), so that a client that
 * matches CUDA devices to NVML devices (by UUID or PCI bus id) finds the same ones.
 * Memory figures come from the driver itself (simcuda_memory_info) when it is loaded,
 * so NVML and cuMemGetInfo agree.  Everything a plain H100 node without NVSwitch or
 * NVLink bridges would lack (fabric, NVLink, P2P, NUMA, MIG instances) is answered the
 * way such a node answers.
 *
 * The ABI (struct layouts, enum values, return codes, versioned-struct constants) is
 * NVIDIA's nvml.h; the declarations below restate the parts that are used.  Only the
 * functions that PyTorch 2.15 and the libraries it ships reference are exported; see
 * README.md in this directory for the list and for where this differs from real NVML.
 */
#define _GNU_SOURCE /* RTLD_DEFAULT, RTLD_NOLOAD */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "identity.h"
#include "size_setting.h"

#define NVML_API __attribute__((visibility("default")))

/* ---- The parts of nvml.h this library implements ------------------------------------ */

typedef enum nvmlReturn_enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_FREQ_NOT_SUPPORTED = 24,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_DEPRECATED = 26,
    NVML_ERROR_NOT_READY = 27,
    NVML_ERROR_GPU_NOT_FOUND = 28,
    NVML_ERROR_INVALID_STATE = 29,
    NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30,
    NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

#define NVML_STRUCT_VERSION(data, ver) \
    (unsigned int)(sizeof(nvml##data##_v##ver##_t) | ((unsigned)(ver) << 24U))

#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16
#define NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT "%04X:%02X:%02X.0"
#define NVML_DEVICE_PCI_BUS_ID_FMT "%08X:%02X:%02X.0"
#define NVML_NVLINK_MAX_LINKS 18
#define NVML_GPU_FABRIC_UUID_LEN 16

typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct nvmlPciInfo_st {
    char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfo_t;

typedef struct nvmlPciInfoExt_v1_st {
    unsigned int version;
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    unsigned int baseClass;
    unsigned int subClass;
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfoExt_v1_t;
#define nvmlPciInfoExt_v1 NVML_STRUCT_VERSION(PciInfoExt, 1)

typedef struct nvmlMemory_st {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct nvmlMemory_v2_st {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;
#define nvmlMemory_v2 NVML_STRUCT_VERSION(Memory, 2)

typedef struct nvmlBAR1Memory_st {
    unsigned long long bar1Total;
    unsigned long long bar1Free;
    unsigned long long bar1Used;
} nvmlBAR1Memory_t;

typedef struct nvmlUtilization_st {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

/* The three process-info layouts (unversioned symbol: v1; _v2 and _v3: v2).  No entry
 * is ever written, since no process is reported, but the types document the ABI. */
typedef struct nvmlProcessInfo_v1_st {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

typedef struct nvmlProcessInfo_v2_st {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t;

typedef unsigned char nvmlGpuFabricState_t;
#define NVML_GPU_FABRIC_STATE_NOT_SUPPORTED 0
#define NVML_GPU_FABRIC_STATE_NOT_STARTED 1
#define NVML_GPU_FABRIC_STATE_IN_PROGRESS 2
#define NVML_GPU_FABRIC_STATE_COMPLETED 3

typedef struct nvmlGpuFabricInfo_st {
    unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId;
    nvmlGpuFabricState_t state;
} nvmlGpuFabricInfo_t;

typedef struct nvmlGpuFabricInfo_v2_st {
    unsigned int version;
    unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId;
    nvmlGpuFabricState_t state;
    unsigned int healthMask;
} nvmlGpuFabricInfo_v2_t;

typedef struct nvmlGpuFabricInfo_v3_st {
    unsigned int version;
    unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId;
    nvmlGpuFabricState_t state;
    unsigned int healthMask;
    unsigned char healthSummary;
} nvmlGpuFabricInfo_v3_t;
typedef nvmlGpuFabricInfo_v3_t nvmlGpuFabricInfoV_t;
#define nvmlGpuFabricInfo_v2 NVML_STRUCT_VERSION(GpuFabricInfo, 2)
#define nvmlGpuFabricInfo_v3 NVML_STRUCT_VERSION(GpuFabricInfo, 3)

typedef enum nvmlGpuP2PStatus_enum {
    NVML_P2P_STATUS_OK = 0,
    NVML_P2P_STATUS_CHIPSET_NOT_SUPPORED,
    NVML_P2P_STATUS_GPU_NOT_SUPPORTED,
    NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED,
    NVML_P2P_STATUS_DISABLED_BY_REGKEY,
    NVML_P2P_STATUS_NOT_SUPPORTED,
    NVML_P2P_STATUS_UNKNOWN
} nvmlGpuP2PStatus_t;

typedef enum nvmlGpuP2PCapsIndex_enum {
    NVML_P2P_CAPS_INDEX_READ = 0,
    NVML_P2P_CAPS_INDEX_WRITE,
    NVML_P2P_CAPS_INDEX_NVLINK,
    NVML_P2P_CAPS_INDEX_ATOMICS,
    NVML_P2P_CAPS_INDEX_PCI,
    NVML_P2P_CAPS_INDEX_UNKNOWN
} nvmlGpuP2PCapsIndex_t;

typedef enum nvmlEnableState_enum { NVML_FEATURE_DISABLED = 0, NVML_FEATURE_ENABLED = 1 }
    nvmlEnableState_t;

typedef enum nvmlNvLinkCapability_enum {
    NVML_NVLINK_CAP_P2P_SUPPORTED = 0,
    NVML_NVLINK_CAP_SYSMEM_ACCESS = 1,
    NVML_NVLINK_CAP_P2P_ATOMICS = 2,
    NVML_NVLINK_CAP_SYSMEM_ATOMICS = 3,
    NVML_NVLINK_CAP_SLI_BRIDGE = 4,
    NVML_NVLINK_CAP_VALID = 5,
    NVML_NVLINK_CAP_COUNT
} nvmlNvLinkCapability_t;

typedef enum nvmlIntNvLinkDeviceType_enum {
    NVML_NVLINK_DEVICE_TYPE_GPU = 0x00,
    NVML_NVLINK_DEVICE_TYPE_IBMNPU = 0x01,
    NVML_NVLINK_DEVICE_TYPE_SWITCH = 0x02,
    NVML_NVLINK_DEVICE_TYPE_UNKNOWN = 0xFF
} nvmlIntNvLinkDeviceType_t;

typedef enum nvmlTemperatureSensors_enum { NVML_TEMPERATURE_GPU = 0, NVML_TEMPERATURE_COUNT }
    nvmlTemperatureSensors_t;

typedef struct nvmlTemperature_v1_st {
    unsigned int version;
    nvmlTemperatureSensors_t sensorType;
    int temperature;
} nvmlTemperature_v1_t;
#define nvmlTemperature_v1 NVML_STRUCT_VERSION(Temperature, 1)

typedef enum nvmlClockType_enum {
    NVML_CLOCK_GRAPHICS = 0,
    NVML_CLOCK_SM = 1,
    NVML_CLOCK_MEM = 2,
    NVML_CLOCK_VIDEO = 3,
    NVML_CLOCK_COUNT
} nvmlClockType_t;

typedef enum nvmlGpuVirtualizationMode {
    NVML_GPU_VIRTUALIZATION_MODE_NONE = 0,
    NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH = 1,
    NVML_GPU_VIRTUALIZATION_MODE_VGPU = 2,
    NVML_GPU_VIRTUALIZATION_MODE_HOST_VGPU = 3,
    NVML_GPU_VIRTUALIZATION_MODE_HOST_VSGA = 4
} nvmlGpuVirtualizationMode_t;

#define NVML_DEVICE_MIG_DISABLE 0x0
#define NVML_PCIE_LINK_MAX_SPEED_32000MBPS 0x00000005

typedef enum nvmlValueType_enum {
    NVML_VALUE_TYPE_DOUBLE = 0,
    NVML_VALUE_TYPE_UNSIGNED_INT = 1,
    NVML_VALUE_TYPE_UNSIGNED_LONG = 2,
    NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3,
    NVML_VALUE_TYPE_SIGNED_LONG_LONG = 4,
    NVML_VALUE_TYPE_SIGNED_INT = 5,
    NVML_VALUE_TYPE_UNSIGNED_SHORT = 6,
    NVML_VALUE_TYPE_COUNT
} nvmlValueType_t;

typedef union nvmlValue_st {
    double dVal;
    int siVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    signed long long sllVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct nvmlFieldValue_st {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    nvmlValueType_t valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

typedef struct nvmlPlatformInfo_v2_st {
    unsigned int version;
    unsigned char ibGuid[16];
    unsigned char chassisSerialNumber[16];
    unsigned char slotNumber;
    unsigned char trayIndex;
    unsigned char hostId;
    unsigned char peerType;
    unsigned char moduleId;
} nvmlPlatformInfo_v2_t;
typedef nvmlPlatformInfo_v2_t nvmlPlatformInfo_t;

/* Confidential computing: all-zero values mean "environment unavailable, feature
 * disabled, dev-tools mode disabled, multi-GPU protected PCIe off". */
typedef struct nvmlConfComputeSystemState_st {
    unsigned int environment;
    unsigned int ccFeature;
    unsigned int devToolsMode;
} nvmlConfComputeSystemState_t;

typedef struct nvmlSystemConfComputeSettings_v1_st {
    unsigned int version;
    unsigned int environment;
    unsigned int ccFeature;
    unsigned int devToolsMode;
    unsigned int multiGpuMode;
} nvmlSystemConfComputeSettings_v1_t;
#define nvmlSystemConfComputeSettings_v1 NVML_STRUCT_VERSION(SystemConfComputeSettings, 1)

/* Sizes as NVIDIA's headers give them on x86-64; a mismatch would corrupt callers. */
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t");
_Static_assert(sizeof(nvmlPciInfoExt_v1_t) == 64, "nvmlPciInfoExt_v1_t");
_Static_assert(sizeof(nvmlMemory_t) == 24, "nvmlMemory_t");
_Static_assert(nvmlMemory_v2 == 0x02000028u, "nvmlMemory_v2");
_Static_assert(sizeof(nvmlProcessInfo_v1_t) == 16, "nvmlProcessInfo_v1_t");
_Static_assert(sizeof(nvmlProcessInfo_v2_t) == 24, "nvmlProcessInfo_v2_t");
_Static_assert(sizeof(nvmlGpuFabricInfo_t) == 28, "nvmlGpuFabricInfo_t");
_Static_assert(nvmlGpuFabricInfo_v2 == 0x02000024u, "nvmlGpuFabricInfo_v2");
_Static_assert(nvmlGpuFabricInfo_v3 == 0x03000028u, "nvmlGpuFabricInfo_v3");
_Static_assert(nvmlPciInfoExt_v1 == 0x01000040u, "nvmlPciInfoExt_v1");
_Static_assert(nvmlTemperature_v1 == 0x0100000cu, "nvmlTemperature_v1");
_Static_assert(nvmlSystemConfComputeSettings_v1 == 0x01000014u, "ConfComputeSettings_v1");
_Static_assert(sizeof(nvmlFieldValue_t) == 40, "nvmlFieldValue_t");
_Static_assert(sizeof(nvmlPlatformInfo_v2_t) == 44, "nvmlPlatformInfo_v2_t");

/* ---- What this simulated system reports ---------------------------------------------- */

/* Driver branch R595, the production branch that CUDA 13.2 shipped with; the driver
 * reports CUDA 13.2 (SIM_DRIVER_VERSION in the driver), so NVML says the same. */
#define SIM_DRIVER_VERSION_STRING "595.45.04"
#define SIM_NVML_VERSION_STRING "13.595.45.04"
#define SIM_CUDA_DRIVER_VERSION 13020

/* Not in identity.h (only NVML reports them): the H100 SXM5 board's PCI subsystem id
 * (subsystem device 0x16c1, subsystem vendor NVIDIA), and its PCI class, 3D controller. */
#define SIM_PCI_SUBSYSTEM_ID 0x16c110deu
#define SIM_PCI_BASE_CLASS 0x03u
#define SIM_PCI_SUB_CLASS 0x02u

/* Same limits and defaults as the driver's configuration (driver/core.c). */
#define SIM_MAX_DEVICES 8
#define SIM_DEFAULT_MEMORY (16ull << 30)
#define SIM_MAX_MEMORY (1ull << 40)

/* Plausible H100 SXM5 figures for the monitoring queries, fixed so tests can rely on
 * them: boost clocks, an idle temperature and power draw, a 128 GiB BAR1. */
#define SIM_CLOCK_GRAPHICS_MHZ 1980u
#define SIM_CLOCK_SM_MHZ 1980u
#define SIM_CLOCK_MEM_MHZ 2619u
#define SIM_CLOCK_VIDEO_MHZ 1755u
#define SIM_TEMPERATURE_C 35u
#define SIM_POWER_MW 70000u
#define SIM_BAR1_BYTES (128ull << 30)
#define SIM_PCIE_GEN 5u
#define SIM_PCIE_WIDTH 16u

/* A device handle points at one of these; the index is all a device needs, since
 * everything else derives from it through identity.h. */
struct nvmlDevice_st {
    unsigned int index;
};

static struct nvmlDevice_st g_devices[SIM_MAX_DEVICES] = {
    {0}, {1}, {2}, {3}, {4}, {5}, {6}, {7},
};

/* nvmlInit/nvmlShutdown are reference counted as in real NVML.  g_lock serialises
 * them; queries read the atomics without taking it. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int g_refcount;
static atomic_int g_ndev;
static _Atomic unsigned long long g_fallback_total;

/* ---- Configuration ------------------------------------------------------------------ */


/* SIMCUDA_DEVICES: plain digits 0..8; anything else means the default, 1. */
static int config_devices(void)
{
    const char *s = getenv("SIMCUDA_DEVICES");
    uint64_t v;
    if (!s || s[strspn(s, "0123456789")] || !simcuda_parse_size(s, &v) || v > SIM_MAX_DEVICES)
        return 1;
    return (int)v;
}

/* SIMCUDA_MEMORY: used only when the driver cannot be asked (not loaded, or not yet
 * initialised); out-of-range values mean the default, as in the driver. */
static unsigned long long config_memory(void)
{
    const char *s = getenv("SIMCUDA_MEMORY");
    uint64_t v;
    if (!s || !simcuda_parse_size(s, &v) || v < 1 || v > SIM_MAX_MEMORY)
        return SIM_DEFAULT_MEMORY;
    return v;
}

/* ---- Helpers -------------------------------------------------------------------------- */

static int initialized(void) { return atomic_load(&g_refcount) > 0; }

/* A handle is valid if it is one of ours and names an enumerated device.  Compare
 * addresses as integers: the pointer may be garbage and must not be dereferenced. */
static struct nvmlDevice_st *device_of(nvmlDevice_t h)
{
    uintptr_t p = (uintptr_t)h, base = (uintptr_t)&g_devices[0];
    if (p < base || (p - base) % sizeof g_devices[0] != 0)
        return NULL;
    size_t i = (p - base) / sizeof g_devices[0];
    if (i >= (size_t)atomic_load(&g_ndev))
        return NULL;
    return &g_devices[i];
}

/* The usual prologue: NVML_ERROR_UNINITIALIZED first, then the handle. */
#define CHECK_DEVICE(handle, dev)                   \
    struct nvmlDevice_st *dev;                      \
    do {                                            \
        if (!initialized())                         \
            return NVML_ERROR_UNINITIALIZED;        \
        dev = device_of(handle);                    \
        if (!dev)                                   \
            return NVML_ERROR_INVALID_ARGUMENT;     \
    } while (0)

/* Copy a NUL-terminated string into a caller's buffer the NVML way: the whole string
 * or NVML_ERROR_INSUFFICIENT_SIZE, never a truncated one. */
static nvmlReturn_t copy_string(char *buf, unsigned int length, const char *s)
{
    if (!buf)
        return NVML_ERROR_INVALID_ARGUMENT;
    size_t n = strlen(s);
    if (length < n + 1)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, s, n + 1);
    return NVML_SUCCESS;
}

typedef int (*simcuda_memory_info_fn)(int, unsigned long long *, unsigned long long *);

/* Ask the driver for free/total memory at call time (it may be loaded after NVML).
 * libcudart dlopens libcuda.so.1 RTLD_LOCAL, so a global lookup usually misses it:
 * then look inside an already loaded libcuda.so.1 (RTLD_NOLOAD never loads it). */
static int driver_memory(int ordinal, unsigned long long *free_b, unsigned long long *total_b)
{
    simcuda_memory_info_fn fn;
    *(void **)&fn = dlsym(RTLD_DEFAULT, "simcuda_memory_info");
    if (fn)
        return fn(ordinal, free_b, total_b) == 0;
    void *lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!lib)
        return 0;
    int ok = 0;
    *(void **)&fn = dlsym(lib, "simcuda_memory_info");
    if (fn)
        ok = fn(ordinal, free_b, total_b) == 0;
    dlclose(lib);
    return ok;
}

static void device_memory(const struct nvmlDevice_st *dev, unsigned long long *free_b,
                          unsigned long long *total_b)
{
    if (driver_memory((int)dev->index, free_b, total_b) && *free_b <= *total_b)
        return;
    *total_b = atomic_load(&g_fallback_total);
    *free_b = *total_b;
}

static void fill_bus_id(const struct nvmlDevice_st *dev, char *out, size_t len,
                        const char *fmt)
{
    int i = (int)dev->index;
    snprintf(out, len, fmt, (unsigned)simcuda_pci_domain(i), (unsigned)simcuda_pci_bus(i),
             (unsigned)simcuda_pci_device(i));
}

static unsigned int pci_device_id(void)
{
    return (SIMCUDA_PCI_DEVICE << 16) | SIMCUDA_PCI_VENDOR;
}

/* ---- Initialisation, errors, system queries ----------------------------------------- */

NVML_API nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    /* NO_GPUS / NO_ATTACH change nothing here: there is no hardware to attach to, and
     * zero devices is already a successful initialisation. */
    (void)flags;
    pthread_mutex_lock(&g_lock);
    if (atomic_load(&g_refcount) == 0) {
        atomic_store(&g_ndev, config_devices());
        atomic_store(&g_fallback_total, config_memory());
    }
    atomic_fetch_add(&g_refcount, 1);
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

/* The legacy unversioned entry point; torch's Python calls it through ctypes. */
NVML_API nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

NVML_API nvmlReturn_t nvmlShutdown(void)
{
    nvmlReturn_t r = NVML_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (atomic_load(&g_refcount) == 0)
        r = NVML_ERROR_UNINITIALIZED;
    else if (atomic_fetch_sub(&g_refcount, 1) == 1)
        atomic_store(&g_ndev, 0);
    pthread_mutex_unlock(&g_lock);
    return r;
}

/* Callable at any time, before nvmlInit too; the texts are real NVML's. */
NVML_API const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt request issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED:
        return "The requested vgpu operation is not available on target device, "
               "because ECC is enabled";
    case NVML_ERROR_INSUFFICIENT_RESOURCES:
        return "Ran out of critical resources, other than memory";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "The requested frequency is not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
        return "The provided version is invalid/unsupported";
    case NVML_ERROR_DEPRECATED: return "The requested functionality has been deprecated";
    case NVML_ERROR_NOT_READY: return "The system is not ready for the request";
    case NVML_ERROR_GPU_NOT_FOUND: return "The GPU was not found";
    case NVML_ERROR_INVALID_STATE: return "The GPU is in an invalid state";
    case NVML_ERROR_RESET_TYPE_NOT_SUPPORTED: return "The reset type is not supported";
    default: return "Unknown Error";
    }
}

NVML_API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    return copy_string(version, length, SIM_DRIVER_VERSION_STRING);
}

NVML_API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    return copy_string(version, length, SIM_NVML_VERSION_STRING);
}

NVML_API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!cudaDriverVersion)
        return NVML_ERROR_INVALID_ARGUMENT;
    *cudaDriverVersion = SIM_CUDA_DRIVER_VERSION;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion_v2(cudaDriverVersion);
}

NVML_API nvmlReturn_t nvmlSystemGetConfComputeState(nvmlConfComputeSystemState_t *state)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!state)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(state, 0, sizeof *state);
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t
nvmlSystemGetConfComputeSettings(nvmlSystemConfComputeSettings_v1_t *settings)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!settings)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (settings->version != nvmlSystemConfComputeSettings_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned int version = settings->version;
    memset(settings, 0, sizeof *settings);
    settings->version = version;
    return NVML_SUCCESS;
}

/* ---- Enumeration and identity -------------------------------------------------------- */

NVML_API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!deviceCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = (unsigned int)atomic_load(&g_ndev);
    return NVML_SUCCESS;
}

/* v1 differs from v2 only in skipping devices the caller may not use; all are usable. */
NVML_API nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    return nvmlDeviceGetCount_v2(deviceCount);
}

NVML_API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= (unsigned int)atomic_load(&g_ndev))
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_devices[index];
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* One field of 1..8 hex digits; advances *p past it. */
static int hex_field(const char **p, unsigned *out)
{
    unsigned v = 0;
    int n = 0;
    while (hex_digit(**p) >= 0) {
        if (++n > 8)
            return 0;
        v = v * 16 + (unsigned)hex_digit(**p);
        (*p)++;
    }
    *out = v;
    return n > 0;
}

/* Parse "domain:bus:device.function" (domain of up to 8 hex digits, as NVML and CUDA
 * print it: "00000000:18:00.0", "0000:18:00.0") or "bus:device.function".  Hex digits
 * in either case: torch prints with %X, identity.h with %x.  Strict, since sscanf's %x
 * would also take signs, spaces and "0x". */
static int parse_bus_id(const char *s, unsigned *domain, unsigned *bus, unsigned *device,
                        unsigned *function)
{
    unsigned a, b, c = 0, f;
    int three;
    if (!hex_field(&s, &a) || *s++ != ':' || !hex_field(&s, &b))
        return 0;
    three = *s == ':';
    if (three) {
        s++;
        if (!hex_field(&s, &c))
            return 0;
    }
    if (*s++ != '.' || !hex_field(&s, &f) || *s != '\0')
        return 0;
    *domain = three ? a : 0;
    *bus = three ? b : a;
    *device = three ? c : b;
    *function = f;
    return *bus <= 0xff && *device <= 0x1f && *function <= 7;
}

NVML_API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId,
                                                       nvmlDevice_t *device)
{
    unsigned dom, bus, dev, fn;
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!pciBusId || !device || !parse_bus_id(pciBusId, &dom, &bus, &dev, &fn))
        return NVML_ERROR_INVALID_ARGUMENT;
    int n = atomic_load(&g_ndev);
    for (int i = 0; i < n; i++) {
        if (dom == (unsigned)simcuda_pci_domain(i) && bus == (unsigned)simcuda_pci_bus(i) &&
            dev == (unsigned)simcuda_pci_device(i) && fn == 0) {
            *device = &g_devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

NVML_API nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}

NVML_API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    int n = atomic_load(&g_ndev);
    for (int i = 0; i < n; i++) {
        char s[96];
        simcuda_uuid_string(i, s, sizeof s);
        if (strcasecmp(uuid, s) == 0) {
            *device = &g_devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

NVML_API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    CHECK_DEVICE(device, d);
    if (!index)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = d->index;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    CHECK_DEVICE(device, d);
    (void)d;
    return copy_string(name, length, SIMCUDA_DEVICE_NAME);
}

NVML_API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    char s[96];
    CHECK_DEVICE(device, d);
    simcuda_uuid_string((int)d->index, s, sizeof s);
    return copy_string(uuid, length, s);
}

/* _v2 and _v3 share nvmlPciInfo_t (v3 only fixed how the real driver fills busId). */
NVML_API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    CHECK_DEVICE(device, d);
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    int i = (int)d->index;
    memset(pci, 0, sizeof *pci);
    pci->domain = (unsigned)simcuda_pci_domain(i);
    pci->bus = (unsigned)simcuda_pci_bus(i);
    pci->device = (unsigned)simcuda_pci_device(i);
    pci->pciDeviceId = pci_device_id();
    pci->pciSubSystemId = SIM_PCI_SUBSYSTEM_ID;
    fill_bus_id(d, pci->busIdLegacy, sizeof pci->busIdLegacy,
                NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT);
    fill_bus_id(d, pci->busId, sizeof pci->busId, NVML_DEVICE_PCI_BUS_ID_FMT);
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

NVML_API nvmlReturn_t nvmlDeviceGetPciInfoExt(nvmlDevice_t device, nvmlPciInfoExt_v1_t *pci)
{
    CHECK_DEVICE(device, d);
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (pci->version != nvmlPciInfoExt_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    int i = (int)d->index;
    memset(pci, 0, sizeof *pci);
    pci->version = nvmlPciInfoExt_v1;
    pci->domain = (unsigned)simcuda_pci_domain(i);
    pci->bus = (unsigned)simcuda_pci_bus(i);
    pci->device = (unsigned)simcuda_pci_device(i);
    pci->pciDeviceId = pci_device_id();
    pci->pciSubSystemId = SIM_PCI_SUBSYSTEM_ID;
    pci->baseClass = SIM_PCI_BASE_CLASS;
    pci->subClass = SIM_PCI_SUB_CLASS;
    fill_bus_id(d, pci->busId, sizeof pci->busId, NVML_DEVICE_PCI_BUS_ID_FMT);
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major,
                                                         int *minor)
{
    CHECK_DEVICE(device, d);
    (void)d;
    if (!major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = SIMCUDA_CC_MAJOR;
    *minor = SIMCUDA_CC_MINOR;
    return NVML_SUCCESS;
}

/* ---- Memory, processes, utilisation -------------------------------------------------- */

NVML_API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    unsigned long long free_b, total_b;
    CHECK_DEVICE(device, d);
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    device_memory(d, &free_b, &total_b);
    memory->total = total_b;
    memory->free = free_b;
    memory->used = total_b - free_b;
    return NVML_SUCCESS;
}

/* The simulated device sets nothing aside for the driver, so reserved is 0 and used is
 * exactly what cuMemGetInfo counts as taken. */
NVML_API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    unsigned long long free_b, total_b;
    CHECK_DEVICE(device, d);
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    device_memory(d, &free_b, &total_b);
    memory->total = total_b;
    memory->reserved = 0;
    memory->free = free_b;
    memory->used = total_b - free_b;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t *bar1)
{
    CHECK_DEVICE(device, d);
    (void)d;
    if (!bar1)
        return NVML_ERROR_INVALID_ARGUMENT;
    bar1->bar1Total = SIM_BAR1_BYTES;
    bar1->bar1Free = SIM_BAR1_BYTES;
    bar1->bar1Used = 0;
    return NVML_SUCCESS;
}

/* No process is reported.  The NVML convention: *infoCount in = capacity, out = number
 * of processes; infos may be NULL when the capacity is 0 (the size query).  Since the
 * answer is always 0 entries, one body serves every struct version. */
static nvmlReturn_t running_processes(nvmlDevice_t device, unsigned int *infoCount,
                                      const void *infos)
{
    CHECK_DEVICE(device, d);
    (void)d;
    if (!infoCount || (*infoCount > 0 && !infos))
        return NVML_ERROR_INVALID_ARGUMENT;
    *infoCount = 0;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device,
                                                           unsigned int *infoCount,
                                                           nvmlProcessInfo_v1_t *infos)
{
    return running_processes(device, infoCount, infos);
}

NVML_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                              unsigned int *infoCount,
                                                              nvmlProcessInfo_v2_t *infos)
{
    return running_processes(device, infoCount, infos);
}

NVML_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                              unsigned int *infoCount,
                                                              nvmlProcessInfo_v2_t *infos)
{
    return running_processes(device, infoCount, infos);
}

NVML_API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device,
                                                    nvmlUtilization_t *utilization)
{
    CHECK_DEVICE(device, d);
    (void)d;
    if (!utilization)
        return NVML_ERROR_INVALID_ARGUMENT;
    utilization->gpu = 0;
    utilization->memory = 0;
    return NVML_SUCCESS;
}

/* ---- Sensors and clocks (pynvml users in torch.cuda) ---------------------------------- */

NVML_API nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device,
                                               nvmlTemperatureSensors_t sensorType,
                                               unsigned int *temp)
{
    CHECK_DEVICE(device, d);
    (void)d;
    if (!temp || sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    *temp = SIM_TEMPERATURE_C;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device,
                                                nvmlTemperature_v1_t *temperature)
{
    CHECK_DEVICE(device, d);
    (void)d;
    if (!temperature)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (temperature->version != nvmlTemperature_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (temperature->sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    temperature->temperature = (int)SIM_TEMPERATURE_C;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    CHECK_DEVICE(device, d);
    (void)d;
    if (!power)
        return NVML_ERROR_INVALID_ARGUMENT;
    *power = SIM_POWER_MW;
    return NVML_SUCCESS;
}

/* The simulated device always runs at its boost clocks, so current == max. */
static nvmlReturn_t clock_mhz(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock)
{
    static const unsigned int k_mhz[NVML_CLOCK_COUNT] = {
        SIM_CLOCK_GRAPHICS_MHZ, SIM_CLOCK_SM_MHZ, SIM_CLOCK_MEM_MHZ, SIM_CLOCK_VIDEO_MHZ,
    };
    CHECK_DEVICE(device, d);
    (void)d;
    if (!clock || (unsigned)type >= NVML_CLOCK_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    *clock = k_mhz[type];
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                             unsigned int *clock)
{
    return clock_mhz(device, type, clock);
}

NVML_API nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                                unsigned int *clock)
{
    return clock_mhz(device, type, clock);
}

/* ---- Virtualisation, MIG, NUMA (torch.cuda.green_contexts) ----------------------------- */

NVML_API nvmlReturn_t nvmlDeviceGetVirtualizationMode(nvmlDevice_t device,
                                                      nvmlGpuVirtualizationMode_t *mode)
{
    CHECK_DEVICE(device, d);
    (void)d;
    if (!mode)
        return NVML_ERROR_INVALID_ARGUMENT;
    *mode = NVML_GPU_VIRTUALIZATION_MODE_NONE;
    return NVML_SUCCESS;
}

/* H100 is MIG-capable; the simulated one runs with MIG disabled, now and after reset. */
NVML_API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                           unsigned int *pendingMode)
{
    CHECK_DEVICE(device, d);
    (void)d;
    if (!currentMode || !pendingMode)
        return NVML_ERROR_INVALID_ARGUMENT;
    *currentMode = NVML_DEVICE_MIG_DISABLE;
    *pendingMode = NVML_DEVICE_MIG_DISABLE;
    return NVML_SUCCESS;
}

/* A discrete PCIe/SXM H100 is not a NUMA node of its own (only coherent C2C parts such
 * as GH200 are); real NVML answers NOT_SUPPORTED, which torch expects. */
NVML_API nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node)
{
    CHECK_DEVICE(device, d);
    (void)d;
    if (!node)
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_ERROR_NOT_SUPPORTED;
}

/* ---- PCIe link (NCCL topology) -------------------------------------------------------- */

static nvmlReturn_t pcie_value(nvmlDevice_t device, unsigned int *out, unsigned int value)
{
    CHECK_DEVICE(device, d);
    (void)d;
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    *out = value;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device,
                                                          unsigned int *currLinkGen)
{
    return pcie_value(device, currLinkGen, SIM_PCIE_GEN);
}

NVML_API nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device,
                                                         unsigned int *maxLinkGen)
{
    return pcie_value(device, maxLinkGen, SIM_PCIE_GEN);
}

NVML_API nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device,
                                                     unsigned int *currLinkWidth)
{
    return pcie_value(device, currLinkWidth, SIM_PCIE_WIDTH);
}

NVML_API nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device,
                                                    unsigned int *maxLinkWidth)
{
    return pcie_value(device, maxLinkWidth, SIM_PCIE_WIDTH);
}

/* An NVML_PCIE_LINK_MAX_SPEED_* code, not a number of MB/s: Gen5, 32 GT/s. */
NVML_API nvmlReturn_t nvmlDeviceGetPcieLinkMaxSpeed(nvmlDevice_t device, unsigned int *maxSpeed)
{
    return pcie_value(device, maxSpeed, NVML_PCIE_LINK_MAX_SPEED_32000MBPS);
}

/* ---- Fabric, NVLink, P2P: what an H100 node without NVSwitch answers ------------------- */

/*
 * torch's get_fabric_access (libc10_cuda.so) fills state = NOT_SUPPORTED, version =
 * nvmlGpuFabricInfo_v2 and calls nvmlDeviceGetGpuFabricInfoV.  A failing return code makes
 * it warn ("nvmlDeviceGetGpuFabricInfoV failed. This function is only supported on sm90+")
 * and fall back; success with state NVML_GPU_FABRIC_STATE_NOT_SUPPORTED makes it fall
 * back to POSIX file-descriptor handles silently.  The latter is also what real NVML
 * says for a Hopper GPU that is not attached to an NVSwitch fabric, so answer that.
 */
NVML_API nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device,
                                                  nvmlGpuFabricInfoV_t *gpuFabricInfo)
{
    CHECK_DEVICE(device, d);
    (void)d;
    if (!gpuFabricInfo)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int version = gpuFabricInfo->version;
    size_t size;
    if (version == nvmlGpuFabricInfo_v2)
        size = sizeof(nvmlGpuFabricInfo_v2_t);
    else if (version == nvmlGpuFabricInfo_v3)
        size = sizeof(nvmlGpuFabricInfo_v3_t);
    else
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    /* Write no byte past the caller's version of the struct. */
    memset(gpuFabricInfo, 0, size);
    gpuFabricInfo->version = version;
    gpuFabricInfo->status = NVML_SUCCESS;
    gpuFabricInfo->state = NVML_GPU_FABRIC_STATE_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device,
                                                 nvmlGpuFabricInfo_t *gpuFabricInfo)
{
    CHECK_DEVICE(device, d);
    (void)d;
    if (!gpuFabricInfo)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(gpuFabricInfo, 0, sizeof *gpuFabricInfo);
    gpuFabricInfo->status = NVML_SUCCESS;
    gpuFabricInfo->state = NVML_GPU_FABRIC_STATE_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

/* Not part of a multi-node NVLink domain: no platform (rack/tray) information. */
NVML_API nvmlReturn_t nvmlDeviceGetPlatformInfo(nvmlDevice_t device,
                                                nvmlPlatformInfo_t *platformInfo)
{
    CHECK_DEVICE(device, d);
    (void)d;
    if (!platformInfo)
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_ERROR_NOT_SUPPORTED;
}

/* No NVLink: every per-link query is NOT_SUPPORTED once its arguments are valid.
 * Callers (NCCL, c10d's NVLink detector) probe links until the first failure. */
static nvmlReturn_t nvlink_query(nvmlDevice_t device, unsigned int link, const void *out)
{
    CHECK_DEVICE(device, d);
    (void)d;
    if (link >= NVML_NVLINK_MAX_LINKS || !out)
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_ERROR_NOT_SUPPORTED;
}

NVML_API nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                               nvmlEnableState_t *isActive)
{
    return nvlink_query(device, link, isActive);
}

NVML_API nvmlReturn_t nvmlDeviceGetNvLinkCapability(nvmlDevice_t device, unsigned int link,
                                                    nvmlNvLinkCapability_t capability,
                                                    unsigned int *capResult)
{
    if (initialized() && device_of(device) && (unsigned)capability >= NVML_NVLINK_CAP_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    return nvlink_query(device, link, capResult);
}

NVML_API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                          nvmlPciInfo_t *pci)
{
    return nvlink_query(device, link, pci);
}

NVML_API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t device, unsigned int link,
                                                       nvmlPciInfo_t *pci)
{
    return nvlink_query(device, link, pci);
}

NVML_API nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                          nvmlIntNvLinkDeviceType_t *type)
{
    return nvlink_query(device, link, type);
}

/*
 * P2P between two simulated devices: the call succeeds (tensorpipe throws if it fails,
 * NCCL aborts its NVML setup) and reports NVML_P2P_STATUS_NOT_SUPPORTED for every
 * capability, so no client tries peer mappings the simulation does not provide.
 */
NVML_API nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t device1, nvmlDevice_t device2,
                                             nvmlGpuP2PCapsIndex_t p2pIndex,
                                             nvmlGpuP2PStatus_t *p2pStatus)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!device_of(device1) || !device_of(device2) || !p2pStatus ||
        (unsigned)p2pIndex >= NVML_P2P_CAPS_INDEX_UNKNOWN)
        return NVML_ERROR_INVALID_ARGUMENT;
    *p2pStatus = NVML_P2P_STATUS_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

/* Field values (NCCL asks for NVLink and C2C fields): the call succeeds and each field
 * carries its own NVML_ERROR_NOT_SUPPORTED, as on a GPU without those links. */
NVML_API nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount,
                                               nvmlFieldValue_t *values)
{
    CHECK_DEVICE(device, d);
    (void)d;
    if (valuesCount < 0 || (valuesCount > 0 && !values))
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < valuesCount; i++) {
        values[i].timestamp = 0;
        values[i].latencyUsec = 0;
        values[i].valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
        values[i].nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        memset(&values[i].value, 0, sizeof values[i].value);
    }
    return NVML_SUCCESS;
}
