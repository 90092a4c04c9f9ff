/*
 * What a simulated device is: one place for the identity that the driver
 * (libcuda.so.1) and its NVML stand-in (libnvidia-ml.so.1) both report, so
 * that a client matching devices across the two (PyTorch does, by UUID and
 * PCI bus id) finds the same device in both.
 *
 * simcuda claims an H100 SXM part because the real PyTorch CUDA wheel
 * carries kernels for sm_90, and cuBLAS picks its code paths from the
 * compute capability.
 */
#ifndef SIMCUDA_IDENTITY_H
#define SIMCUDA_IDENTITY_H

#include <stdio.h>
#include <string.h>

#define SIMCUDA_DEVICE_NAME "NVIDIA H100 80GB HBM3 (simcuda)"
#define SIMCUDA_CC_MAJOR 9
#define SIMCUDA_CC_MINOR 0
#define SIMCUDA_SM_COUNT 132
/* NVIDIA's PCI vendor id and the H100 SXM5 device id, as NVML reports them
 * (pciDeviceId = device << 16 | vendor). */
#define SIMCUDA_PCI_VENDOR 0x10deu
#define SIMCUDA_PCI_DEVICE 0x2330u

/* 16 bytes, stable per ordinal, never all-zero: "simcuda" plus the ordinal. */
static inline void simcuda_device_uuid(int ordinal, unsigned char out[16])
{
    static const unsigned char base[16] = {0x5e, 0x1c, 0x0d, 0xa0, 's', 'i', 'm', 'c',
                                           'u',  'd',  'a',  0x00, 0x00, 0x00, 0x00, 0x00};
    memcpy(out, base, 16);
    out[15] = (unsigned char)ordinal;
}

/* PCI location: domain 0, bus 0x18 + ordinal, device 0, function 0. */
static inline int simcuda_pci_domain(int ordinal) { (void)ordinal; return 0; }
static inline int simcuda_pci_bus(int ordinal) { return 0x18 + ordinal; }
static inline int simcuda_pci_device(int ordinal) { (void)ordinal; return 0; }

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as NVML and nvidia-smi print it. */
static inline void simcuda_uuid_string(int ordinal, char *out, size_t len)
{
    unsigned char u[16];
    simcuda_device_uuid(ordinal, u);
    snprintf(out, len,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12],
             u[13], u[14], u[15]);
}

/* "00000000:18:00.0": NVML's busId form (8-digit domain). */
static inline void simcuda_bus_id(int ordinal, char *out, size_t len)
{
    snprintf(out, len, "%08x:%02x:%02x.0", (unsigned)simcuda_pci_domain(ordinal),
             (unsigned)simcuda_pci_bus(ordinal), (unsigned)simcuda_pci_device(ordinal));
}

#endif
